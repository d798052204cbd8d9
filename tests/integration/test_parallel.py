"""Journaled calls made side by side: ctx.parallel in a sync step, asyncio.gather over
ctx.acall in an async one. Places in program order whatever order the calls finish in, a
failure reported with its place and the others' records kept, and a replay after a crash
mid-parallel that serves the finished calls from the journal and runs only the rest.

On Postgres + Redis, and on the twins: the record writes come from several threads at
once, each on a pool connection of its own. A process killed mid-step is played by
ProcessDied (a BaseException nothing catches); the SIGKILL and SIGSTOP versions on real
workers are tests/fleet/test_parallel.py's.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import uuid
from collections import defaultdict
from typing import Any

import pytest

import cairn
from cairn.core.errors import RetryLater, StaleWrite
from cairn.core.records import Checkpoint
from cairn.core.status import RunStatus
from cairn.steps import Context, StepResult, workflow
from cairn.workers import loop
from tests.helpers.contract import on_both

N = 8

ran: defaultdict[str, list[int]] = defaultdict(list)  # run id -> calls made, as they ended
_ran = threading.Lock()
dying: set[str] = set()  # runs whose process dies in the slow half of their calls


class ProcessDied(BaseException):
    """The step's process killed (SIGKILL): nothing after it runs or records."""


@pytest.fixture(params=["memory", "pg"])
def deps(request: pytest.FixtureRequest) -> loop.Deps:
    return on_both(request)


def _start(deps: loop.Deps, flow: str, data: dict[str, Any] | None = None) -> str:
    run_id = f"{flow}-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, flow, data or {})
    return run_id


def _load(deps: loop.Deps, run_id: str) -> Checkpoint:
    cp = deps.store.load(run_id)
    assert cp is not None
    return cp


def _redeliver(run_id: str, deps: loop.Deps) -> RunStatus:
    """The broker delivers the run again, after its first worker died with the lease."""
    lease = deps.leases.holder(run_id)
    if lease is not None:
        assert deps.leases.break_dead(run_id, lease)
    return loop.run(run_id, deps)


def _fetch(ctx: Context, i: int, *, fail: int = -1) -> dict[str, Any]:
    """Call i: the first started finishes last; the slow half dies with a dying run."""
    assert cairn.current() is ctx  # the step's context reaches the call's own thread
    time.sleep(0.02 * (N - i))
    if ctx.run_id in dying and i >= N // 2:
        time.sleep(0.2)  # the fast half has recorded by now
        raise ProcessDied
    with _ran:
        ran[ctx.run_id].append(i)
    if i == fail:
        raise ValueError(f"no page {i}")
    return {"i": i, "key": ctx.idempotency_key()}


def _positions(deps: loop.Deps, run_id: str, cursor: str) -> dict[int, Any]:
    return {c.pos: c for c in deps.store.journal(run_id, cursor, 0)}


# -- the sync form -------------------------------------------------------------------------
sync_flow = workflow("parallel-sync")


@sync_flow.step()
def fan(ctx: Context) -> StepResult:
    fail = ctx.input.get("fail", -1)
    calls = [("fetch", functools.partial(_fetch, fail=fail), ctx, i) for i in range(N)]
    try:
        results = ctx.parallel(calls, max_workers=ctx.input.get("workers", N))
    except ValueError as exc:
        return StepResult(cursor="done", state={"error": str(exc), "notes": exc.__notes__})
    return StepResult(cursor="done", state={"results": results})


def test_places_are_taken_in_program_order_whatever_order_the_calls_finish(
    deps: loop.Deps,
) -> None:
    run_id = _start(deps, "parallel-sync")
    started = time.monotonic()
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert time.monotonic() - started < 0.5  # side by side, not 0.72 s one by one
    assert ran[run_id] != sorted(ran[run_id])  # they finished out of order (last first)
    results = _load(deps, run_id).state["results"]
    assert [r["i"] for r in results] == list(range(N))  # in the order of the list
    journal = _positions(deps, run_id, "fan")
    assert sorted(journal) == list(range(N))
    for pos, call in journal.items():  # each place holds its own call's result and key
        assert call.name == "fetch"
        assert call.result == {"i": pos, "key": f"cairn:{run_id}:fan:0:fetch:{pos}"}


def test_a_bound_of_one_thread_runs_them_one_by_one_in_the_same_places(
    deps: loop.Deps,
) -> None:
    run_id = _start(deps, "parallel-sync", {"workers": 1})
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert ran[run_id] == list(range(N))
    assert [r["i"] for r in _load(deps, run_id).state["results"]] == list(range(N))


def test_a_failure_names_its_place_and_the_others_records_are_kept(deps: loop.Deps) -> None:
    run_id = _start(deps, "parallel-sync", {"fail": 3})
    assert loop.run(run_id, deps) == RunStatus.DONE
    state = _load(deps, run_id).state
    assert state["error"] == "no page 3"
    assert state["notes"] == ["ctx.parallel: call 3 ('fetch') of step 'fan'"]
    assert sorted(ran[run_id]) == list(range(N))  # the others ran to their end
    journal = _positions(deps, run_id, "fan")
    assert journal[3].error is not None and journal[3].error["message"] == "no page 3"
    assert all(journal[i].result["i"] == i for i in range(N) if i != 3)


retried_flow = workflow("parallel-retried")


@retried_flow.step(retry=cairn.Retry(attempts=2, backoff=0.0))
def shaky(ctx: Context) -> StepResult:
    def flaky(i: int) -> int:
        with _ran:
            ran[ctx.run_id].append(i)
        if i == 5 and ran[ctx.run_id].count(5) == 1:
            raise cairn.Transient("503")  # not recorded: the retry calls it again
        return i * 10

    return StepResult(
        cursor="done", state={"got": ctx.parallel([("f", flaky, i) for i in range(N)])}
    )


def test_a_retry_of_the_step_makes_only_the_failed_call_again(deps: loop.Deps) -> None:
    run_id = _start(deps, "parallel-retried")
    with pytest.raises(RetryLater):  # the delivery ends; the broker brings it back
        loop.run(run_id, deps)
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert sorted(ran[run_id]) == sorted([*range(N), 5])  # only call 5 made twice
    assert _load(deps, run_id).state["got"] == [i * 10 for i in range(N)]


def test_a_replay_after_a_crash_mid_parallel_runs_only_the_unfinished_calls(
    deps: loop.Deps,
) -> None:
    run_id = _start(deps, "parallel-sync")
    dying.add(run_id)
    with pytest.raises(ProcessDied):
        loop.run(run_id, deps)
    dying.discard(run_id)
    assert sorted(ran[run_id]) == [0, 1, 2, 3]
    assert sorted(_positions(deps, run_id, "fan")) == [0, 1, 2, 3]
    assert _redeliver(run_id, deps) == RunStatus.DONE
    assert sorted(ran[run_id]) == list(range(N))  # the finished half not made again
    results = _load(deps, run_id).state["results"]
    assert results == [{"i": i, "key": f"cairn:{run_id}:fan:0:fetch:{i}"} for i in range(N)]


# -- the async form ------------------------------------------------------------------------
async_flow = workflow("parallel-async")


async def _afetch(ctx: Context, i: int) -> dict[str, Any]:
    await asyncio.sleep(0.02 * (N - i))
    if ctx.run_id in dying and i >= N // 2:
        await asyncio.sleep(0.2)
        raise ProcessDied
    ran[ctx.run_id].append(i)
    return {"i": i, "key": ctx.idempotency_key()}


@async_flow.step()
async def afan(ctx: Context) -> StepResult:
    results = await asyncio.gather(*(ctx.acall("fetch", _afetch, ctx, i) for i in range(N)))
    return StepResult(cursor="done", state={"results": list(results)})


def test_gathered_calls_take_their_places_in_program_order_and_replay_so(
    deps: loop.Deps,
) -> None:
    run_id = _start(deps, "parallel-async")
    dying.add(run_id)
    with pytest.raises(ProcessDied):
        loop.run(run_id, deps)
    dying.discard(run_id)
    assert sorted(ran[run_id]) == [0, 1, 2, 3]  # the rest cut
    journal = _positions(deps, run_id, "afan")
    assert {pos: call.result["i"] for pos, call in journal.items()} == {i: i for i in range(4)}
    assert _redeliver(run_id, deps) == RunStatus.DONE
    assert sorted(ran[run_id][4:]) == [4, 5, 6, 7]  # only the unfinished made again
    results = _load(deps, run_id).state["results"]
    assert results == [{"i": i, "key": f"cairn:{run_id}:afan:0:fetch:{i}"} for i in range(N)]


zombie_flow = workflow("parallel-zombie")
taken_over: dict[str, loop.Deps] = {}  # run id -> the services another worker claims it on


@zombie_flow.step()
def slow_fan(ctx: Context) -> StepResult:
    def late(i: int) -> int:
        if i == 0:  # another worker takes the run over while the calls are out
            deps = taken_over[ctx.run_id]
            assert deps.store.claim(ctx.run_id, ctx.epoch + 1) is not None
        time.sleep(0.05)
        with _ran:
            ran[ctx.run_id].append(i)
        return i

    got = ctx.parallel([("late", late, i) for i in range(4)])
    return StepResult(cursor="done", state={"got": got})


def test_a_zombies_late_results_are_refused(deps: loop.Deps) -> None:
    run_id = _start(deps, "parallel-zombie")
    taken_over[run_id] = deps
    with pytest.raises(StaleWrite):  # the delivery ends: the run is another worker's
        loop.run(run_id, deps)
    assert sorted(ran[run_id]) == [0, 1, 2, 3]  # made, but none of them is ours to keep
    assert _positions(deps, run_id, "slow_fan") == {}
    assert _load(deps, run_id).seq == 0  # nor any save
