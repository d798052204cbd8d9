"""Concurrency keys and priorities on real workers on both brokers, and through the HTTP
API and the CLI.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import tests.helpers.flows  # noqa: F401 (square)
from cairn.client.client import Client
from cairn.core.status import RunStatus
from cairn.testing.chaos.keys import most_at_once
from tests.helpers.runs import wait_for
from tests.helpers.services import both_brokers


# -- real workers ------------------------------------------------------------------------
def _spans(sql: Any, run_ids: list[str]) -> dict[str, tuple[Any, Any]]:
    """Each run's first step start and last step end, from its step history."""
    rows = sql(
        "SELECT run_id, min(started_at), max(ended_at) FROM step_history"
        " WHERE run_id = ANY(%s) GROUP BY run_id",
        run_ids,
    )
    return {r: (start, end) for r, start, end in rows}


@both_brokers
def test_keys_hold_their_limits_on_a_real_fleet_and_a_small_key_is_not_starved(
    client: Client, start_worker: Any, sql: Any
) -> None:
    """Three worker processes: key A's 8 runs at limit 1, key C's 6 at limit 2, and key
    B's one run enqueued after both backlogs. Step history shows A never ran two at once,
    C ran two at once but never three, and B's run did not wait behind A's backlog."""
    start_worker(concurrency=3)
    slow = {"n": 3, "sleep": 0.3}
    a = [client.enqueue("square", slow, concurrency_key="A") for _ in range(8)]
    c = [client.enqueue("square", slow, concurrency_key="C", concurrency_limit=2) for _ in range(6)]
    assert [client.get(r).status for r in a[:2]] == ["pending", "queued"]  # type: ignore[union-attr]
    b = client.enqueue("square", slow, concurrency_key="B")
    for run_id in [*a, *c, b]:
        assert client.wait(run_id, timeout=60).status == RunStatus.DONE
    spans = _spans(sql, [*a, *c, b])
    assert most_at_once([spans[r] for r in a]) == 1
    assert most_at_once([spans[r] for r in c]) == 2
    assert spans[b][0] < spans[a[3]][0]  # B started before most of A's backlog
    # Every slot was given back and every key forgotten once idle: nothing leaked.
    assert sql("SELECT count(*) FROM slots") == [(0,)]
    assert sql("SELECT count(*) FROM queued") == [(0,)]
    assert sql("SELECT count(*) FROM concurrency_keys") == [(0,)]


@both_brokers
def test_a_high_priority_run_goes_before_the_backlog(
    client: Client, start_worker: Any, sql: Any
) -> None:
    """One worker process busy with a slow run, 10 runs queued behind it, then one run of
    priority 5: it runs next."""
    start_worker(concurrency=1)
    first = client.enqueue("square", {"n": 1, "sleep": 1.5})
    claimed = "SELECT epoch > 0 FROM checkpoints WHERE run_id = %s"
    wait_for(lambda: sql(claimed, first) == [(True,)], 30, "the slow run to start")
    backlog = [client.enqueue("square", {"n": 2, "sleep": 0.05}) for _ in range(10)]
    high = client.enqueue("square", {"n": 4}, priority=5)
    for run_id in [first, *backlog, high]:
        assert client.wait(run_id, timeout=60).status == RunStatus.DONE
    spans = _spans(sql, [*backlog, high])
    starts = sorted(spans, key=lambda r: spans[r][0])
    assert starts.index(high) == 0, starts
    assert client.get(high).priority == 5  # type: ignore[union-attr]


def test_the_api_and_the_cli_take_keys_and_priorities_and_refuse_bad_ones(
    client: Client, serve: Any, worker_env: dict[str, str]
) -> None:
    """No worker: the first run of a key is pending, the second queued (and cancellable
    at once); bad options are 422s and exit 2, with nothing written."""
    with serve().http() as api:
        body = {"workflow": "square", "input": {"n": 2}, "concurrency_key": "user:7"}
        first = api.post("/runs", json=body).json()
        second = api.post("/runs", json={**body, "priority": 9}).json()
        assert (first["status"], second["status"]) == ("pending", "queued")
        assert (second["concurrency_key"], second["priority"]) == ("user:7", 9)
        assert api.post(f"/runs/{second['run_id']}/cancel", json={}).json()["status"] == "cancelled"
        bad = api.post("/runs", json={**body, "concurrency_limit": 0, "run_id": "never"})
        assert bad.status_code == 422 and "concurrency_limit" in bad.text  # the field named
        assert api.get("/runs/never").status_code == 404
        assert api.get("/runs", params={"status": "queued"}).json()["runs"] == []
    cli = [".venv/bin/cairn", "enqueue", "square", '{"n": 1}', "--workflows", "tests.helpers.flows"]
    out = subprocess.run(
        [*cli, "--concurrency-key", "user:7", "--priority", "2", "--json"],
        env=worker_env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    queued = client.get(json.loads(out.stdout)["run_id"])
    assert queued is not None and queued.status == "queued" and queued.priority == 2
    bad = subprocess.run(
        [*cli, "--concurrency-key", "user 7"], env=worker_env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "concurrency key 'user 7' is not valid" in bad.stderr
