"""Journaled calls inside a step (ctx.call, ctx.model): each made at most once per visit,
its result replayed after a crash, fenced by the run's epoch.

Each test runs on the in-memory twins and on Postgres + Redis: the twins pass the same
contract suite, and the journal's fence is SQL worth running for real. A process killed
mid-step is played by ProcessDied (a BaseException nothing catches); the SIGKILL version on
real workers is tests/fleet/test_chaos.py's agent loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections import defaultdict
from typing import Any

import pytest

import cairn
from cairn.core import errors
from cairn.core.records import Call, Checkpoint
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.steps import Context, StepResult, context, workflow
from cairn.steps.context import CANCEL_FRESH
from cairn.steps.model import ModelClient, text_of
from cairn.testing.standins import ModelServer
from cairn.workers import loop
from cairn.workers.middleware import Chain, Middleware
from cairn.workers.wake import Waker
from tests.helpers.contract import on_both

calls: defaultdict[str, list[Any]] = defaultdict(list)  # what really ran, per run
dies: dict[str, int] = {}  # run id -> the number of calls after which its process dies once
killed_in_call: dict[str, int] = {}  # run id -> the model call (1st...) its process dies in


class ProcessDied(BaseException):
    """The step's process killed (SIGKILL): nothing after it runs or records."""


class _Model:
    """A model client that counts what it is asked: each call costs $0.01."""

    def worst_cost(self, **request: Any) -> float:
        return 0.02

    def create(self, **request: Any) -> tuple[Any, float]:
        run_id = request["metadata"]["user_id"]
        calls[run_id].append("model")
        if killed_in_call.get(run_id) == calls[run_id].count("model"):
            del killed_in_call[run_id]
            raise ProcessDied  # after the provider billed it, before its record
        return {"role": "assistant", "content": f"answer {len(calls[run_id])}"}, 0.01


@pytest.fixture(params=["memory", "pg"])
def deps(request: pytest.FixtureRequest) -> loop.Deps:
    return on_both(request, model=_Model())


def _start(deps: loop.Deps, flow: str, data: dict[str, Any] | None = None, **kw: Any) -> str:
    run_id = f"{flow}-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, flow, data or {}, **kw)
    return run_id


def _load(deps: loop.Deps, run_id: str) -> Checkpoint:
    cp = deps.store.load(run_id)
    assert cp is not None
    return cp


def _maybe_die(ctx: Context) -> None:
    """Die once, after the number of journaled calls the test set for the run."""
    if dies.get(ctx.run_id) == ctx._calls:
        del dies[ctx.run_id]
        raise ProcessDied


def _redeliver(run_id: str, deps: loop.Deps) -> RunStatus:
    """The broker delivers the run again, after its first worker died with the lease."""
    lease = deps.leases.holder(run_id)
    if lease is not None:
        assert deps.leases.break_dead(run_id, lease)
    return loop.run(run_id, deps)


# -- an agent loop inside one step --------------------------------------------------------
agent = workflow("journal-agent")


@agent.step()
def think(ctx: Context) -> StepResult:
    """Eight model calls and three tool effects, interleaved, in one step."""
    replies = []
    for turn in range(8):
        _maybe_die(ctx)
        replies.append(ctx.model(messages=[], max_tokens=8, metadata={"user_id": ctx.run_id}))
        if turn % 3 == 1:
            _maybe_die(ctx)
            ctx.call("send", _send, ctx, turn)
    return StepResult(cursor="done", state={"replies": [r["content"] for r in replies]})


def _send(ctx: Context, turn: int) -> dict[str, Any]:
    key = ctx.idempotency_key()
    calls[ctx.run_id].append(("send", key))
    return {"sent": turn, "key": key}


async_agent = workflow("journal-agent-async")


@async_agent.step("think")
async def think_async(ctx: Context) -> StepResult:
    """The same agent as async code: amodel, and acall of an async tool."""
    replies = []
    for turn in range(8):
        _maybe_die(ctx)
        reply = await ctx.amodel(messages=[], max_tokens=8, metadata={"user_id": ctx.run_id})
        replies.append(reply)
        if turn % 3 == 1:
            _maybe_die(ctx)
            await ctx.acall("send", _send_async, ctx, turn)
    return StepResult(cursor="done", state={"replies": [r["content"] for r in replies]})


async def _send_async(ctx: Context, turn: int) -> dict[str, Any]:
    await asyncio.sleep(0)
    return _send(ctx, turn)


@pytest.mark.parametrize("die_after", [0, 5, 9])
@pytest.mark.parametrize("flow", ["journal-agent", "journal-agent-async"])
def test_a_replay_after_a_crash_makes_no_call_twice(
    deps: loop.Deps, flow: str, die_after: int
) -> None:
    run_id = _start(deps, flow)
    dies[run_id] = die_after
    with pytest.raises(ProcessDied):
        loop.run(run_id, deps)
    made = len(calls[run_id])
    assert made == die_after  # each call journaled as it returned
    assert _redeliver(run_id, deps) == RunStatus.DONE
    assert calls[run_id].count("model") == 8
    sends = [c for c in calls[run_id] if c != "model"]
    assert [key for _, key in sends] == [
        f"cairn:{run_id}:think:0:send:{n}" for n in range(3)
    ]  # one key per call, stable across the replay
    cp = _load(deps, run_id)
    assert cp.state["replies"] == [f"answer {n}" for n in _answers(calls[run_id])]
    assert cp.cost_usd == pytest.approx(0.08)  # each model call counted once


def _answers(made: list[Any]) -> list[int]:
    """The reply numbers the model gave, in order (it numbers them by calls so far)."""
    return [i + 1 for i, c in enumerate(made) if c == "model"]


# -- what is recorded, and what is not ----------------------------------------------------
errs = workflow("journal-errors")


@errs.step(retry=cairn.Retry(attempts=3, backoff=0.0, on=(cairn.Transient, KeyError)))
def shaky(ctx: Context) -> StepResult:
    seen = []
    for name in ("permanent", "flaky", "retried"):
        try:
            seen.append(ctx.call(name, _fail, ctx, name))
        except (ValueError, KeyError, cairn.Transient) as exc:
            seen.append(f"{type(exc).__name__}: {exc}")
        _maybe_die(ctx)
    return StepResult(cursor="done", state={"seen": seen})


def _fail(ctx: Context, name: str) -> str:
    calls[ctx.run_id].append(name)
    tries = calls[ctx.run_id].count(name)
    if name == "permanent":
        raise ValueError("no such customer")
    if name == "flaky" and tries == 1:
        raise cairn.Transient("503")
    if name == "retried" and tries == 1:
        raise KeyError("the policy retries this")
    return f"{name} ok"


def test_a_permanent_error_replays_and_a_retried_one_runs_again(deps: loop.Deps) -> None:
    run_id = _start(deps, "journal-errors")
    dies[run_id] = 3  # after all three calls, before the save
    with pytest.raises(ProcessDied):
        loop.run(run_id, deps)
    assert _redeliver(run_id, deps) == RunStatus.DONE
    # The ValueError was recorded: its replay raised it again without calling. The
    # Transient and the KeyError (in the step's retry policy) were not: called again.
    assert calls[run_id] == ["permanent", "flaky", "retried", "flaky", "retried"]
    assert _load(deps, run_id).state["seen"] == [
        "ValueError: no such customer",
        "flaky ok",
        "retried ok",
    ]


diverge = workflow("journal-diverge")


@diverge.step()
def choose(ctx: Context) -> StepResult:
    first = "search" if ctx.run_id not in calls else "fetch"  # not deterministic: a bug
    calls[ctx.run_id].append(first)
    ctx.call(first, lambda: 1)
    _maybe_die(ctx)
    return StepResult(cursor="done")


def test_a_replay_that_calls_in_another_order_stops_incompatible_naming_both(
    deps: loop.Deps,
) -> None:
    run_id = _start(deps, "journal-diverge")
    dies[run_id] = 1
    with pytest.raises(ProcessDied):
        loop.run(run_id, deps)
    assert _redeliver(run_id, deps) == RunStatus.INCOMPATIBLE  # not retried, re-armable
    error = _load(deps, run_id).error or ""
    assert "call 0 is 'fetch'" in error and "recorded 'search'" in error


keys = workflow("journal-keys")


@keys.step()
def two_effects(ctx: Context) -> StepResult:
    inside = ctx.call("a", lambda: ctx.idempotency_key("x"))
    outside = ctx.idempotency_key()
    try:
        ctx.call("b", lambda: [ctx.idempotency_key(), ctx.idempotency_key("other")])
    except cairn.MultipleEffects as exc:
        calls[ctx.run_id].append(str(exc))
    return StepResult(cursor="done", state={"inside": inside, "outside": outside})


def test_each_call_has_its_own_key_and_one_effect(deps: loop.Deps) -> None:
    run_id = _start(deps, "journal-keys")
    assert loop.run(run_id, deps) == RunStatus.DONE
    state = _load(deps, run_id).state
    assert state == {
        "inside": f"cairn:{run_id}:two_effects:0:a:0:x",
        "outside": f"cairn:{run_id}:two_effects:0",
    }
    [refused] = calls[run_id]
    assert f"call 'cairn:{run_id}:two_effects:0:b:0'" in refused and "second effect key" in refused
    # The step's own effect key (outside calls) is the one the history records.
    assert deps.store.history(run_id)[-1]["effect_key"] == f"cairn:{run_id}:two_effects:0"


fenced = workflow("journal-fenced")


@fenced.step()
def late(ctx: Context) -> StepResult:
    ctx.call("before", lambda: 1)
    # Another worker claims the run now (this one paused past its lease, say).
    assert ctx._store.claim(ctx.run_id, ctx._lease.epoch + 5) is not None
    ctx.call("after", lambda: calls[ctx.run_id].append("after ran") or 2)
    return StepResult(cursor="done")


def test_a_worker_that_lost_the_run_records_nothing(deps: loop.Deps) -> None:
    run_id = _start(deps, "journal-fenced")
    with pytest.raises(errors.Superseded):
        loop.run(run_id, deps)
    cp = _load(deps, run_id)
    names = [c.name for c in deps.store.journal(run_id, "late", 0)]
    assert names == ["before"]  # "after" ran (a late worker cannot be stopped) but is not ours
    assert cp.seq == 0


costs = workflow("journal-costs")


@costs.step()
def pay(ctx: Context) -> StepResult:
    def other_provider() -> str:
        calls[ctx.run_id].append("other")
        ctx.add_cost(0.3)
        return "ok"

    ctx.call("other", other_provider)
    _maybe_die(ctx)
    ctx.call("pricey", lambda: calls[ctx.run_id].append("pricey"), max_cost=0.5)
    return StepResult(cursor="done")


def test_add_cost_is_counted_once_and_max_cost_is_checked_first(deps: loop.Deps) -> None:
    rich = _start(deps, "journal-costs", max_cost_usd=1.0)
    dies[rich] = 1
    with pytest.raises(ProcessDied):
        loop.run(rich, deps)
    assert _redeliver(rich, deps) == RunStatus.DONE
    assert calls[rich] == ["other", "pricey"]
    assert _load(deps, rich).cost_usd == pytest.approx(0.3)
    poor = _start(deps, "journal-costs", max_cost_usd=0.6)
    assert loop.run(poor, deps) == RunStatus.BUDGET_EXCEEDED
    assert calls[poor] == ["other"]
    assert "ctx.call('pricey') could cost up to $0.500000" in (_load(deps, poor).error or "")
    with pytest.raises(ValueError, match="0 or more"):
        Context(_load(deps, poor), store=deps.store, lease=None).add_cost(-1)  # type: ignore[arg-type]


opaque = workflow("journal-opaque")


@opaque.step()
def returns_a_set(ctx: Context) -> StepResult:
    ctx.call("tags", lambda: {"a", "b"})
    return StepResult(cursor="done")


def test_a_result_that_is_not_json_fails_clearly(deps: loop.Deps) -> None:
    run_id = _start(deps, "journal-opaque")
    assert loop.run(run_id, deps) == RunStatus.FAILED
    error = _load(deps, run_id).error or ""
    assert "ctx.call('tags') returned set, which cannot be journaled" in error


def test_sweep_takes_the_journal_with_the_run(deps: loop.Deps) -> None:
    run_id = _start(deps, "journal-agent")
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert len(deps.store.journal(run_id, "think", 0)) == 11
    assert deps.store.sweep(older_than=-3600) >= 1
    assert deps.store.journal(run_id, "think", 0) == []


# -- the real SDK against the local Messages API ------------------------------------------
sdk = workflow("journal-sdk")


@sdk.step()
def ask_twice(ctx: Context) -> StepResult:
    texts = []
    for n in range(2):
        _maybe_die(ctx)
        reply = ctx.model(messages=[{"role": "user", "content": f"question {n}"}], max_tokens=16)
        assert type(reply).__name__ == "Message"  # the SDK's type, replayed or not
        texts.append(text_of(reply))
    _maybe_die(ctx)
    return StepResult(cursor="done", state={"texts": texts})


def test_the_sdks_messages_replay_as_messages_and_are_asked_once(
    deps: loop.Deps, model: ModelServer
) -> None:
    client = ModelClient(base_url=model.url, give_up_after=10.0)
    with_sdk = dataclasses.replace(deps, model=client)
    try:
        run_id = _start(deps, "journal-sdk")
        dies[run_id] = 2
        with pytest.raises(ProcessDied):
            loop.run(run_id, with_sdk)
        first = _load(deps, run_id)
        assert _redeliver(run_id, with_sdk) == RunStatus.DONE
    finally:
        client.close()
    assert model.stats()["requests"] == 2
    cp = _load(deps, run_id)
    assert len(cp.state["texts"]) == 2 and all(cp.state["texts"])
    assert cp.cost_usd > first.cost_usd == 0


# -- async steps ---------------------------------------------------------------------------
side_by_side = workflow("journal-gather")


@side_by_side.step()
async def fan_out(ctx: Context) -> StepResult:
    async def fetch(delay: float, what: str) -> dict[str, Any]:
        await asyncio.sleep(delay)  # the first started finishes last
        calls[ctx.run_id].append(what)
        return {"what": what, "key": ctx.idempotency_key()}

    slow, fast = await asyncio.gather(
        ctx.acall("fetch", fetch, 0.05, "slow"), ctx.acall("fetch", fetch, 0.0, "fast")
    )
    _maybe_die(ctx)
    loops = calls.setdefault(f"{ctx.run_id}:loops", [])
    loops.append(id(asyncio.get_running_loop()))
    once = await ctx.aonce(_note_async)
    return StepResult(cursor="done", state={"slow": slow, "fast": fast, "once": once})


async def _note_async(key: str) -> str:
    run_id = key.split(":")[1]
    calls[run_id].append("once")
    return key


def test_calls_awaited_side_by_side_keep_their_places_and_keys(deps: loop.Deps) -> None:
    run_id = _start(deps, "journal-gather")
    dies[run_id] = 2
    with pytest.raises(ProcessDied):
        loop.run(run_id, deps)
    assert calls[run_id] == ["fast", "slow"]  # recorded in the order they returned
    assert _redeliver(run_id, deps) == RunStatus.DONE
    assert calls[run_id] == ["fast", "slow", "once"]  # neither fetched again
    state = _load(deps, run_id).state
    assert state["slow"] == {"what": "slow", "key": f"cairn:{run_id}:fan_out:0:fetch:0"}
    assert state["fast"] == {"what": "fast", "key": f"cairn:{run_id}:fan_out:0:fetch:1"}
    assert state["once"] == f"cairn:{run_id}:fan_out:0"
    again = _start(deps, "journal-gather")
    assert loop.run(again, deps) == RunStatus.DONE
    # One event loop per thread, kept from step to step.
    assert calls[f"{run_id}:loops"] == calls[f"{again}:loops"]


guarded = workflow("journal-async-guards")


@guarded.step()
async def spend(ctx: Context) -> StepResult:
    await ctx.acall("first", lambda: calls[ctx.run_id].append("first"))
    ctx._store.cancel(ctx.run_id, "stop now") if ctx.input.get("cancel") else None
    await asyncio.sleep(ctx.input.get("pause", 0))
    for _ in range(3):
        await ctx.amodel(messages=[], max_tokens=8, metadata={"user_id": ctx.run_id})
    return StepResult(cursor="done")


@pytest.mark.parametrize("fresh", [0.0, 3600.0])
def test_an_async_step_is_stopped_by_cancel_and_budget_as_a_sync_one(
    deps: loop.Deps, fresh: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cancel lands right after the first call's record. A call's check stands on the
    # last read of the run when it is younger than CANCEL_FRESH: with 0 the model call
    # reads and never starts; with an hour it starts on the record's read, and its own
    # record reads the cancel and stops the step: one call at most after a cancel.
    monkeypatch.setattr(context, "CANCEL_FRESH", fresh)
    cancelled = _start(deps, "journal-async-guards", {"cancel": True})
    assert loop.run(cancelled, deps) == RunStatus.CANCELLED
    assert calls[cancelled] == (["first"] if fresh == 0 else ["first", "model"])
    recorded = [c.name for c in deps.store.journal(cancelled, "spend", 0)]
    assert recorded == calls[cancelled]  # a call made is kept, even the one after a cancel
    capped = _start(deps, "journal-async-guards", max_cost_usd=0.035)
    assert loop.run(capped, deps) == RunStatus.BUDGET_EXCEEDED
    # Each call costs 0.01 and could cost 0.02: the third could take 0.02 spent to 0.04.
    assert calls[capped] == ["first", "model", "model"]
    error = _load(deps, capped).error or ""
    assert "spent $0.020000; the next model call could cost up to $0.020000" in error


def test_a_cancel_older_than_the_last_read_stops_the_next_call_before_it_starts(
    deps: loop.Deps,
) -> None:
    # Past CANCEL_FRESH the check before a call reads the run again.
    run_id = _start(deps, "journal-async-guards", {"cancel": True, "pause": 4 * CANCEL_FRESH})
    assert loop.run(run_id, deps) == RunStatus.CANCELLED
    assert calls[run_id] == ["first"]


class _Seen(Middleware):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int, str | None]] = []

    def before_call(self, cp: Checkpoint, name: str, pos: int) -> None:
        self.seen.append(("before", name, pos, None))

    def after_call(
        self, cp: Checkpoint, name: str, pos: int, *, exception: BaseException | None
    ) -> None:
        self.seen.append(("after", name, pos, type(exception).__name__ if exception else None))


def test_middleware_hears_each_call_made_and_none_replayed(deps: loop.Deps) -> None:
    seen = _Seen()
    watched = dataclasses.replace(deps, middleware=Chain([seen]))
    run_id = _start(deps, "journal-errors")
    dies[run_id] = 3
    with pytest.raises(ProcessDied):
        loop.run(run_id, watched)
    assert seen.seen == [
        ("before", "permanent", 0, None),
        ("after", "permanent", 0, "ValueError"),
        ("before", "flaky", 1, None),
        ("after", "flaky", 1, "Transient"),
        ("before", "retried", 2, None),
        ("after", "retried", 2, "KeyError"),
    ]
    seen.seen.clear()
    assert _redeliver(run_id, watched) == RunStatus.DONE
    assert [s[1] for s in seen.seen] == ["flaky", "flaky", "retried", "retried"]
    agent_run = _start(deps, "journal-agent")
    seen.seen.clear()
    assert loop.run(agent_run, watched) == RunStatus.DONE
    assert [s[:3] for s in seen.seen[:4]] == [
        ("before", "model", 0),
        ("after", "model", 0),
        ("before", "model", 1),
        ("after", "model", 1),
    ]
    assert len(seen.seen) == 22  # 8 model calls and 3 sends, each heard twice


progress = workflow("journal-progress")


@progress.step()
def many(ctx: Context) -> StepResult:
    for n in range(14):
        _maybe_die(ctx)
        ctx.call("tool", lambda n=n: calls[ctx.run_id].append(n) or n)
    return StepResult(cursor="done")


def test_a_step_killed_again_and_again_while_its_journal_grows_is_not_poison(
    deps: loop.Deps,
) -> None:
    run_id = _start(deps, "journal-progress")
    limit = deps.settings.max_deliveries
    for n in range(1, limit + 3):  # more deliveries than the poison limit, each one a call on
        dies[run_id] = n
        with pytest.raises(ProcessDied):
            _redeliver(run_id, deps)
    assert _redeliver(run_id, deps) == RunStatus.DONE
    assert calls[run_id] == list(range(14))  # each call made once


# -- at-most-once effects --------------------------------------------------------------------
charges = workflow("journal-at-most-once")


@charges.step()
def charge(ctx: Context) -> StepResult:
    def pay(key: str) -> dict[str, str]:
        calls[ctx.run_id].append(("pay", key))
        _maybe_die(ctx)  # after the charge, before its done mark
        return {"charged": key}

    def look_up(key: str) -> dict[str, str]:
        calls[ctx.run_id].append(("reconcile", key))
        return {"found": key}

    if ctx.input.get("claimed_by_another"):  # another worker claims the run right now
        assert ctx._store.claim(ctx.run_id, ctx._lease.epoch + 5) is not None
    reconcile = look_up if ctx.input.get("reconcile") else None
    result = ctx.once(pay, at_most_once=True, reconcile=reconcile)
    return StepResult(cursor="done", state={"result": result})


def test_an_effect_whose_outcome_was_lost_is_never_run_again(deps: loop.Deps) -> None:
    run_id = _start(deps, "journal-at-most-once")
    dies[run_id] = 0
    with pytest.raises(ProcessDied):
        loop.run(run_id, deps)
    assert _redeliver(run_id, deps) == RunStatus.UNKNOWN
    key = f"cairn:{run_id}:charge:0"
    cp = _load(deps, run_id)
    assert f"the at-most-once effect {key} was started" in (cp.error or "")
    assert f"cairn runs resolve {run_id} --done" in (cp.error or "")
    assert loop.run(run_id, deps) == RunStatus.UNKNOWN  # delivered again: still stopped
    assert calls[run_id] == [("pay", key)]
    # Resolved as done: the replay returns the given result, the charge is not made again.
    assert deps.store.resolve(run_id, True, {"charged": "by hand"}) == (True, [key])
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert _load(deps, run_id).state["result"] == {"charged": "by hand"}
    assert calls[run_id] == [("pay", key)]
    assert deps.store.resolve(run_id, True, None) == (False, [])  # again: nothing to do


def test_resolved_as_not_done_the_effect_runs_again(deps: loop.Deps) -> None:
    run_id = _start(deps, "journal-at-most-once")
    dies[run_id] = 0
    with pytest.raises(ProcessDied):
        loop.run(run_id, deps)
    assert _redeliver(run_id, deps) == RunStatus.UNKNOWN
    assert deps.store.resolve(run_id, False) == (True, [f"cairn:{run_id}:charge:0"])
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert [c[0] for c in calls[run_id]] == ["pay", "pay"]


def test_a_reconcile_decides_the_outcome_instead(deps: loop.Deps) -> None:
    run_id = _start(deps, "journal-at-most-once", {"reconcile": True})
    dies[run_id] = 0
    with pytest.raises(ProcessDied):
        loop.run(run_id, deps)
    assert _redeliver(run_id, deps) == RunStatus.DONE
    key = f"cairn:{run_id}:charge:0"
    assert calls[run_id] == [("pay", key), ("reconcile", key)]
    assert _load(deps, run_id).state["result"] == {"found": key}


def test_a_worker_that_lost_the_run_writes_no_intent_and_makes_no_charge(
    deps: loop.Deps,
) -> None:
    run_id = _start(deps, "journal-at-most-once", {"claimed_by_another": True})
    with pytest.raises(errors.Superseded):
        loop.run(run_id, deps)
    assert calls[run_id] == []
    assert deps.store.open_intents(run_id) == []  # type: ignore[attr-defined]


# -- ctx.db inside a call: its writes commit with the call's record ------------------------
ledger = workflow("journal-ledger")


@ledger.step()
def book(ctx: Context) -> StepResult:
    def write(n: int) -> str:
        key = ctx.idempotency_key()
        calls[ctx.run_id].append(key)
        # No ON CONFLICT: written twice, the replay would fail on the primary key.
        ctx.db.execute(
            "INSERT INTO invoice_ledger (idempotency_key, run_id, customer, amount_cents)"
            " VALUES (%s, %s, 'c', %s)",
            (key, ctx.run_id, n),
        )
        return key

    booked = []
    for n in range(3):
        _maybe_die(ctx)
        booked.append(ctx.call("book", write, n))
    return StepResult(cursor="done", state={"booked": booked})


class _DieAfterCall(Middleware):
    """Kills the process once after call pos returned, before its record is written."""

    def __init__(self, pos: int) -> None:
        self.pos: int | None = pos

    def after_call(
        self, cp: Checkpoint, name: str, pos: int, *, exception: BaseException | None
    ) -> None:
        if pos == self.pos:
            self.pos = None
            raise ProcessDied


@pytest.mark.parametrize("kill", ["after the write, before its record", "after its record"])
def test_ctx_db_in_a_call_commits_with_the_calls_record(
    store: Any, settings: Settings, leases: Any, sql: Any, kill: str
) -> None:
    deps = loop.Deps(settings=settings, store=store, leases=leases, model=None)
    run_id = _start(deps, "journal-ledger")
    if kill.startswith("after the write"):
        killed = dataclasses.replace(deps, middleware=Chain([_DieAfterCall(1)]))
    else:
        killed, dies[run_id] = deps, 2  # two calls recorded, the third not begun
    with pytest.raises(ProcessDied):
        loop.run(run_id, killed)
    rows = sql("SELECT amount_cents FROM invoice_ledger WHERE run_id = %s ORDER BY 1", run_id)
    # Call 1's write rolled back with its unwritten record; calls before it committed.
    assert [r[0] for r in rows] == [0, 1] if kill == "after its record" else [0]
    assert _redeliver(run_id, deps) == RunStatus.DONE
    rows = sql("SELECT idempotency_key FROM invoice_ledger WHERE run_id = %s", run_id)
    keys = [f"cairn:{run_id}:book:0:book:{n}" for n in range(3)]
    assert sorted(r[0] for r in rows) == keys  # each row once: none lost, none twice
    assert _load(deps, run_id).state["booked"] == keys


# -- budgets: the spend a journaled call adds, once -------------------------------------
def _budget(deps: loop.Deps, run_id: str) -> tuple[float, float]:
    budget = deps.store.budget(run_id)
    assert budget is not None
    return budget.spent_usd, budget.reserved_usd


@pytest.mark.parametrize("die_after", [0, 5])
def test_a_budgets_spend_is_what_the_journal_holds_after_a_crash(
    deps: loop.Deps, die_after: int
) -> None:
    run_id = _start(deps, "journal-agent", budget_usd=1.0)
    dies[run_id] = die_after
    with pytest.raises(ProcessDied):
        loop.run(run_id, deps)
    assert _budget(deps, run_id) == pytest.approx((0.01 * calls[run_id].count("model"), 0))
    assert _redeliver(run_id, deps) == RunStatus.DONE
    assert _budget(deps, run_id) == pytest.approx((0.08, 0))  # the replayed five added nothing


def test_a_call_cut_by_a_kill_holds_its_worst_case_until_the_next_attempt_settles_it(
    deps: loop.Deps,
) -> None:
    run_id = _start(deps, "journal-agent", budget_usd=1.0)
    killed_in_call[run_id] = 3
    with pytest.raises(ProcessDied):
        loop.run(run_id, deps)
    assert _budget(deps, run_id) == pytest.approx((0.02, 0.02))  # two recorded, one in flight
    assert _redeliver(run_id, deps) == RunStatus.DONE
    assert _budget(deps, run_id) == pytest.approx((0.08, 0))  # the hold settled, not leaked


def test_a_run_stops_over_its_budget_and_goes_on_when_it_is_raised(deps: loop.Deps) -> None:
    # Each call costs 0.01 at worst 0.02: the fifth would make 0.04 + 0.02 > 0.05.
    run_id = _start(deps, "journal-agent", budget_usd=0.05)
    assert loop.run(run_id, deps) == RunStatus.BUDGET_EXCEEDED
    assert calls[run_id].count("model") == 4
    cp = _load(deps, run_id)
    assert f"budget run:{run_id}" in (cp.error or "")
    assert _budget(deps, run_id) == pytest.approx((0.04, 0))
    assert deps.store.raise_budget(run_id, 1.0) == [run_id]
    assert _load(deps, run_id).status == RunStatus.PENDING
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert calls[run_id].count("model") == 8  # the four recorded were replayed, not made
    assert _budget(deps, run_id) == pytest.approx((0.08, 0))
    assert deps.store.raise_budget("no-budget", 1.0) is None


def test_a_record_written_again_by_its_writer_adds_its_cost_once(deps: loop.Deps) -> None:
    run_id = _start(deps, "journal-agent", budget_usd=1.0)
    cp = deps.store.claim(run_id, 1)
    assert cp is not None
    assert deps.store.reserve(cp, 0, 0, 0.02) is None
    call = Call(pos=0, name="model", result={"n": 1}, cost_usd=0.01)
    # The first try committed and its reply was lost: the retry meets its own row.
    assert deps.store.record_call(cp, 0, call) is not None
    assert deps.store.record_call(cp, 0, call) is not None
    assert _budget(deps, run_id) == pytest.approx((0.01, 0))


# -- a tenant's budget per day or month: every run of the tenant spends against it -------
def _tenant_spent(deps: loop.Deps, tenant: str) -> tuple[float, float]:
    budget = deps.store.tenant_budget(tenant)
    assert budget is not None
    return budget.spent_usd, budget.reserved_usd


def test_a_tenants_runs_share_its_budget_and_go_on_when_it_is_raised(deps: loop.Deps) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    first = _start(deps, "journal-agent", tenant=tenant)  # in before the budget: counted
    second = _start(deps, "journal-agent", tenant=tenant)
    other = _start(deps, "journal-agent", tenant=f"{tenant}x")
    untenanted = _start(deps, "journal-agent")
    assert deps.store.tenant_budget(tenant) is None
    assert deps.store.set_tenant_budget(tenant, per="day") is None  # a new one needs a limit
    assert deps.store.set_tenant_budget(tenant, usd=0.105, per="day") == []
    assert _load(deps, first).budgets == [f"tenant:{tenant}"]
    assert _load(deps, untenanted).budgets is None

    assert loop.run(first, deps) == RunStatus.DONE
    assert _tenant_spent(deps, tenant) == pytest.approx((0.08, 0))
    # 0.08 + 0.02 fits 0.105; then 0.09 + 0.02 would pass it: stopped before that call.
    assert loop.run(second, deps) == RunStatus.BUDGET_EXCEEDED
    assert calls[second].count("model") == 1
    error = _load(deps, second).error or ""
    assert f"budget tenant:{tenant}" in error and f"cairn budgets set --tenant {tenant}" in error
    assert _tenant_spent(deps, tenant) == pytest.approx((0.09, 0))
    # Another tenant's run and a run with no tenant spend nothing of it.
    assert loop.run(other, deps) == RunStatus.DONE
    assert loop.run(untenanted, deps) == RunStatus.DONE
    assert _tenant_spent(deps, tenant) == pytest.approx((0.09, 0))

    assert deps.store.set_tenant_budget(tenant, usd=1.0) == [second]
    assert _load(deps, second).status == RunStatus.PENDING
    assert loop.run(second, deps) == RunStatus.DONE
    assert calls[second].count("model") == 8  # the one recorded was replayed, not made
    budget = deps.store.tenant_budget(tenant)
    assert budget is not None
    assert (budget.spent_usd, budget.limit_usd, budget.period) == pytest.approx((0.16, 1.0, "day"))


def _next_day(deps: loop.Deps, request: Any, tenant: str, stopped: tuple[str, ...] = ()) -> None:
    """A day on: the twins' clock moved, or the budget's period (and the stopped runs'
    stops) put back on Postgres."""
    from cairn.testing import MemoryStore

    if isinstance(deps.store, MemoryStore):
        deps.store._clock.advance(24 * 3600)  # type: ignore[attr-defined]
        return
    sql = request.getfixturevalue("sql")
    sql(
        "UPDATE budgets SET period_start = period_start - interval '1 day' WHERE scope = %s",
        f"tenant:{tenant}",
    )
    sql(
        "UPDATE checkpoints SET updated_at = updated_at - interval '1 day' WHERE run_id = ANY(%s)",
        list(stopped),
    )


def test_a_tenants_budget_starts_again_each_day(deps: loop.Deps, request: Any) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    run_id = _start(deps, "journal-agent", tenant=tenant)
    deps.store.set_tenant_budget(tenant, usd=0.055, per="day")
    # 0.03 + 0.02 fits 0.055; the fifth call, 0.04 + 0.02, would not.
    assert loop.run(run_id, deps) == RunStatus.BUDGET_EXCEEDED
    assert calls[run_id].count("model") == 4
    before = deps.store.tenant_budget(tenant)
    assert before is not None and before.spent_usd == pytest.approx(0.04)

    _next_day(deps, request, tenant)
    rolled = deps.store.tenant_budget(tenant)
    assert rolled is not None and rolled.spent_usd == 0
    assert rolled.period_start is not None and rolled.period_start.hour == 0
    # Stopped runs stay stopped over the night; set again, it goes on in the new day.
    assert _load(deps, run_id).status == RunStatus.BUDGET_EXCEEDED
    assert deps.store.set_tenant_budget(tenant, usd=0.055) == [run_id]
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert calls[run_id].count("model") == 8
    assert _tenant_spent(deps, tenant) == pytest.approx((0.04, 0))  # this day's four


def test_a_tenants_runs_stopped_over_its_budget_go_on_by_themselves_in_the_new_day(
    deps: loop.Deps, request: Any
) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    deps.store.set_tenant_budget(tenant, usd=0.065, per="day")
    # Its tree's budget stops `own` at its second call, the tenant's 0.01 spent; the
    # tenant's stops `run_id` before its fifth (0.05 + 0.02).
    own = _start(deps, "journal-agent", tenant=tenant, budget_usd=0.025)
    assert loop.run(own, deps) == RunStatus.BUDGET_EXCEEDED
    assert f"budget run:{own}" in (_load(deps, own).error or "")
    run_id = _start(deps, "journal-agent", tenant=tenant)
    assert loop.run(run_id, deps) == RunStatus.BUDGET_EXCEEDED
    assert f"budget tenant:{tenant}" in (_load(deps, run_id).error or "")
    sent: list[str] = []
    wake = Waker(store=deps.store, send=sent.append).wake
    assert run_id not in wake()  # the day that stopped it is not over
    assert _load(deps, run_id).status == RunStatus.BUDGET_EXCEEDED

    _next_day(deps, request, tenant, stopped=(own, run_id))
    woken = wake()
    assert run_id in woken and run_id in sent and own not in woken
    assert _load(deps, run_id).status == RunStatus.PENDING
    assert _load(deps, own).status == RunStatus.BUDGET_EXCEEDED  # its tree's is no new day's
    assert run_id not in wake()  # re-armed once
    assert _tenant_spent(deps, tenant) == pytest.approx((0, 0))
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert calls[run_id].count("model") == 8
    assert _tenant_spent(deps, tenant) == pytest.approx((0.04, 0))  # its four of this day


def test_a_call_in_flight_over_midnight_counts_in_the_new_day(
    deps: loop.Deps, request: Any
) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    deps.store.set_tenant_budget(tenant, usd=1.0, per="day")
    run_id = _start(deps, "journal-agent", tenant=tenant)
    cp = deps.store.claim(run_id, 1)
    assert cp is not None
    assert deps.store.reserve(cp, 0, 0, 0.02) is None
    assert deps.store.record_call(cp, 0, Call(pos=0, name="model", result={}, cost_usd=0.01))
    assert deps.store.reserve(cp, 0, 1, 0.02) is None
    _next_day(deps, request, tenant)
    # Its record lands before any check of the new day: yesterday's spend is not its.
    assert deps.store.record_call(cp, 0, Call(pos=1, name="model", result={}, cost_usd=0.01))
    assert _tenant_spent(deps, tenant) == pytest.approx((0.01, 0))


def test_a_tenants_budget_deleted_limits_nothing_and_its_stopped_runs_go_on(
    deps: loop.Deps,
) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    assert deps.store.delete_tenant_budget(tenant) is None  # none to delete
    deps.store.set_tenant_budget(tenant, usd=0.055, per="day")
    # 0.03 + 0.02 fits 0.055; the fifth call, 0.04 + 0.02, would not.
    run_id = _start(deps, "journal-agent", tenant=tenant)
    assert loop.run(run_id, deps) == RunStatus.BUDGET_EXCEEDED
    # A run in flight, claimed while the budget stood, holding a call's worst case.
    busy = _start(deps, "journal-agent", tenant=tenant)
    cp = deps.store.claim(busy, 1)
    assert cp is not None and cp.budgets == [f"tenant:{tenant}"]
    assert deps.store.reserve(cp, 0, 0, 0.001) is None

    got = deps.store.delete_tenant_budget(tenant)
    assert got is not None
    deleted, rearmed = got
    assert rearmed == [run_id]
    assert (deleted.scope, deleted.limit_usd, deleted.period) == (
        f"tenant:{tenant}", 0.055, "day",
    )  # fmt: skip
    assert (deleted.spent_usd, deleted.reserved_usd) == pytest.approx((0.04, 0.001))
    assert deps.store.tenant_budget(tenant) is None
    assert deps.store.delete_tenant_budget(tenant) is None  # gone once
    # The one in flight spends against nothing: a call far over the old limit is admitted.
    assert deps.store.reserve(cp, 0, 1, 5.0) is None
    assert deps.store.record_call(cp, 0, Call(pos=1, name="model", result={}, cost_usd=5.0))
    assert _load(deps, busy).budgets is None  # its next claim leaves the scope out

    assert _load(deps, run_id).status == RunStatus.PENDING
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert calls[run_id].count("model") == 8  # the four recorded were replayed, not made
    # A budget set again counts from nothing.
    deps.store.set_tenant_budget(tenant, usd=1.0)
    assert _tenant_spent(deps, tenant) == pytest.approx((0, 0))
