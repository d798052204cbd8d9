"""The run loop's logic on the in-memory twins: no Postgres, Redis, Celery or model server.

MemoryStore and MemoryLeases pass the same contract suite as PgStore and the Redis leases
(tests/contract/test_store_contract.py), so what the loop does here it does on the real thing; the
crash, outage and fleet tests stay on real services. Time is a ManualClock the tests move.
The fixtures below shadow the conftest's `store`, `leases` and `deps`: nothing here
reaches for a service.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import defaultdict
from typing import Any

import pytest

import cairn
from cairn.core import errors
from cairn.core.records import START, Checkpoint
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.steps import Context, StepResult, registry, workflow
from cairn.store.lease import LeaseToken
from cairn.testing import ManualClock, MemoryLeases, MemoryStore
from cairn.workers import loop
from cairn.workers.middleware import Chain, Middleware
from cairn.workers.reaper import Reaper

# Constructing Settings connects to nothing; these URLs would fail if anything tried.
SETTINGS = Settings(
    database_url="postgresql://unused.invalid/x",
    redis_url="redis://unused.invalid/0",
    lease_ttl=10.0,
    max_deliveries=2,
)
# Far above any real pid (the kernel's PID_MAX_LIMIT is 2**22): an owner long dead.
DEAD_PID = 2**22 + 1

# What the steps did, per run (run ids are unique per test).
calls: defaultdict[str, list[Any]] = defaultdict(list)


class ProcessDied(BaseException):
    """A step's process killed mid-step (OOM, SIGKILL): nothing after it runs or records."""


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(clock: ManualClock) -> MemoryStore:
    return MemoryStore(clock)


@pytest.fixture
def leases(clock: ManualClock) -> MemoryLeases:
    return MemoryLeases(clock)


@pytest.fixture
def deps(store: MemoryStore, leases: MemoryLeases) -> loop.Deps:
    return loop.Deps(settings=SETTINGS, store=store, leases=leases, model=None)


def _start(store: MemoryStore, flow: str, data: dict[str, Any] | None = None, **kw: Any) -> str:
    """A run of flow, enqueued as the Client does (the worker finds the first step)."""
    run_id = f"{flow}-{uuid.uuid4().hex[:8]}"
    assert store.create_run(run_id, flow, data or {}, **kw)
    return run_id


def _load(store: MemoryStore, run_id: str) -> Checkpoint:
    cp = store.load(run_id)
    assert cp is not None
    return cp


def _with(deps: loop.Deps, **settings: Any) -> loop.Deps:
    return dataclasses.replace(deps, settings=dataclasses.replace(deps.settings, **settings))


# -- a run to the end, and delivered again -----------------------------------------------
steps = workflow("mem-steps")


@steps.step()
def greet(ctx: Context) -> StepResult:
    calls[ctx.run_id].append(("greet", ctx.idempotency_key()))
    hello = {"role": "user", "content": f"hello {ctx.run_id}"}
    return StepResult(cursor="remember", window=[*ctx.window, hello], state={"greeted": True})


def _die_once(ctx: Context, where: str) -> None:
    """The process dies here on the first delivery that gets here, if the input says so."""
    if ctx.input.get("die") == where and ("died", where) not in calls[ctx.run_id]:
        calls[ctx.run_id].append(("died", where))
        raise ProcessDied


@steps.step()
def remember(ctx: Context) -> StepResult:
    def effect(key: str) -> dict[str, str]:
        calls[ctx.run_id].append(("effect", key))
        _die_once(ctx, "after_effect")  # before the ledger and the save
        return {"sent": key}

    result = ctx.once(effect)
    _die_once(ctx, "after_ledger")  # the ledger has it; the save never came
    return StepResult(cursor="finish", state={"receipt": result}, cost_usd=0.25)


@steps.step()
def finish(ctx: Context) -> StepResult:
    calls[ctx.run_id].append(("finish", ctx.visit))
    return StepResult(cursor="done", state={"finished": True})


def test_a_run_goes_to_done_and_a_redelivery_changes_nothing(
    deps: loop.Deps, store: MemoryStore, leases: MemoryLeases
) -> None:
    run_id = _start(store, "mem-steps")
    assert loop.run(run_id, deps) == RunStatus.DONE
    cp = _load(store, run_id)
    key = f"cairn:{run_id}:remember:0"
    assert (cp.status, cp.cursor, cp.seq) == ("done", "done", 3)
    assert (cp.cost_usd, cp.flow_version) == (0.25, 1)
    assert cp.state == {"greeted": True, "receipt": {"sent": key}, "finished": True}
    assert cp.visits == {"greet": 1, "remember": 1, "finish": 1}
    assert cp.window == ({"role": "user", "content": f"hello {run_id}"},)
    assert store.was_done(key) == (True, {"sent": key})
    history = store.history(run_id)
    assert [(h["seq"], h["cursor"], h["outcome"]) for h in history] == [
        (0, "greet", "saved"),
        (1, "remember", "saved"),
        (2, "finish", "saved"),
    ]
    assert history[0]["effect_key"] == f"cairn:{run_id}:greet:0" and history[1]["effect_key"] == key
    assert leases.holder(run_id) is None
    before, done_calls = cp, list(calls[run_id])
    assert loop.run(run_id, deps) == RunStatus.DONE  # a warm shutdown's redelivery
    assert _load(store, run_id) == before and calls[run_id] == done_calls
    assert leases.holder(run_id) is None
    # The run ended: its epoch counter went with its lease, so a new one starts over.
    fresh = leases.acquire(run_id, ttl=10)
    assert fresh is not None and fresh.epoch == 1


def test_an_unknown_run_is_refused(deps: loop.Deps, leases: MemoryLeases) -> None:
    with pytest.raises(errors.UnknownRun):
        loop.run("no-such-run", deps)
    assert leases.holder("no-such-run") is None


def test_a_run_of_an_unregistered_workflow_fails_clearly(
    deps: loop.Deps, store: MemoryStore
) -> None:
    store.create_run("ghost-1", "mem-no-such-flow", {})
    assert loop.run("ghost-1", deps) == RunStatus.FAILED
    assert "unknown workflow 'mem-no-such-flow'" in (_load(store, "ghost-1").error or "")


# -- effects: keys per visit, the ledger across a crash ---------------------------------
visits = workflow("mem-visits")


@visits.step()
def think(ctx: Context) -> StepResult:
    calls[ctx.run_id].append(ctx.idempotency_key())
    assert ctx.idempotency_key() == calls[ctx.run_id][-1]  # the same key again: one effect
    n = ctx.state.get("n", 0) + 1
    return StepResult(cursor="done" if n >= ctx.input["visits"] else "think", state={"n": n})


def test_each_visit_of_a_looping_step_gets_its_own_key(deps: loop.Deps, store: MemoryStore) -> None:
    run_id = _start(store, "mem-visits", {"visits": 3})
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert calls[run_id] == [f"cairn:{run_id}:think:{v}" for v in range(3)]
    assert _load(store, run_id).visits == {"think": 3}


def test_a_replay_after_a_crash_reuses_the_visits_key_and_the_ledger_skips_the_effect(
    deps: loop.Deps, store: MemoryStore
) -> None:
    run_id = _start(store, "mem-steps", {"die": "after_ledger"})
    with pytest.raises(ProcessDied):
        loop.run(run_id, deps)
    assert loop.run(run_id, deps) == RunStatus.DONE
    key = f"cairn:{run_id}:remember:0"
    effects = [c for c in calls[run_id] if c[0] == "effect"]
    assert effects == [("effect", key)]  # ran once; the replay found it in the ledger
    cp = _load(store, run_id)
    assert cp.state["receipt"] == {"sent": key} and cp.resumes == 1


def test_an_effect_whose_process_died_before_the_ledger_runs_again_with_the_same_key(
    deps: loop.Deps, store: MemoryStore
) -> None:
    # ctx.once narrows the window, not closes it: the downstream dedupes on the key.
    run_id = _start(store, "mem-steps", {"die": "after_effect"})
    with pytest.raises(ProcessDied):
        loop.run(run_id, deps)
    assert loop.run(run_id, deps) == RunStatus.DONE
    key = f"cairn:{run_id}:remember:0"
    assert [c for c in calls[run_id] if c[0] == "effect"] == [("effect", key), ("effect", key)]


# -- retries ---------------------------------------------------------------------------
flaky = workflow("mem-flaky")


@flaky.step()
def prepare(ctx: Context) -> StepResult:
    note = {"role": "user", "content": "prepared"}
    return StepResult(cursor="call", state={"prepared": True}, window=[*ctx.window, note])


@flaky.step("call", retry=cairn.Retry(attempts=3, backoff=0.5, on=(cairn.Transient, ValueError)))
def call(ctx: Context) -> StepResult:
    calls[ctx.run_id].append(ctx.visit)
    mode, tries = ctx.input.get("mode", "transient"), len(calls[ctx.run_id])
    if tries <= ctx.input.get("fail", 0):
        if mode == "transient":
            raise cairn.Transient(f"the API answered 503 (try {tries})")
        if mode == "value":
            raise ValueError(f"bad answer (try {tries})")
        if mode == "runtime":
            raise RuntimeError("the step blew up")
        if mode == "store_down":
            raise errors.StoreUnavailable("postgres unavailable: gone")
    return StepResult(cursor="done", state={"tries": tries})


def test_a_retried_step_counts_its_attempts_across_deliveries(
    deps: loop.Deps, store: MemoryStore
) -> None:
    run_id = _start(store, "mem-flaky", {"fail": 2})
    delays = []
    for attempts in (1, 2):
        with pytest.raises(errors.RetryLater) as info:
            loop.run(run_id, deps)
        delays.append(info.value.delay)
        cp = _load(store, run_id)
        assert (cp.attempts, cp.status, cp.cursor) == (attempts, "running", "call")
        assert "503" in (cp.error or "")
    assert delays == [0.5, 1.0]  # the policy's backoff, doubling
    assert loop.run(run_id, deps) == RunStatus.DONE
    cp = _load(store, run_id)
    assert (cp.attempts, cp.state["tries"]) == (0, 3)
    assert [h["outcome"] for h in store.history(run_id)] == ["saved", "retry", "retry", "saved"]


@pytest.mark.parametrize("mode", ["transient", "value"])
def test_a_step_whose_attempts_are_spent_fails_the_run(
    deps: loop.Deps, store: MemoryStore, mode: str
) -> None:
    run_id = _start(store, "mem-flaky", {"fail": 99, "mode": mode})
    for _ in range(2):
        with pytest.raises(errors.RetryLater):
            loop.run(run_id, deps)
    assert loop.run(run_id, deps) == RunStatus.FAILED
    cp = _load(store, run_id)
    assert "retries exhausted after 3 attempts" in (cp.error or "")
    assert len(calls[run_id]) == 3 and cp.attempts == 3
    assert loop.run(run_id, deps) == RunStatus.FAILED  # failed stays failed
    assert len(calls[run_id]) == 3


def test_an_exception_the_policy_does_not_retry_fails_the_run_and_keeps_the_checkpoint(
    deps: loop.Deps, store: MemoryStore
) -> None:
    run_id = _start(store, "mem-flaky", {"fail": 1, "mode": "runtime"})
    assert loop.run(run_id, deps) == RunStatus.FAILED
    cp = _load(store, run_id)
    assert cp.error == "step 'call' raised RuntimeError: the step blew up"
    assert (cp.seq, cp.cursor, cp.state) == (1, "call", {"prepared": True})
    assert cp.window == ({"role": "user", "content": "prepared"},)
    assert store.history(run_id)[-1]["outcome"] == "failed"
    # Enqueued again (the cause fixed: the step no longer raises), it goes on at its cursor.
    assert store.create_run(run_id, "mem-flaky", {"fail": 1, "mode": "runtime"}) is False
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert calls[run_id] == [0, 0]


def test_our_own_store_down_inside_a_step_ends_the_delivery_not_the_run(
    deps: loop.Deps, store: MemoryStore
) -> None:
    run_id = _start(store, "mem-flaky", {"fail": 1, "mode": "store_down"})
    with pytest.raises(errors.StoreUnavailable):
        loop.run(run_id, deps)
    cp = _load(store, run_id)
    assert (cp.status, cp.attempts, cp.cursor) == ("running", 0, "call")  # no attempt spent
    assert loop.run(run_id, deps) == RunStatus.DONE


# -- poison ----------------------------------------------------------------------------
oom = workflow("mem-oom")


@oom.step()
def swell(ctx: Context) -> StepResult:
    calls[ctx.run_id].append(ctx.visit)
    raise ProcessDied


def test_a_step_that_kills_its_process_every_time_is_poison(
    deps: loop.Deps, store: MemoryStore
) -> None:
    run_id = _start(store, "mem-oom")
    for deliveries in (1, 2):  # settings.max_deliveries = 2
        with pytest.raises(ProcessDied):
            loop.run(run_id, deps)
        assert _load(store, run_id).deliveries == deliveries
    assert loop.run(run_id, deps) == RunStatus.FAILED
    cp = _load(store, run_id)
    error = cp.error or ""
    assert "poison: delivered 3 times" in error and "CAIRN_MAX_DELIVERIES=2" in error
    assert len(calls[run_id]) == 2  # the third delivery refused to run it


def test_recorded_retries_are_not_poison(deps: loop.Deps, store: MemoryStore) -> None:
    # Deliveries that ended in a recorded attempt are the retry policy's to count.
    run_id = _start(store, "mem-flaky", {"fail": 2})
    strict = _with(deps, max_deliveries=1)
    for _ in range(2):
        with pytest.raises(errors.RetryLater):
            loop.run(run_id, strict)
    assert loop.run(run_id, strict) == RunStatus.DONE


# -- workflow versions -----------------------------------------------------------------
evolving = workflow("mem-evolving", version=3)


@evolving.migration(from_version=1)
def _renamed(state: dict[str, Any]) -> dict[str, Any]:
    state["count"] = state.pop("n")
    return state


@evolving.migration(from_version=2)
def _tagged(state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "v3": True}


@evolving.step()
def tally(ctx: Context) -> StepResult:
    return StepResult(cursor="done", state={"final": ctx.state["count"] + 1})


gappy = workflow("mem-gappy", version=3)


@gappy.migration(from_version=2)
def _only_from_two(state: dict[str, Any]) -> dict[str, Any]:
    return state


@gappy.step()
def count(ctx: Context) -> StepResult:
    return StepResult(cursor="done")


def _saved_by(store: MemoryStore, flow: str, version: int, state: dict[str, Any]) -> str:
    """A run whose state an older (or newer) deploy of flow saved at version."""
    run_id = _start(store, flow)
    cp = _load(store, run_id)
    step = next(iter(registry.get(flow).steps))
    store.save(
        cp.evolve(seq=1, cursor=step, status=RunStatus.RUNNING, state=state, flow_version=version),
        cp,
    )
    return run_id


def test_a_run_saved_by_an_older_version_is_migrated_along_the_chain(
    deps: loop.Deps, store: MemoryStore
) -> None:
    run_id = _saved_by(store, "mem-evolving", 1, {"n": 5})
    assert loop.run(run_id, deps) == RunStatus.DONE
    cp = _load(store, run_id)
    assert cp.state == {"count": 5, "v3": True, "final": 6} and cp.flow_version == 3


@pytest.mark.parametrize(
    ("flow", "saved_at", "why"),
    [("mem-evolving", 4, "version 4"), ("mem-gappy", 1, "no migration for it")],
)
def test_a_run_no_migration_reaches_is_incompatible(
    deps: loop.Deps, store: MemoryStore, flow: str, saved_at: int, why: str
) -> None:
    run_id = _saved_by(store, flow, saved_at, {"n": 1})
    assert loop.run(run_id, deps) == RunStatus.INCOMPATIBLE
    cp = _load(store, run_id)
    assert why in (cp.error or "") and cp.state == {"n": 1} and cp.flow_version == saved_at
    assert loop.run(run_id, deps) == RunStatus.INCOMPATIBLE  # never retried by itself


def test_a_checkpoint_this_code_cannot_read_is_refused_and_recorded(
    deps: loop.Deps, store: MemoryStore
) -> None:
    run_id = _start(store, "mem-steps")
    cp = _load(store, run_id)
    store.save(cp.evolve(seq=1, cursor="greet", version=7), cp)  # a foreign payload version
    assert loop.run(run_id, deps) == RunStatus.INCOMPATIBLE
    assert loop.run(run_id, deps) == RunStatus.INCOMPATIBLE
    run = store.get(run_id)
    assert run is not None and "payload version 7" in (run.error or "") and run.seq == 1
    assert calls[run_id] == []


# -- windows ---------------------------------------------------------------------------
chat = workflow("mem-chat")


@chat.step()
def talk(ctx: Context) -> StepResult:
    size, turn = ctx.input["size"], ctx.state.get("turn", 0) + 1
    said = [
        {"role": "user", "content": f"q{turn} " + "x" * size},
        {"role": "assistant", "content": f"a{turn} " + "y" * size},
    ]
    done = turn >= ctx.input["turns"]
    return StepResult(
        cursor="done" if done else "talk", window=[*ctx.window, *said], state={"turn": turn}
    )


def test_a_window_that_grows_is_appended_and_loads_back_exactly(
    deps: loop.Deps, store: MemoryStore
) -> None:
    run_id = _start(store, "mem-chat", {"size": 10, "turns": 4})
    assert loop.run(run_id, deps) == RunStatus.DONE
    cp = _load(store, run_id)
    assert [m["content"][:2] for m in cp.window] == ["q1", "a1", "q2", "a2", "q3", "a3", "q4", "a4"]
    assert (cp.win_start, cp.win_end) == (0, 8)


def test_a_window_over_the_budget_is_compacted_into_a_fresh_range(
    deps: loop.Deps, store: MemoryStore
) -> None:
    run_id = _start(store, "mem-chat", {"size": 200, "turns": 6})
    assert loop.run(run_id, _with(deps, window_budget_tokens=300)) == RunStatus.DONE
    cp = _load(store, run_id)
    assert cp.window[0]["content"].startswith("[Summary of the earlier conversation]")
    assert cp.window[-1]["content"].startswith("a6 ")
    assert cp.win_start > 0 and len(cp.window) <= 5
    assert all(m["role"] in ("user", "assistant") for m in cp.window)


def test_a_window_still_too_large_after_compaction_fails_the_run_unsaved(
    deps: loop.Deps, store: MemoryStore
) -> None:
    # Four messages of 5 kB: compaction keeps the last four whole, so nothing is cut.
    run_id = _start(store, "mem-chat", {"size": 5000, "turns": 5})
    small = _with(deps, window_budget_tokens=100, max_window_bytes=12_000)
    assert loop.run(run_id, small) == RunStatus.FAILED
    cp = _load(store, run_id)
    assert "after compaction, over CAIRN_MAX_WINDOW_BYTES=12000" in (cp.error or "")
    # The first turn's save stands; the second, which would pass the limit, wrote nothing.
    assert (cp.seq, cp.cursor, cp.state, len(cp.window)) == (1, "talk", {"turn": 1}, 2)


# -- waits, signals and timeouts -------------------------------------------------------
approval = workflow("mem-approval")


@approval.step()
def ask(ctx: Context) -> StepResult:
    return StepResult.wait(
        "approve",
        cursor="decide",
        timeout=ctx.input.get("timeout"),
        on_timeout="expire",
        state={"asked": True},
    )


@approval.step()
def decide(ctx: Context) -> StepResult:
    return StepResult(cursor="done", state={"outcome": "approved", "by": ctx.signal})


@approval.step()
def expire(ctx: Context) -> StepResult:
    return StepResult(cursor="done", state={"outcome": "expired", "signal": ctx.signal})


def test_a_waiting_run_holds_no_lease_and_its_signal_resumes_it(
    deps: loop.Deps, store: MemoryStore, leases: MemoryLeases
) -> None:
    run_id = _start(store, "mem-approval")
    assert loop.run(run_id, deps) == RunStatus.WAITING
    assert leases.holder(run_id) is None
    assert loop.run(run_id, deps) == RunStatus.WAITING  # a stray delivery changes nothing
    assert store.signal(run_id, "something-else", {}, "s-0") == (RunStatus.WAITING, True)
    assert loop.run(run_id, deps) == RunStatus.WAITING  # not the event it waits for
    assert store.signal(run_id, "approve", {"by": "ada"}, "s-1") == (RunStatus.WAITING, True)
    assert store.signal(run_id, "approve", {"by": "ada"}, "s-1") == (RunStatus.WAITING, False)
    assert loop.run(run_id, deps) == RunStatus.DONE
    cp = _load(store, run_id)
    assert cp.state == {"asked": True, "outcome": "approved", "by": {"by": "ada"}}
    assert [h["cursor"] for h in store.history(run_id)] == ["ask", "decide"]
    assert loop.run(run_id, deps) == RunStatus.DONE  # the duplicate signal woke nothing more


def test_a_signal_sent_before_the_run_waits_is_not_lost(
    deps: loop.Deps, store: MemoryStore
) -> None:
    run_id = _start(store, "mem-approval")
    store.signal(run_id, "approve", {"early": True}, "s-1")
    with pytest.raises(errors.HandOff, match="had come"):
        loop.run(run_id, deps)  # saved waiting, and told its signal is there: back to the queue
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert _load(store, run_id).state["by"] == {"early": True}


def test_the_timeout_resumes_a_waiting_run_on_its_timeout_cursor(
    deps: loop.Deps, store: MemoryStore, clock: ManualClock
) -> None:
    run_id = _start(store, "mem-approval", {"timeout": 60})
    assert loop.run(run_id, deps) == RunStatus.WAITING
    clock.advance(59)
    assert loop.run(run_id, deps) == RunStatus.WAITING
    clock.advance(1)  # 60 s after it began to wait, however many writes came between
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert _load(store, run_id).state == {"asked": True, "outcome": "expired", "signal": None}


def test_a_wait_without_timeout_waits_however_long(
    deps: loop.Deps, store: MemoryStore, clock: ManualClock
) -> None:
    run_id = _start(store, "mem-approval")
    assert loop.run(run_id, deps) == RunStatus.WAITING
    clock.advance(365 * 86400)
    assert loop.run(run_id, deps) == RunStatus.WAITING


# -- cancel ----------------------------------------------------------------------------
plain = workflow("mem-plain")


@plain.step()
def first(ctx: Context) -> StepResult:
    calls[ctx.run_id].append("first")
    return StepResult(cursor="second", state={"first": True})


@plain.step()
def second(ctx: Context) -> StepResult:
    calls[ctx.run_id].append("second")
    return StepResult(cursor="done")


@dataclasses.dataclass
class CancelAt(Middleware):
    """Someone cancels the run while the step at cursor is about to run."""

    store: MemoryStore
    cursor: str

    def before_step(self, cp: Checkpoint) -> None:
        if cp.cursor == self.cursor:
            assert self.store.cancel(cp.run_id, "customer left") == RunStatus.RUNNING


def test_a_pending_run_cancelled_never_runs(deps: loop.Deps, store: MemoryStore) -> None:
    run_id = _start(store, "mem-plain")
    assert store.cancel(run_id, "closed") == RunStatus.CANCELLED
    assert loop.run(run_id, deps) == RunStatus.CANCELLED
    assert calls[run_id] == [] and _load(store, run_id).error == "closed"


def test_a_running_run_cancelled_stops_at_the_step_boundary(
    deps: loop.Deps, store: MemoryStore
) -> None:
    run_id = _start(store, "mem-plain")
    cancelling = dataclasses.replace(deps, middleware=Chain([CancelAt(store, "first")]))
    assert loop.run(run_id, cancelling) == RunStatus.CANCELLED
    cp = _load(store, run_id)
    # The step in hand finished and was saved; the next one never ran.
    assert (cp.status, cp.cursor, cp.seq, cp.error) == ("cancelled", "second", 1, "customer left")
    assert calls[run_id] == ["first"]


def test_a_cancelled_run_makes_no_further_effect(deps: loop.Deps, store: MemoryStore) -> None:
    run_id = _start(store, "mem-steps")
    cancelling = dataclasses.replace(deps, middleware=Chain([CancelAt(store, "remember")]))
    assert loop.run(run_id, cancelling) == RunStatus.CANCELLED
    assert not [c for c in calls[run_id] if c[0] == "effect"]  # refused before the effect
    cp = _load(store, run_id)
    assert (cp.cursor, cp.seq) == ("remember", 1)
    assert store.history(run_id)[-1]["outcome"] == "cancelled"


def test_a_waiting_run_cancelled_stops_at_once_and_a_late_signal_wakes_nothing(
    deps: loop.Deps, store: MemoryStore
) -> None:
    run_id = _start(store, "mem-approval")
    assert loop.run(run_id, deps) == RunStatus.WAITING
    assert store.cancel(run_id, "withdrawn") == RunStatus.CANCELLED
    assert store.signal(run_id, "approve", {}, "s-1") == (RunStatus.CANCELLED, True)
    assert loop.run(run_id, deps) == RunStatus.CANCELLED
    assert "outcome" not in _load(store, run_id).state


# -- misbehaving steps -----------------------------------------------------------------
spin = workflow("mem-spin", max_steps=3)


@spin.step()
def again(ctx: Context) -> StepResult:
    return StepResult(cursor="again")


lost = workflow("mem-lost")


@lost.step()
def wander(ctx: Context) -> StepResult:
    if ctx.input.get("db"):
        ctx.db.execute("SELECT 1")
    return StepResult(cursor=ctx.input.get("to", "nowhere"), state={"wandered": True})


def test_a_loop_that_never_ends_stops_at_max_steps(deps: loop.Deps, store: MemoryStore) -> None:
    run_id = _start(store, "mem-spin")
    assert loop.run(run_id, deps) == RunStatus.FAILED
    cp = _load(store, run_id)
    assert cp.seq == 3 and "max_steps=3" in (cp.error or "")


def test_an_unknown_cursor_fails_the_run_and_keeps_the_checkpoint(
    deps: loop.Deps, store: MemoryStore
) -> None:
    run_id = _start(store, "mem-lost")
    assert loop.run(run_id, deps) == RunStatus.FAILED
    cp = _load(store, run_id)
    assert "returned unknown cursor 'nowhere'" in (cp.error or "")
    assert (cp.seq, cp.cursor, cp.state) == (0, START, {})  # never saved: the first step next


def test_ctx_db_says_it_needs_postgres(deps: loop.Deps, store: MemoryStore) -> None:
    run_id = _start(store, "mem-lost", {"db": True, "to": "done"})
    assert loop.run(run_id, deps) == RunStatus.FAILED
    assert "ctx.db needs PgStore (Postgres)" in (_load(store, run_id).error or "")


# -- the model's cost cap --------------------------------------------------------------
class _Model:
    """The two calls Context makes on a model client: a worst case, and a call."""

    def worst_cost(self, **request: Any) -> float:
        return 0.35

    def create(self, **request: Any) -> tuple[Any, float]:
        return {"role": "assistant", "content": "ok"}, 0.2


asker = workflow("mem-asker")


@asker.step()
def consult(ctx: Context) -> StepResult:
    reply = ctx.model(messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    n = ctx.state.get("n", 0) + 1
    return StepResult(
        cursor="done" if n >= 3 else "consult", window=[*ctx.window, reply], state={"n": n}
    )


def test_model_cost_is_counted_and_a_run_stops_before_passing_its_cap(
    deps: loop.Deps, store: MemoryStore
) -> None:
    with_model = dataclasses.replace(deps, model=_Model())
    rich = _start(store, "mem-asker", max_cost_usd=5.0)
    assert loop.run(rich, with_model) == RunStatus.DONE
    assert _load(store, rich).cost_usd == pytest.approx(0.6)
    capped = _start(store, "mem-asker", max_cost_usd=0.5)
    assert loop.run(capped, with_model) == RunStatus.BUDGET_EXCEEDED
    cp = _load(store, capped)
    assert cp.seq == 1 and cp.cost_usd == pytest.approx(0.2)  # the second call could pass 0.5
    assert "over the cap of $0.500000" in (cp.error or "")


# -- leases and fencing ----------------------------------------------------------------
def test_a_held_lease_defers_the_run(
    deps: loop.Deps, store: MemoryStore, leases: MemoryLeases
) -> None:
    run_id = _start(store, "mem-plain")
    other = leases.acquire(run_id, ttl=10)
    assert other is not None
    with pytest.raises(errors.Deferred) as info:
        loop.run(run_id, deps)
    assert info.value.holder == str(other.token)
    assert calls[run_id] == [] and leases.holder(run_id) == other.token
    other.release()
    assert loop.run(run_id, deps) == RunStatus.DONE


def test_a_lease_whose_owner_paused_past_its_ttl_is_taken_over(
    deps: loop.Deps, store: MemoryStore, leases: MemoryLeases, clock: ManualClock
) -> None:
    run_id = _start(store, "mem-plain")
    paused = leases.acquire(run_id, ttl=10)
    assert paused is not None
    clock.advance(10)
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert _load(store, run_id).epoch == paused.epoch + 1
    with pytest.raises(errors.LeaseLost):
        paused.ensure()  # it wakes up and learns before doing anything


# What stops a step's process mid-step, per run: the test moves the clock past the lease's
# TTL and another worker takes the lease (SIGSTOP, then SIGCONT once it is taken).
pauses: dict[str, Any] = {}
paused = workflow("mem-paused")


@paused.step()
def doze(ctx: Context) -> StepResult:
    pauses.pop(ctx.run_id)()
    if ctx.input.get("ask"):
        ctx.model(messages=[{"role": "user", "content": "hi"}], max_tokens=8)
        calls[ctx.run_id].append("asked")
    return StepResult(cursor="done", state={"thought": True})


def _paused_past_its_ttl(
    store: MemoryStore, leases: MemoryLeases, clock: ManualClock, data: dict[str, Any]
) -> tuple[str, list[Any]]:
    run_id = _start(store, "mem-paused", data)
    taken: list[Any] = []

    def pause() -> None:
        clock.advance(SETTINGS.lease_ttl + 1)
        taken.append(leases.acquire(run_id, ttl=SETTINGS.lease_ttl, owner=_other()))

    pauses[run_id] = pause
    return run_id, taken


def _other() -> LeaseToken:
    return dataclasses.replace(LeaseToken.mine(), host="other-host")


def test_a_worker_paused_past_its_ttl_makes_no_model_call_when_it_wakes(
    deps: loop.Deps, store: MemoryStore, leases: MemoryLeases, clock: ManualClock
) -> None:
    run_id, taken = _paused_past_its_ttl(store, leases, clock, {"ask": True})
    with pytest.raises(errors.LeaseLost):
        loop.run(run_id, dataclasses.replace(deps, model=_Model()))
    assert taken[0] is not None and calls[run_id] == []
    assert _load(store, run_id).seq == 0


def test_a_worker_paused_past_its_ttl_does_not_save_before_the_new_owner_claims(
    deps: loop.Deps, store: MemoryStore, leases: MemoryLeases, clock: ManualClock
) -> None:
    # The new owner holds the lease but has not claimed yet: the stored epoch is still the
    # old one's, so only the lease check before the save stops the old owner's write.
    run_id, taken = _paused_past_its_ttl(store, leases, clock, {})
    with pytest.raises(errors.LeaseLost):
        loop.run(run_id, deps)
    cp = _load(store, run_id)
    assert taken[0] is not None and taken[0].epoch == cp.epoch + 1
    assert (cp.seq, cp.state) == (0, {}) and store.history(run_id) == []


def test_a_dead_owner_on_this_host_is_broken_at_once(
    deps: loop.Deps, store: MemoryStore, leases: MemoryLeases
) -> None:
    run_id = _start(store, "mem-plain")
    dead = dataclasses.replace(LeaseToken.mine(), pid=DEAD_PID)
    assert leases.acquire(run_id, ttl=10, owner=dead) is not None
    assert loop.run(run_id, deps) == RunStatus.DONE  # no wait for its TTL


def test_the_claim_fences_the_old_owner_before_the_new_owners_first_save(
    deps: loop.Deps, store: MemoryStore, leases: MemoryLeases
) -> None:
    run_id = _start(store, "mem-plain")
    old = leases.acquire(run_id, ttl=10)
    assert old is not None
    started = store.claim(run_id, old.epoch)  # the old owner started the run...
    assert started is not None
    assert leases.break_dead(run_id, old.token)  # ...and went silent: its lease is gone
    seen: list[str] = []

    class OldOwnerSaves(Middleware):
        """Right after the new owner claimed the run, before its first save."""

        def before_step(self, cp: Checkpoint) -> None:
            if seen:
                return
            late = started.evolve(seq=1, cursor="second", status=RunStatus.RUNNING)
            try:
                store.save(late, started)
                seen.append("applied")
            except errors.StaleWrite:
                seen.append("rejected")

    assert (
        loop.run(run_id, dataclasses.replace(deps, middleware=Chain([OldOwnerSaves()]))) == "done"
    )
    assert seen == ["rejected"]
    assert calls[run_id] == ["first", "second"]


def test_a_run_whose_epoch_counter_was_lost_is_leased_above_its_stored_epoch(
    deps: loop.Deps, store: MemoryStore
) -> None:
    # The store remembers epoch 7; the leases (a Redis without persistence) start at 1.
    run_id = _start(store, "mem-plain")
    assert store.claim(run_id, 7) is not None
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert _load(store, run_id).epoch == 8  # the first lease (epoch 1) was fenced out


def test_a_stopping_worker_hands_the_run_back_at_a_step_boundary(
    deps: loop.Deps, store: MemoryStore, leases: MemoryLeases
) -> None:
    run_id = _start(store, "mem-plain")
    with pytest.raises(errors.HandOff, match="shutting down"):
        loop.run(run_id, dataclasses.replace(deps, stopping=lambda: True))
    assert calls[run_id] == [] and leases.holder(run_id) is None
    assert loop.run(run_id, deps) == RunStatus.DONE


# -- the reaper on the twins -----------------------------------------------------------
def test_the_reaper_sends_again_a_run_whose_worker_died(
    deps: loop.Deps, store: MemoryStore, leases: MemoryLeases, clock: ManualClock
) -> None:
    run_id = _start(store, "mem-oom")
    with pytest.raises(ProcessDied):
        loop.run(run_id, deps)  # the worker died in the step (its lease let go, or expired)
    sent: list[str] = []
    reaper = Reaper(
        store=store, leases=leases, settings=SETTINGS, in_flight=lambda _: 0, send=sent.append
    )
    assert reaper.reap() == 0  # claimed just now: a sign of life
    clock.advance(SETTINGS.lease_ttl)
    assert reaper.reap() == 1 and sent == [run_id]
    assert reaper.reap() == 0 and sent == [run_id]  # one message out per run


# A step that keeps going whatever its calls raise: it catches Exception around each.
greedy = workflow("greedy_step")
STOPPERS: dict[str, Any] = {}  # run id -> what the first call does to the run


@greedy.step()
def keep_going(ctx: Context) -> StepResult:
    for i in range(3):
        try:
            ctx.call(f"send{i}", _send, ctx.run_id, i)
        except Exception:  # noqa: BLE001, S112 (the very pattern the stop must survive)
            continue
    return StepResult(cursor=cairn.DONE)


def _send(run_id: str, i: int) -> int:
    calls[run_id].append(i)
    if i == 0:
        STOPPERS.pop(run_id)()
    return i


def test_a_cancel_is_not_swallowed_by_a_steps_except_exception(
    store: MemoryStore, deps: loop.Deps
) -> None:
    """Cancelled is a StepStopped, not an Exception: the step that catches Exception around
    its calls still stops before its next effect, and the run ends cancelled."""
    run_id = _start(store, "greedy_step")
    STOPPERS[run_id] = lambda: store.cancel(run_id, "stop it")
    assert loop.run(run_id, deps) == RunStatus.CANCELLED
    assert calls[run_id] == [0]  # the second and third sends never happened


def test_a_lost_lease_is_not_swallowed_by_a_steps_except_exception(
    store: MemoryStore, leases: MemoryLeases, clock: ManualClock, deps: loop.Deps
) -> None:
    """A worker paused past its lease inside a call (another took the run meanwhile) makes
    no further call, whatever the step catches: LeaseLost ends the delivery."""
    run_id = _start(store, "greedy_step")

    def paused_past_the_lease() -> None:
        clock.advance(SETTINGS.lease_ttl + 1)
        assert leases.acquire(run_id, SETTINGS.lease_ttl) is not None  # another worker

    STOPPERS[run_id] = paused_past_the_lease
    with pytest.raises(errors.LeaseLost):
        loop.run(run_id, deps)
    assert calls[run_id] == [0]
    assert not isinstance(errors.LeaseLost(run_id, "x"), Exception)
