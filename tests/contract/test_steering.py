"""Steering a running agent (Client.steer, ctx.messages()): each message delivered once, in
order, at the step's next read; a replay reads what the journal says the visit got; a
worker that lost the run records nothing, so the next owner gets the messages.

On the in-memory twins and on Postgres + Redis. The kill on real workers is
tests/fleet/test_steering.py's.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import defaultdict
from typing import Any

import pytest

from cairn.client import Client
from cairn.core import errors
from cairn.core.status import RunStatus
from cairn.steps import Context, StepResult, workflow
from cairn.workers import loop
from tests.helpers.contract import on_both

# run id -> what each turn read; the turn after whose read its process dies once; the
# messages a test sends at a turn (from inside the step: a user typing meanwhile)
seen: defaultdict[str, list[list[Any]]] = defaultdict(list)
dies_at: dict[str, int] = {}
sends: dict[tuple[str, int], list[Any]] = {}


class ProcessDied(BaseException):
    """The step's process killed (SIGKILL): nothing after it runs or records."""


@pytest.fixture(params=["memory", "pg"])
def deps(request: pytest.FixtureRequest) -> loop.Deps:
    return on_both(request)


def _client(deps: loop.Deps) -> Client:
    return Client(settings=deps.settings, store=deps.store, send=lambda run_id, priority: None)


def _start(deps: loop.Deps, flow: str, data: dict[str, Any] | None = None) -> str:
    run_id = f"{flow}-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, flow, data or {})
    return run_id


agent = workflow("steer-agent")


@agent.step()
def turns(ctx: Context) -> StepResult:
    """Four turns of an agent loop: take in what the user added, then a journaled call."""
    client = _client_of[ctx.run_id]
    for turn in range(4):
        for message in sends.pop((ctx.run_id, turn), []):
            client.steer(ctx.run_id, message)
        got = ctx.messages()
        seen[ctx.run_id].append(got)
        if dies_at.get(ctx.run_id) == turn:
            del dies_at[ctx.run_id]
            raise ProcessDied
        ctx.call("turn", lambda turn=turn: turn)
    return StepResult(cursor="done")


_client_of: dict[str, Client] = {}


def _run(deps: loop.Deps, **to_send: list[Any]) -> tuple[str, Client]:
    run_id = _start(deps, "steer-agent")
    client = _client_of[run_id] = _client(deps)
    for turn, messages in to_send.items():
        sends[(run_id, int(turn[1:]))] = messages
    return run_id, client


def _redeliver(run_id: str, deps: loop.Deps) -> RunStatus:
    lease = deps.leases.holder(run_id)
    if lease is not None:
        assert deps.leases.break_dead(run_id, lease)
    return loop.run(run_id, deps)


def test_each_message_reaches_the_next_read_once_in_order(deps: loop.Deps) -> None:
    run_id, client = _run(deps, t0=[], t2=["also check the date", {"role": "user", "x": 1}])
    assert client.steer(run_id, "first") == 1
    assert client.steer(run_id, "second") == 2

    assert loop.run(run_id, deps) == RunStatus.DONE
    assert seen[run_id] == [
        ["first", "second"],
        [],
        ["also check the date", {"role": "user", "x": 1}],
        [],
    ]


def test_a_replay_reads_what_the_visit_got_and_new_messages_come_next(deps: loop.Deps) -> None:
    run_id, client = _run(deps, t1=["sent at turn 1"])
    client.steer(run_id, "before the start")
    dies_at[run_id] = 1  # after turn 1's read was recorded, before its call

    with pytest.raises(ProcessDied):
        loop.run(run_id, deps)
    client.steer(run_id, "sent while no worker had it")
    assert _redeliver(run_id, deps) == RunStatus.DONE

    # The first attempt's reads, then the replay's: turns 0 and 1 from the journal (the
    # same messages at the same place), the new one at the first read the journal lacks.
    assert seen[run_id] == [
        ["before the start"],
        ["sent at turn 1"],
        ["before the start"],
        ["sent at turn 1"],
        ["sent while no worker had it"],
        [],
    ]


fenced = workflow("steer-fenced")


@fenced.step()
def late(ctx: Context) -> StepResult:
    if ctx.input.get("claimed_by_another"):
        # Another worker claims the run now (this one paused past its lease, say).
        assert ctx._store.claim(ctx.run_id, ctx._lease.epoch + 5) is not None
    seen[ctx.run_id].append(ctx.messages())
    return StepResult(cursor="done")


def test_a_worker_that_lost_the_run_takes_no_message(deps: loop.Deps) -> None:
    run_id = _start(deps, "steer-fenced", {"claimed_by_another": True})
    client = _client(deps)
    client.steer(run_id, "for whoever owns the run")
    with pytest.raises(errors.Superseded):
        loop.run(run_id, deps)
    assert seen[run_id] == []  # its read was fenced: the step never got the message
    # What the next owner reads: the message, still undelivered.
    assert deps.store.steers_pending(run_id) == [(1, "for whoever owns the run")]


def test_steer_refuses_what_no_step_would_read(deps: loop.Deps) -> None:
    client = _client(deps)
    with pytest.raises(errors.UnknownRun):
        client.steer("no-such-run", "hello")
    run_id = _start(deps, "steer-fenced")
    assert loop.run(run_id, deps) == RunStatus.DONE
    with pytest.raises(errors.RunEnded, match="has ended"):
        client.steer(run_id, "too late")
    with pytest.raises(errors.InvalidInput):
        client.steer(run_id, float("nan"))
    assert deps.store.steers_pending(run_id) == []


# -- interrupt: a steer message that cuts the call in flight ----------------------------

# run id -> how many times its call began; the runs whose call waits to be cut (else
# it answers at once); a call's "started" flag for the test to steer on
began: defaultdict[str, int] = defaultdict(int)
blocking: set[str] = set()
in_call: dict[str, threading.Event] = {}
CALL_WAIT = 10.0  # a cut must come long before a blocking call would end


def _think(run_id: str) -> str:
    began[run_id] += 1
    in_call[run_id].set()
    if run_id in blocking:
        time.sleep(CALL_WAIT)
    return "thought"


async def _athink(run_id: str, ended: list[str]) -> str:
    began[run_id] += 1
    in_call[run_id].set()
    try:
        await asyncio.sleep(CALL_WAIT if run_id in blocking else 0)
    except asyncio.CancelledError:
        ended.append("cancelled")  # the cut cancels the awaitable itself
        raise
    return "thought"


cut = workflow("steer-cut")


@cut.step()
def converse(ctx: Context) -> StepResult:
    """Turns until a message says stop; each turn's call may be cut by a message."""
    for turn in range(6):
        got = ctx.messages()
        seen[ctx.run_id].append(got)
        if "stop" in got:
            break
        if dies_at.get(ctx.run_id) == turn:
            del dies_at[ctx.run_id]
            raise ProcessDied
        try:
            ctx.call("think", _think, ctx.run_id, interruptible=True)
        except errors.CallInterrupted:
            seen[ctx.run_id].append(["cut"])
    return StepResult(cursor="done")


acut = workflow("steer-cut-async")
cancelled: defaultdict[str, list[str]] = defaultdict(list)


@acut.step()
async def aconverse(ctx: Context) -> StepResult:
    for _ in range(6):
        got = ctx.messages()
        seen[ctx.run_id].append(got)
        if "stop" in got:
            break
        try:
            await ctx.acall("think", _athink, ctx.run_id, cancelled[ctx.run_id], interruptible=True)
        except errors.CallInterrupted:
            seen[ctx.run_id].append(["cut"])
    return StepResult(cursor="done")


def _steer_in_call(client: Client, run_id: str, message: str) -> None:
    """Wait for the run's call to begin, then steer with interrupt=True."""
    assert in_call[run_id].wait(CALL_WAIT), "the call never began"
    in_call[run_id].clear()
    client.steer(run_id, message, interrupt=True)


def _cut_run(deps: loop.Deps, flow: str, *messages: str) -> tuple[str, float]:
    """Run flow in a thread, cutting its calls with each message in turn: the run's id
    and how long the run took."""
    run_id = _start(deps, flow)
    client = _client(deps)
    in_call[run_id] = threading.Event()
    blocking.add(run_id)
    started = time.monotonic()
    done: list[RunStatus] = []
    runner = threading.Thread(target=lambda: done.append(loop.run(run_id, deps)))
    runner.start()
    for message in messages:
        _steer_in_call(client, run_id, message)
    runner.join(CALL_WAIT * 2)
    assert done == [RunStatus.DONE]
    return run_id, time.monotonic() - started


def _cuts(deps: loop.Deps, run_id: str) -> list[int]:
    """The journal places recorded as cut."""
    calls = _client(deps).calls(run_id)
    return [c.pos for c in calls if c.error is not None and c.error["type"] == "CallInterrupted"]


@pytest.mark.parametrize("flow", ["steer-cut", "steer-cut-async"])
def test_an_interrupting_message_cuts_the_call_in_flight(deps: loop.Deps, flow: str) -> None:
    run_id, took = _cut_run(deps, flow, "turn left", "stop")

    # Each call was cut as its message came (a call left alone waits CALL_WAIT), and the
    # turn after the cut read the message that cut it.
    assert took < CALL_WAIT / 2
    assert seen[run_id] == [[], ["cut"], ["turn left"], ["cut"], ["stop"]]
    assert began[run_id] == 2
    assert _cuts(deps, run_id) == [1, 3]
    if flow == "steer-cut-async":
        assert cancelled[run_id] == ["cancelled", "cancelled"]


def test_a_replay_meets_the_cut_without_calling_again(deps: loop.Deps) -> None:
    run_id = _start(deps, "steer-cut")
    client = _client(deps)
    in_call[run_id] = threading.Event()
    blocking.add(run_id)
    dies_at[run_id] = 1  # after turn 1's read (the message that cut turn 0's call)
    failed: list[BaseException] = []

    def first() -> None:
        try:
            loop.run(run_id, deps)
        except ProcessDied as exc:
            failed.append(exc)

    runner = threading.Thread(target=first)
    runner.start()
    _steer_in_call(client, run_id, "turn left")
    runner.join(CALL_WAIT)
    assert failed and began[run_id] == 1

    blocking.discard(run_id)  # from here the call answers at once
    client.steer(run_id, "stop")  # read after the replayed turns, at turn 2
    assert _redeliver(run_id, deps) == RunStatus.DONE
    # The replay's turn 0 call is the recorded cut, raised again, not called again.
    assert seen[run_id][3:] == [[], ["cut"], ["turn left"], ["stop"]]
    assert began[run_id] == 2  # turn 0's (cut) and turn 1's, once each
    assert _cuts(deps, run_id) == [1]


def test_a_message_sent_with_no_call_in_flight_only_waits(deps: loop.Deps) -> None:
    run_id = _start(deps, "steer-cut")
    client = _client(deps)
    in_call[run_id] = threading.Event()
    client.steer(run_id, "before any call", interrupt=True)
    client.steer(run_id, "stop", interrupt=True)
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert seen[run_id] == [["before any call", "stop"]]
    assert began[run_id] == 0 and _cuts(deps, run_id) == []
