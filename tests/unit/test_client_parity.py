"""One implementation per operation: AsyncClient is Client's face for asyncio, each method
Client's own run in a worker thread, wait and events asyncio's own. Every public method
of Client is on AsyncClient with the same parameters (names, kinds, defaults), a
coroutine function there (events an async generator). And the Client runs on any store of
the contract: on the in-memory one, with cairn.testing.LocalWorker as its fleet, every
operation works with no service at all."""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.client import AsyncClient, Client
from cairn.core.errors import CairnError, RunNotStopped, UnknownRun, WaitTimedOut
from cairn.core.status import RunStatus
from cairn.testing import LocalWorker, ManualClock, MemoryStore
from tests.helpers import pages

greet = cairn.workflow("parity-greet")


@greet.step()
def ask(ctx: cairn.Context) -> cairn.StepResult:
    return cairn.StepResult.wait("approved", cursor="hello", timeout=3600, on_timeout="give_up")


@greet.step()
def hello(ctx: cairn.Context) -> cairn.StepResult:
    ctx.emit("greeting", {"to": ctx.input["name"]})
    return cairn.StepResult(cursor=cairn.DONE, state={"greeted": ctx.input["name"]})


@greet.step()
def give_up(ctx: cairn.Context) -> cairn.StepResult:
    return cairn.StepResult(cursor=cairn.DONE, state={"gave_up": True})


flaky = cairn.workflow("parity-flaky")
broken: set[str] = set()  # run ids whose step fails for good until taken out
busy: dict[str, int] = {}  # run id: how many more times its step is "not now"


@flaky.step()
def once(ctx: cairn.Context) -> cairn.StepResult:
    if ctx.run_id in broken:
        raise ValueError("broken until fixed")
    if busy.get(ctx.run_id, 0) > 0:
        busy[ctx.run_id] -= 1
        raise cairn.Transient("not now")
    return cairn.StepResult(cursor=cairn.DONE, state={"ok": True})


def _public(cls: type) -> dict[str, Any]:
    return {n: v for n, v in inspect.getmembers(cls) if not n.startswith("_") and callable(v)}


def _params(fn: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_async_client_has_every_method_of_client_with_the_same_parameters() -> None:
    sync, aio = _public(Client), _public(AsyncClient)
    assert sorted(sync) == sorted(aio)
    for name, fn in sync.items():
        assert _params(aio[name]) == _params(fn), name
        if name == "events":
            assert inspect.isgeneratorfunction(fn) is False  # returns follow()'s iterator
            assert inspect.isasyncgenfunction(aio[name]), name
        elif name == "for_tenant":  # a view on the same pools: nothing to await
            assert not inspect.iscoroutinefunction(aio[name])
        else:
            assert inspect.iscoroutinefunction(aio[name]), name
            assert not inspect.iscoroutinefunction(fn), name
    assert "timeout" in inspect.signature(AsyncClient.events).parameters
    assert AsyncClient.get.__doc__ == Client.get.__doc__  # one docstring, Client's
    assert not hasattr(Client, "producer") and not hasattr(AsyncClient, "producer")


def test_the_client_does_everything_on_the_in_memory_store_with_a_local_worker() -> None:
    clock = ManualClock()
    worker = LocalWorker(clock=clock, events=True)
    with Client(store=worker.store, send=worker.send, events=worker.events) as client:
        assert client.problems() == []
        run_id = client.enqueue("parity-greet", {"name": "Ada"})
        assert worker.run_until_idle() == 1
        assert client.wait(run_id, timeout=1).status == RunStatus.WAITING
        assert client.signal(run_id, "approved", {"by": "ops"}, signal_id="s1") is True
        assert client.signal(run_id, "approved", {"by": "ops"}, signal_id="s1") is False
        worker.run_until_idle()
        run = client.get(run_id, window=True)
        assert run is not None and run.status == "done" and run.state == {"greeted": "Ada"}
        assert run.window == ()
        assert [h.cursor for h in client.history(run_id)] == ["ask", "hello"]
        events = list(client.events(run_id, timeout=5))
        assert [e.data for e in events if e.kind == "greeting"] == [{"to": "Ada"}]
        assert events[-1].kind == "run_ended"
        # A wait's timeout passes on the worker's clock.
        late = client.enqueue("parity-greet", {"name": "Bo"})
        worker.run_until_idle()
        clock.advance(3599)
        assert worker.run_until_idle() == 0
        clock.advance(2)  # past the timeout, which the reaper (here, the worker) then sends
        assert worker.run_until_idle() == 1
        assert client.get(late).state == {"gave_up": True}  # type: ignore[union-attr]
        # Forks and rewinds, from the step ask saved (seq 1: hello comes next).
        fork = client.fork(run_id, at_seq=1, input_patch={"name": "Cy"})
        worker.run_until_idle()
        assert client.get(fork).state == {"greeted": "Cy"}  # type: ignore[union-attr]
        assert [f.run_id for f in client.forks(run_id)] == [fork]
        assert client.rewind(run_id, to_seq=1).status == "pending"
        worker.run_until_idle()
        assert [h.outcome for h in client.history(run_id)][-2:] == ["rewound", "saved"]
        parked = client.enqueue("parity-greet", {"name": "Di"})
        with pytest.raises(RunNotStopped):
            client.rewind(parked, to_seq=1)
        assert client.cancel(parked).status == "cancelled"  # type: ignore[union-attr]
        with pytest.raises(UnknownRun):
            client.signal("nope", "approved")
        assert client.counts() == {RunStatus.DONE: 3, RunStatus.CANCELLED: 1}
        assert [r.run_id for r in client.list(limit=2)] == [parked, fork]
        assert [r.run_id for r in client.list(RunStatus.CANCELLED)] == [parked]


def test_a_retry_and_a_replay_on_the_in_memory_store() -> None:
    clock = ManualClock()
    worker = LocalWorker(clock=clock)
    with Client(store=worker.store, send=worker.send) as client:
        slow = client.enqueue("parity-flaky", run_id="slow")
        busy["slow"] = 1
        worker.run_until_idle()
        assert client.get(slow).status == "running"  # type: ignore[union-attr]  # its retry waits
        clock.advance(2)  # the Retry's first backoff
        worker.run_until_idle()
        assert client.get(slow).status == "done"  # type: ignore[union-attr]
        broken.update({"b1", "b2"})
        since = client.store.clock()
        for r in ("b1", "b2"):
            client.enqueue("parity-flaky", run_id=r)
        worker.run_until_idle()
        assert [r.run_id for r in client.replay("parity-flaky", since=since, dry_run=True)] == [
            "b1",
            "b2",
        ]
        broken.clear()  # the cause fixed
        seen: list[int] = []
        assert len(client.replay("parity-flaky", since=since, progress=seen.append)) == 2
        worker.run_until_idle()
        assert seen == [2] and client.counts() == {RunStatus.DONE: 3}


def test_schedules_on_the_in_memory_store() -> None:
    worker = LocalWorker()
    with Client(store=worker.store, send=worker.send) as client:
        made = client.add_schedule("nightly", "parity-flaky", cron="0 3 * * *")
        assert made.next_at.hour == 3 and not made.paused
        assert client.add_schedule("nightly", "parity-flaky", cron="0 3 * * *") == made
        with pytest.raises(cairn.ScheduleConflict):
            client.add_schedule("nightly", "parity-flaky", every=60)
        assert client.pause_schedule("nightly").paused
        assert not client.resume_schedule("nightly").paused
        assert [s.name for s in client.schedules()] == ["nightly"]
        assert client.remove_schedule("nightly") and not client.remove_schedule("nightly")
        with pytest.raises(cairn.UnknownSchedule):
            client.pause_schedule("nightly")


def test_the_async_client_is_the_client_awaited_on_any_store() -> None:
    worker = LocalWorker(events=True)

    async def main() -> None:
        async with AsyncClient(
            store=worker.store, send=worker.send, events=worker.events
        ) as client:
            assert await client.problems() == []
            run_id = await client.enqueue("parity-greet", {"name": "Ada"})
            worker.run_until_idle()
            assert (await client.wait(run_id, timeout=1)).status == "waiting"
            with pytest.raises(WaitTimedOut):
                await client.wait(await client.enqueue("parity-greet", {"name": "X"}), 0.1)
            started = time.monotonic()
            seen = [e.kind async for e in client.events(run_id, timeout=0.3)]
            assert "wait" in seen and "run_ended" not in seen  # it goes on: the timeout ends it
            assert time.monotonic() - started < 2
            assert await client.signal(run_id, "approved") is True
            worker.run_until_idle()
            events = [e async for e in client.events(run_id)]
            assert events[-1].kind == "run_ended"
            assert (await client.get(run_id)).state == {"greeted": "Ada"}  # type: ignore[union-attr]
            assert [h.cursor for h in await client.history(run_id)] == ["ask", "hello"]
            since = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
            assert await client.replay("parity-greet", since=since, dry_run=True) == []
            assert [s.name for s in await client.schedules()] == []

    asyncio.run(main())


def test_a_store_with_no_broker_says_how_to_send() -> None:
    store = MemoryStore()
    with Client(store=store) as client:
        with pytest.raises(CairnError, match="no broker to send it to.*LocalWorker"):
            client.enqueue("parity-greet", {"name": "Ada"}, run_id="r1")
        assert store.get("r1") is not None  # recorded: a later send delivers it
        assert client.problems() == []  # nothing to reach


def test_the_testing_guides_example_runs_in_under_a_second_with_no_service(
    tmp_path: Path,
) -> None:
    """docs/guides/testing.md's test file, run by pytest as its reader runs it, from a
    folder outside the repo, every service URL pointing nowhere."""
    block = pages.starting("# test_greet.py: `pytest test_greet.py`")
    (tmp_path / "test_greet.py").write_text(block.code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env.update(
        CAIRN_DATABASE_URL="postgresql://unused.invalid/x",
        CAIRN_REDIS_URL="redis://unused.invalid/0",
        PYTHONPATH="",
    )
    pytest_args = ["-q", "-p", "no:cacheprovider", "--durations=0", "--durations-min=0"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args, "test_greet.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0 and "2 passed" in out.stdout, out.stdout + out.stderr
    timed = re.findall(r"^([\d.]+)s (?:setup|call|teardown) ", out.stdout, re.MULTILINE)
    assert len(timed) == 6 and sum(map(float, timed)) < 1.0, out.stdout


slow = cairn.workflow("parity-slow")


@slow.step()
def nap(ctx: cairn.Context) -> cairn.StepResult:
    time.sleep(1.0)  # past the lease's TTL: a slow step, or a provider's SDK first imported
    ctx.ensure_owner(cancel=False)  # what a model request's check asks before it goes out
    return cairn.StepResult(cursor=cairn.DONE, state={"slept": True})


def test_a_local_worker_on_the_real_clock_keeps_a_run_whose_step_outlasts_the_lease() -> None:
    # Without a heartbeat the lease lapsed and the step stopped as a zombie's would, leaving
    # the run pending with nobody to send it again.
    worker = LocalWorker(settings=cairn.Settings(lease_ttl=0.3))
    with Client(store=worker.store, send=worker.send) as client:
        run_id = client.enqueue("parity-slow", {})
        worker.run_until_idle()
        run = client.get(run_id)
        assert run is not None and run.status == "done" and run.state == {"slept": True}
