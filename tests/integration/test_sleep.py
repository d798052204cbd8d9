"""Durable sleep on Postgres and Redis, the loop in process: a run sleeps holding nothing,
is not woken before its time, is woken once, and goes on at the step after its sleep; a
signal does not end a sleep, a cancel does; `cairn runs show` says when it wakes. Two
beats and killed wakers: tests/fleet/test_sleep.py."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from cairn.client.client import Client
from cairn.core.records import Run
from cairn.core.status import RunStatus
from cairn.steps.registry import StepResult
from cairn.store import PgStore
from cairn.workers import loop
from cairn.workers.wake import Waker
from tests.helpers.services import ROOT
from tests.helpers.web import login


def _sleeping(create: Callable[..., str], deps: loop.Deps, seconds: float) -> str:
    run_id = create("sleeper", {"seconds": seconds}, queue=False)
    assert loop.run(run_id, deps) == RunStatus.WAITING
    return run_id


def _get(client: Client, run_id: str) -> Run:
    run = client.get(run_id)
    assert run is not None
    return run


def test_a_sleeping_run_is_woken_once_at_its_time_and_goes_on_after_its_sleep(
    create, deps: loop.Deps, client: Client, store: PgStore, sql
) -> None:
    run_id = _sleeping(create, deps, 1.5)
    run = _get(client, run_id)
    assert (run.status, run.cursor) == (RunStatus.WAITING, "after")
    assert run.wakes_at is not None
    assert dt.timedelta(seconds=1.3) < run.wakes_at - run.updated_at < dt.timedelta(seconds=1.7)
    # Nothing holds it: no lease, and a delivery before its time changes nothing.
    assert deps.leases.holder(run_id) is None
    assert loop.run(run_id, deps) == RunStatus.WAITING
    assert _get(client, run_id).cursor == "after"
    sent: list[str] = []
    waker = Waker(store=store, send=sent.append)
    woken: list[str] = []
    while dt.datetime.now(dt.UTC) < run.wakes_at - dt.timedelta(seconds=0.1):
        woken += waker.wake()  # never before its time
        assert woken == []
        time.sleep(0.05)
    time.sleep(0.2)
    assert woken + waker.wake() == [run_id]
    assert waker.wake() == [] and Waker(store=store, send=sent.append).wake() == []
    assert sent == [run_id]
    assert _get(client, run_id).status == RunStatus.PENDING  # out of waiting, then sent
    assert loop.run(run_id, deps) == RunStatus.DONE
    done = _get(client, run_id)
    assert done.state is not None and done.state["signal"] is None
    assert done.state["woke_at"] - done.state["slept_at"] >= 1.5
    assert [(h.cursor, h.outcome) for h in client.history(run_id)] == [
        ("nap", "saved"),
        ("after", "saved"),
    ]
    (deliveries,) = sql("SELECT deliveries FROM checkpoints WHERE run_id = %s", run_id)[0]
    assert deliveries == 0  # saved since: the woken delivery was its one


def test_a_signal_does_not_end_a_sleep_and_a_cancel_does(
    create, deps: loop.Deps, client: Client, store: PgStore
) -> None:
    signalled = _sleeping(create, deps, 60)
    assert client.signal(signalled, "ping", {"n": 1}) is True
    assert loop.run(signalled, deps) == RunStatus.WAITING  # the signal's delivery: idle
    assert _get(client, signalled).cursor == "after"
    cancelled = _sleeping(create, deps, 60)
    run = client.cancel(cancelled, "not needed")
    assert run is not None and run.status == RunStatus.CANCELLED
    assert _get(client, cancelled).wakes_at is None
    assert loop.run(cancelled, deps) == RunStatus.CANCELLED


def test_a_wait_timeout_is_woken_by_the_same_pass_and_a_signal_ends_it_early(
    create, deps: loop.Deps, client: Client, store: PgStore, sql
) -> None:
    timed_out = create("sleeper", {"seconds": 60, "wait": True}, queue=False)
    early = create("sleeper", {"seconds": 60, "wait": True}, queue=False)
    for run_id in (timed_out, early):
        assert loop.run(run_id, deps) == RunStatus.WAITING
    assert client.signal(early, "wake", {"n": 1}) is True
    sql("UPDATE checkpoints SET wait_until = now() - interval '1 second'")
    # Both are due; the signalled one still wakes once, and goes on with its signal.
    assert sorted(Waker(store=store, send=lambda _: None).wake()) == sorted([timed_out, early])
    for run_id in (timed_out, early):
        assert loop.run(run_id, deps) == RunStatus.DONE
    assert _get(client, timed_out).state["signal"] is None  # type: ignore[index]
    assert _get(client, early).state["signal"] == {"n": 1}  # type: ignore[index]


def test_sleep_wants_seconds_or_a_timedelta_and_no_wait_beside_it() -> None:
    assert StepResult(cursor="x", sleep=dt.timedelta(days=3)).waits_for is not None
    for bad in (-1, "3d", True):
        with pytest.raises(ValueError, match="sleep="):
            StepResult(cursor="x", sleep=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sleeps or waits"):
        StepResult(cursor="x", sleep=1, waits_for=StepResult.wait("e", cursor="x").waits_for)


def test_runs_show_says_when_a_sleeping_run_wakes(create, deps: loop.Deps, settings) -> None:
    run_id = _sleeping(create, deps, 3600)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "COLUMNS": "200",
        "CAIRN_DATABASE_URL": settings.database_url,
        "CAIRN_REDIS_URL": settings.redis_url,
    }
    shown = subprocess.run(
        [sys.executable, "-m", "cairn.cli", "runs", "show", run_id],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    (line,) = [ln for ln in shown.stdout.splitlines() if ln.strip().startswith("wakes")]
    wakes = dt.datetime.fromisoformat(line.split()[1])
    assert dt.timedelta(minutes=59) < wakes - dt.datetime.now(dt.UTC) <= dt.timedelta(hours=1)


def test_the_run_page_and_the_http_api_say_when_it_wakes(
    create, deps: loop.Deps, client: Client, settings
) -> None:
    import dataclasses
    import uuid

    from fastapi.testclient import TestClient

    from cairn.web.api import create_app

    run_id = _sleeping(create, deps, 3600)
    wakes = _get(client, run_id).wakes_at
    assert wakes is not None
    token = uuid.uuid4().hex
    app = create_app(dataclasses.replace(settings, api_token=token))
    with TestClient(app, follow_redirects=True) as http:
        bearer = {"Authorization": f"Bearer {token}"}
        got = http.get(f"/runs/{run_id}", headers=bearer).json()
        assert dt.datetime.fromisoformat(got["wakes_at"]) == wakes
        login(http, token)
        page = http.get(f"/ui/runs/{run_id}").text
    assert 'id="wakes"' in page and "wakes at" in page
