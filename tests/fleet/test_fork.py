"""Forks, rewinds and replays over HTTP from a real `cairn serve`, and from the CLI."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import tests.helpers.flows  # noqa: F401 (loop: one keyed email a visit)
from cairn.client.client import Client
from cairn.core.status import RunStatus
from cairn.workers import loop


def test_replay_over_http_and_from_the_cli_with_a_dry_run(
    client: Client, deps: loop.Deps, serve: Any, worker_env: dict[str, str], tmp_path: Path
) -> None:
    fixed = tmp_path / "fixed"
    runs = [client.enqueue("mend", {"fixed": str(fixed)}) for _ in range(3)]
    for r in runs:
        assert loop.run(r, deps) == RunStatus.FAILED
    since = "2000-01-01T00:00:00Z"
    cli = [".venv/bin/cairn", "runs", "replay", "mend", "--since", since]
    out = subprocess.run(
        [*cli, "--dry-run", "--json"], env=worker_env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert [r["run_id"] for r in json.loads(out.stdout)["runs"]] == runs
    with serve().http() as api:
        dry = api.post("/runs/replay", json={"workflow": "mend", "since": since, "dry_run": True})
        assert dry.status_code == 202 and dry.json()["replayed"] == 0
        assert [r["run_id"] for r in dry.json()["runs"]] == runs
        bad = api.post(
            "/runs/replay", json={"workflow": "mend", "since": since, "status": ["done"]}
        )
        assert bad.status_code == 422
        one = api.post("/runs/replay", json={"workflow": "mend", "since": since, "limit": 1})
        assert one.json()["replayed"] == 1 and one.json()["runs"][0]["run_id"] == runs[0]
    assert {client.get(r).status for r in runs} == {"pending", "failed"}  # type: ignore[union-attr]
    out = subprocess.run(
        cli, env=worker_env, capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0 and "replayed 2 mend run(s)" in out.stdout, out.stderr
    assert {client.get(r).status for r in runs} == {"pending"}  # type: ignore[union-attr]


def test_fork_and_rewind_over_http_and_from_the_cli(
    client: Client, deps: loop.Deps, serve: Any, worker_env: dict[str, str]
) -> None:
    run_id = client.enqueue("loop", {"visits": 3})
    assert loop.run(run_id, deps) == RunStatus.DONE
    with serve().http() as api:
        forked = api.post(f"/runs/{run_id}/fork", json={"at_seq": 2, "new_run_id": "web-fork"})
        assert forked.status_code == 202 and forked.json()["forked_from"] == run_id
        assert api.get(f"/runs/{run_id}/forks").json()["forks"][0]["run_id"] == "web-fork"
        assert api.post(f"/runs/{run_id}/fork", json={"at_seq": 9}).status_code == 422
        busy = api.post("/runs/web-fork/rewind", json={"to_seq": 1})
        assert busy.status_code == 409 and "rewind moves a stopped run" in busy.text
        back = api.post(f"/runs/{run_id}/rewind", json={"to_seq": 1}).json()
        assert back["status"] == "pending" and back["cursor"] == "think"
    cli = [".venv/bin/cairn", "runs"]
    out = subprocess.run(
        [*cli, "fork", run_id, "--at", "1", "--run-id", "cli-fork", "--json"],
        env=worker_env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"run_id": "cli-fork", "forked_from": run_id, "forked_at": 1}
    out = subprocess.run(
        [*cli, "rewind", "cli-fork", "--to", "1"], env=worker_env, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and "is pending" in out.stderr


def test_the_run_page_offers_fork_from_here_and_shows_origin_and_forks(
    client: Client, deps: loop.Deps, serve: Any
) -> None:
    run_id = client.enqueue("loop", {"visits": 2})
    assert loop.run(run_id, deps) == RunStatus.DONE
    fork = client.fork(run_id, at_seq=1, new_run_id="page-fork")
    with serve().http() as api:
        page = api.get(f"/ui/runs/{run_id}").text
        # One button a saved step, each naming the checkpoint that step saved.
        assert page.count('class="fork-here') == 2
        assert 'data-seq="1"' in page and 'data-seq="2"' in page
        assert 'id="forks"' in page and 'href="/ui/runs/page-fork"' in page
        forked = api.get(f"/ui/runs/{fork}").text
        assert 'id="origin"' in forked and f'href="/ui/runs/{run_id}"' in forked
        assert "at seq 1" in forked
        assert 'class="fork-here' in forked  # its forked row can be forked again
