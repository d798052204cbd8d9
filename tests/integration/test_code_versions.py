"""Code versions: a worker states its code's (CAIRN_CODE_VERSION, or a hash of its
workflows), a run keeps the version that started it, and each step row the version that
wrote it, through a deploy that changes the version mid-run."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import uuid

import pytest
from prometheus_client import REGISTRY

from cairn.client.client import Client
from cairn.core.errors import RetryLater
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.steps import registry
from cairn.steps.context import Context
from cairn.steps.registry import Retry, StepResult, workflow
from cairn.testing import LocalWorker
from cairn.workers import loop
from cairn.workers.metrics import Metrics
from cairn.workers.middleware import Chain
from tests.helpers.services import ROOT
from tests.helpers.web import login

versioned = workflow("code_versions_demo")


@versioned.step()
def first(ctx: Context) -> StepResult:
    return StepResult(cursor="second", state={"first": True})


_failed: set[str] = set()  # runs whose second step has failed once


@versioned.step(retry=Retry(attempts=3, on=(ValueError,)))
def second(ctx: Context) -> StepResult:
    if ctx.input.get("fail_once") and ctx.run_id not in _failed:
        _failed.add(ctx.run_id)
        raise ValueError("not yet")
    return StepResult(cursor="done", state={**ctx.state, "second": True})


def _deployed_mid_run(deps: loop.Deps, client: Client) -> str:
    """A run 1.4.0 started (its second step retried once) and 1.5.0 ended."""
    run_id = f"cv-{uuid.uuid4().hex[:8]}"
    client.store.create_run(run_id, "code_versions_demo", {"fail_once": True})
    old = dataclasses.replace(deps, settings=deps.settings.with_options(code_version="1.4.0"))
    new = dataclasses.replace(deps, settings=deps.settings.with_options(code_version="1.5.0"))
    # 1.4.0 saves the first step, and the second fails once: its retry is 1.4.0's too.
    with pytest.raises(RetryLater):
        loop.run(run_id, old)
    # The deploy: 1.5.0 takes the run over and ends it.
    assert loop.run(run_id, new) == RunStatus.DONE
    return run_id


def test_a_run_records_the_version_it_started_on_and_each_step_the_one_that_saved_it(
    deps: loop.Deps, client: Client
) -> None:
    run_id = _deployed_mid_run(deps, client)
    run = client.get(run_id)
    assert run is not None and run.started_version == "1.4.0"
    steps = [(s.cursor, s.outcome, s.code_version) for s in client.history(run_id)]
    assert steps == [
        ("first", "saved", "1.4.0"),
        ("second", "retry", "1.4.0"),
        ("second", "saved", "1.5.0"),
    ]


def test_the_default_version_is_a_hash_of_the_workflows_and_their_steps() -> None:
    assert registry.code_version("2026.12.05-abc") == "2026.12.05-abc"
    before = registry.code_version()
    assert len(before) == 12 and before == registry.code_version(None) == registry.code_version("")
    name = f"code_versions_{uuid.uuid4().hex[:8]}"
    added = workflow(name)
    try:
        added.step()(first)
        with_one = registry.code_version()
        assert with_one != before  # a workflow added
        added.step()(second)
        assert registry.code_version() not in (before, with_one)  # a step added
    finally:
        registry._REGISTRY.pop(name)
    assert registry.code_version() == before


def test_a_local_worker_states_the_default_version() -> None:
    worker = LocalWorker()
    client = Client(store=worker.store, send=worker.send)
    run_id = client.enqueue("code_versions_demo", {})
    worker.run_until_idle()
    run = client.get(run_id)
    assert run is not None and run.started_version == registry.code_version()
    assert {s.code_version for s in client.history(run_id)} == {registry.code_version()}


def test_show_the_page_and_the_api_show_the_versions(deps: loop.Deps, client: Client) -> None:
    from fastapi.testclient import TestClient

    from cairn.web.api import create_app

    run_id = _deployed_mid_run(deps, client)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "COLUMNS": "200",
        "CAIRN_DATABASE_URL": deps.settings.database_url,
    }

    def cairn(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "cairn.cli", "runs", "show", run_id, *args],
            capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=True,
        )  # fmt: skip
        return done.stdout

    shown = json.loads(cairn("--json"))
    assert shown["run"]["started_version"] == "1.4.0"
    assert [s["code_version"] for s in shown["steps"]] == ["1.4.0", "1.4.0", "1.5.0"]
    text = cairn()
    assert "started on code version 1.4.0" in " ".join(text.split())
    rows = [line.split() for line in text.splitlines() if "saved" in line or "retry" in line]
    assert ["1.4.0" in " ".join(r) for r in rows] == [True, True, False]
    assert ["1.5.0" in " ".join(r) for r in rows] == [False, False, True]

    token = uuid.uuid4().hex
    app = create_app(dataclasses.replace(deps.settings, api_token=token))
    with TestClient(app, follow_redirects=True) as http:
        bearer = {"Authorization": f"Bearer {token}"}
        assert http.get(f"/runs/{run_id}", headers=bearer).json()["started_version"] == "1.4.0"
        steps = http.get(f"/runs/{run_id}/steps", headers=bearer).json()["steps"]
        assert [s["code_version"] for s in steps] == ["1.4.0", "1.4.0", "1.5.0"]
        listed = http.get("/runs", headers=bearer, params={"limit": 1}).json()["runs"]
        assert listed[0]["started_version"] == "1.4.0"
        login(http, token)
        page = http.get(f"/ui/runs/{run_id}").text
    started = page.split('id="started-version"', 1)[1].split("</div>", 1)[0]
    assert "1.4.0" in started
    assert page.count(">1.4.0</td>") == 2 and page.count(">1.5.0</td>") == 1


def test_the_workers_metrics_count_the_runs_each_version_started() -> None:
    def started(version: str) -> float:
        labels = {"workflow": "code_versions_demo", "code_version": version}
        return REGISTRY.get_sample_value("cairn_runs_started_total", labels) or 0.0

    version = f"m-{uuid.uuid4().hex[:6]}"
    worker = LocalWorker(
        settings=Settings(code_version=version), middleware=Chain([Metrics(version)])
    )
    client = Client(store=worker.store, send=worker.send)
    for _ in range(3):
        client.enqueue("code_versions_demo", {})
    worker.run_until_idle()
    # Three runs started, each counted once though each saved two steps.
    assert started(version) == 3.0
