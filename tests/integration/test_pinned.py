"""Version pins (cairn.workflow(..., versions="pin")): a pinned run's resumes go to the
queue of the code version that started it, a worker of another version sends it there
untouched, and the fleet's versions are reported (live workers, pinned runs, orphans)."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import uuid
from typing import Any

import pytest
from kombu import Connection

from cairn.client.client import Client
from cairn.core.errors import Misrouted
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.steps.context import Context
from cairn.steps.registry import StepResult, workflow
from cairn.store.checkpoints import PgStore
from cairn.store.fleet import Fleet
from cairn.workers import broker, fleet, loop
from tests.helpers.services import ROOT

pinned = workflow("pinned_demo", versions="pin")
upgraded = workflow("upgraded_demo")


@pinned.step()
@upgraded.step()
def ask(ctx: Context) -> StepResult:
    return StepResult.wait("go", cursor="finish")


@pinned.step()
@upgraded.step()
def finish(ctx: Context) -> StepResult:
    return StepResult(cursor="done", state={"signal": ctx.signal})


def _at(deps: loop.Deps, version: str) -> loop.Deps:
    return dataclasses.replace(deps, settings=deps.settings.with_options(code_version=version))


def _ready(settings: Settings, queue: str) -> int:
    with Connection(settings.broker) as conn, conn.channel() as channel:
        try:
            return int(channel.queue_declare(queue, passive=True).message_count)
        except conn.channel_errors:
            return 0


def _row(sql: Any, run_id: str) -> list[tuple[Any, ...]]:
    return sql(
        "SELECT epoch, deliveries, updated_at, status, pinned FROM checkpoints WHERE run_id = %s",
        run_id,
    )


def test_the_policy_is_checked() -> None:
    with pytest.raises(ValueError, match="versions='pinned'"):
        workflow(f"bad_{uuid.uuid4().hex[:6]}", versions="pinned")


@pytest.mark.parametrize("broker_url", [None, "amqp"], indirect=True)
def test_a_pinned_runs_resume_goes_to_its_versions_queue_and_another_version_reroutes_it(
    deps: loop.Deps, client: Client, sql: Any
) -> None:
    from cairn.workers.app import create_app

    v1, v2 = _at(deps, "v1"), _at(deps, "v2")
    kept, moved = f"pin-{uuid.uuid4().hex[:8]}", f"up-{uuid.uuid4().hex[:8]}"
    client.store.create_run(kept, "pinned_demo", {})
    client.store.create_run(moved, "upgraded_demo", {})
    # v1 starts both: the pinned one is pinned to it, the other to no version.
    assert loop.run(kept, v1) == loop.run(moved, v1) == RunStatus.WAITING
    assert client.store.routes([kept, moved, "no-such-run"]) == {kept: "v1"}
    client.signal(kept, "go", 1)
    client.signal(moved, "go", 2)

    # A v2 worker's one send path: the upgraded run's resume to the shared queue, the
    # pinned run's to v1's, declared as v1's workers declare it (none has started yet).
    app = create_app(v2.settings)
    runtime = app.cairn
    assert runtime.queue(moved, True) == broker.RESUME
    to = runtime.queue(kept, True)  # a kombu Queue, declared on the way
    assert getattr(to, "name", to) == broker.pinned_queue("v1") == "cairn.resume.v.v1"
    assert runtime.queue(kept, False, 5) == broker.HIGH  # a first delivery: any version
    queued = _ready(v2.settings, broker.pinned_queue("v1"))  # what earlier tests left
    runtime.send(kept)
    assert _ready(v2.settings, broker.pinned_queue("v1")) == queued + 1

    # The signal's message came to a v2 worker through the shared queue: it does not
    # claim the run, nor change anything of it, and sends it to v1's queue.
    before = _row(sql, kept)
    with pytest.raises(Misrouted) as misrouted:
        loop.run(kept, v2)
    assert misrouted.value.version == "v1"
    assert app.tasks[broker.RUN_TASK](kept) == "misrouted"
    assert _row(sql, kept) == before and before[0][-2:] == ("waiting", True)
    assert _ready(v2.settings, broker.pinned_queue("v1")) == queued + 2

    # The upgraded run goes on on v2; the pinned one on v1 alone.
    assert loop.run(moved, v2) == RunStatus.DONE
    assert loop.run(kept, v1) == RunStatus.DONE
    assert [s.code_version for s in client.history(kept)] == ["v1", "v1"]
    assert [s.code_version for s in client.history(moved)] == ["v1", "v2"]
    assert client.store.routes([kept]) == {kept: "v1"}  # the pin stays on the record
    runtime.close()


def test_a_version_with_pinned_runs_and_no_live_worker_is_reported_orphaned(
    deps: loop.Deps, client: Client, store: PgStore, caplog: pytest.LogCaptureFixture
) -> None:
    v1 = _at(deps, "v1")
    runs = [f"orph-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    for run_id in runs:
        client.store.create_run(run_id, "pinned_demo", {})
        assert loop.run(run_id, v1) == RunStatus.WAITING
    assert store.pinned_runs() == {"v1": (2, 2)}
    beats = Fleet.from_url(deps.settings.redis_url)
    try:
        beats.beat("v1", "w1@host")
        beats.beat("v2", "w2@host")
        # Live: nothing orphaned, and nothing told.
        (one, two) = beats.versions(store.pinned_runs(), orphan_after=60)
        assert (one.version, one.workers, one.pinned, one.waiting, one.orphaned) == (
            "v1", ("w1@host",), 2, 2, False,
        )  # fmt: skip
        assert (two.version, two.workers, two.pinned, two.orphaned) == (
            "v2",
            ("w2@host",),
            0,
            False,
        )
        assert fleet.report_orphans(store, beats, orphan_after=60) == []
        # v1's worker stops: its runs wait on, and once past orphan_after they are told,
        # once, not at every reaper pass.
        beats.gone("v1", "w1@host")
        beats.client.delete("cairn:orphaned:v1")  # told by an earlier test on this Redis
        with caplog.at_level(logging.ERROR, logger="cairn.workers.fleet"):
            assert fleet.report_orphans(store, beats, orphan_after=0) == ["v1"]
            assert fleet.report_orphans(store, beats, orphan_after=0) == ["v1"]
        told = [r.getMessage() for r in caplog.records if "orphaned" in r.getMessage()]
        assert told == [
            (
                "pinned runs orphaned: 2 run(s) pinned to code version v1 and no live worker of "
                "it for over 0s; start a worker with CAIRN_CODE_VERSION=v1, or cancel them"
            )
        ]
        assert [r.status for r in map(client.get, runs) if r] == [RunStatus.WAITING] * 2
        # The server's gauges say as much (its settings' CAIRN_PIN_ORPHAN_AFTER: 0).
        from fastapi.testclient import TestClient

        from cairn.web.api import create_app

        served = deps.settings.with_options(pin_orphan_after=0.0)
        with TestClient(create_app(served, insecure_no_auth=True)) as http:
            metrics = http.get("/metrics").text
        assert 'cairn_runs_pinned{version="v1"} 2.0' in metrics
        assert 'cairn_runs_orphaned_versions{version="v1"} 2.0' in metrics
    finally:
        beats.close()


def test_deploy_status_says_which_version_is_orphaned_and_drain_which_has_no_worker(
    deps: loop.Deps, client: Client
) -> None:
    run_id = f"cli-{uuid.uuid4().hex[:8]}"
    client.store.create_run(run_id, "pinned_demo", {})
    assert loop.run(run_id, _at(deps, "v9")) == RunStatus.WAITING
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "COLUMNS": "200",
        "CAIRN_DATABASE_URL": deps.settings.database_url,
        "CAIRN_REDIS_URL": deps.settings.redis_url,
        "CAIRN_PIN_ORPHAN_AFTER": "0",
    }

    def cairn(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cairn.cli", "deploy", *args],
            capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=False,
        )  # fmt: skip

    status = cairn("status")
    assert status.returncode == 1, status.stderr
    [row] = [line.split() for line in status.stdout.splitlines() if " v9 " in line]
    assert [cell for cell in row if cell not in "│┃|"] == ["v9", "0", "1", "1", "orphaned"]
    drain = cairn("drain", "v9")
    assert drain.returncode == 1 and drain.stdout == ""
    assert drain.stderr.strip() == (
        "error: no live worker of version 'v9' answered; `cairn deploy status` lists them"
    )
