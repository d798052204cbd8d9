"""The store contract, one suite for every implementation: PgStore on a fresh Postgres
database and the in-memory MemoryStore, every operation of each audience (the loop's, the
operator's: forks, rewinds, replays, resolves, waits; maintenance's; the schedules); the
Redis Leases and MemoryLeases (LangGraph's conformance suite for its savers, in small). A twin that drifts from the real thing
fails here. `-k memory` runs the twins' half, which needs no service.

Time passes through `Backend.elapse`: the twin's clock moves on; in Postgres every stored
timestamp moves back by as much, which is the same thing to every query (they compare
timestamps with now() and with each other only).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import inspect
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from cairn.core.errors import (
    IncompatibleCheckpoint,
    InvalidInput,
    LeaseLost,
    RunIdConflict,
    RunNotStopped,
    StaleWrite,
    StoreError,
    UnknownRun,
    WaitTimedOut,
)
from cairn.core.records import Attempt, Call, Checkpoint, Recorded, Run, RunFilter, Wait
from cairn.core.status import STOPPED, RunStatus
from cairn.store.contract import CheckpointStore, HeldLease, LeaseManager, Schedules
from cairn.store.lease import LeaseToken
from cairn.store.schedules import Schedule
from cairn.testing import ManualClock, MemoryLease, MemoryLeases, MemorySchedules, MemoryStore
from tests.helpers.contract import contract_methods
from tests.helpers.holds import Racer, held_inside
from tests.helpers.runs import wait_for
from tests.helpers.services import PGBOUNCER_PORT

# Every timestamp Postgres stores, by table: moved back by the seconds that pass.
_TIMESTAMPS = {
    "runs": ("created_at",),
    "checkpoints": ("updated_at", "created_at", "retry_at", "wait_until"),
    "signals": ("created_at",),
    "step_history": ("started_at", "ended_at", "run_created"),  # run_created: the run's
    "journal": ("created_at", "run_created"),
    "effects": ("created_at",),
}


@dataclasses.dataclass(frozen=True)
class Backend:
    """A store under test, and how to let time pass for it."""

    store: CheckpointStore
    elapse: Callable[[float], None]


@pytest.fixture(params=["memory", "pg"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "memory":
        clock = ManualClock()
        return Backend(MemoryStore(clock), clock.advance)
    sql = request.getfixturevalue("sql")

    def elapse(seconds: float) -> None:
        for table, columns in _TIMESTAMPS.items():
            moved = ", ".join(f"{c} = {c} - make_interval(secs => %s)" for c in columns)
            sql(f"UPDATE {table} SET {moved}", *[seconds] * len(columns))

    return Backend(request.getfixturevalue("store"), elapse)


@pytest.fixture
def any_store(backend: Backend) -> CheckpointStore:
    return backend.store


def _new(store: CheckpointStore, run_id: str = "r1", workflow: str = "probe") -> Checkpoint:
    assert store.create_run(run_id, workflow, {"x": 1}, "one") is True
    cp = store.load(run_id)
    assert cp is not None
    return cp


def _load(store: CheckpointStore, run_id: str) -> Checkpoint:
    cp = store.load(run_id)
    assert cp is not None
    return cp


def _get(store: CheckpointStore, run_id: str) -> Run:
    run = store.get(run_id)
    assert run is not None
    return run


def _advance(cp: Checkpoint, **changes: Any) -> Checkpoint:
    """cp's next step, saved by the same writer (running unless changes say otherwise)."""
    return dataclasses.replace(cp, **{"seq": cp.seq + 1, "status": RunStatus.RUNNING, **changes})


def _running(store: CheckpointStore, run_id: str = "r1", epoch: int = 1) -> Checkpoint:
    """A run a worker claimed at epoch and saved one step of (cursor "two")."""
    _new(store, run_id)
    claimed = store.claim(run_id, epoch)
    assert claimed is not None
    cp = _advance(claimed, cursor="two", visits={"one": 1})
    store.save(cp, claimed)
    return cp


def _msg(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# -- runs ------------------------------------------------------------------------------
def test_a_new_run_loads_at_seq_zero_with_its_input(any_store: CheckpointStore) -> None:
    any_store.create_run("r1", "probe", {"x": [1, "y"]}, "one", max_cost_usd=2.5)
    cp = any_store.load("r1")
    assert cp is not None
    assert (cp.run_id, cp.workflow, cp.input, cp.seq) == ("r1", "probe", {"x": [1, "y"]}, 0)
    assert (cp.cursor, cp.status, cp.state, cp.visits, cp.window) == ("one", "pending", {}, {}, ())
    assert (cp.win_start, cp.epoch, cp.resumes, cp.cost_usd, cp.error) == (0, 0, 0, 0.0, None)
    assert (cp.max_cost_usd, cp.attempts, cp.deliveries, cp.cancel_reason) == (2.5, 0, 0, None)
    assert (cp.signal, cp.wait_over, cp.flow_version) == (None, False, None)
    run = _get(any_store, "r1")
    assert (run.status, run.cursor, run.seq, run.error) == ("pending", "one", 0, None)
    assert (run.input, run.state, run.window) == ({"x": [1, "y"]}, {}, None)
    assert run.created_at.tzinfo is not None and run.updated_at >= run.created_at


def test_an_unknown_run_is_none_everywhere(any_store: CheckpointStore) -> None:
    ghost = Checkpoint(
        run_id="nope", workflow="probe", input={}, seq=0, cursor="one", state={}, visits={},
        window=(), win_start=0, cost_usd=0.0,
    )  # fmt: skip
    assert any_store.load("nope") is None and any_store.get("nope") is None
    assert any_store.claim("nope", 1) is None
    assert any_store.cancel("nope", "x") is None and any_store.cancel_reason("nope") is None
    assert any_store.signal("nope", "e", {}, "s1") is None
    assert any_store.history("nope") == []
    assert any_store.end_attempt(ghost, RunStatus.FAILED, "x", Attempt(started=0.0)) is None
    assert any_store.mark_unreadable("nope", RunStatus.FAILED, "x") is False
    assert any_store.mark_failed(ghost, "x") is False
    with pytest.raises(StoreError):  # the checkpoint's foreign key: no run, no checkpoint
        any_store.save(_advance(ghost), ghost)
    assert any_store.load("nope") is None


def test_create_is_idempotent_and_never_restarts(any_store: CheckpointStore) -> None:
    cp = _new(any_store)
    any_store.save(_advance(cp, cursor="two", state={"a": 1}), cp)
    assert any_store.create_run("r1", "probe", {"x": 1}, "one") is False
    with pytest.raises(RunIdConflict, match="another input"):
        any_store.create_run("r1", "probe", {"x": 2})
    with pytest.raises(RunIdConflict, match="another workflow"):
        any_store.create_run("r1", "other", {"x": 1})
    again = any_store.load("r1")
    assert again is not None and (again.seq, again.cursor, again.state) == (1, "two", {"a": 1})
    # The same input with its keys in another order is the same run (jsonb equality).
    any_store.create_run("r2", "probe", {"a": 1, "b": {"c": 2, "d": 3}})
    assert any_store.create_run("r2", "probe", {"b": {"d": 3, "c": 2}, "a": 1}) is False


@pytest.mark.parametrize("stopped", [RunStatus.FAILED, RunStatus.INCOMPATIBLE])
def test_enqueueing_a_failed_or_incompatible_run_again_rearms_it(
    any_store: CheckpointStore, stopped: RunStatus
) -> None:
    cp = _running(any_store)
    any_store.end_attempt(cp, RunStatus.RUNNING, "E", Attempt(started=time.time()), retry_in=60)
    assert any_store.end_attempt(cp, stopped, "broken", Attempt(started=time.time())) is not None
    failed = any_store.load("r1")
    assert failed is not None and failed.status == stopped and failed.attempts >= 1
    assert any_store.create_run("r1", "probe", {"x": 1}) is False
    rearmed = any_store.load("r1")
    assert rearmed is not None
    assert (rearmed.status, rearmed.error) == (RunStatus.PENDING, None)
    assert (rearmed.attempts, rearmed.deliveries) == (0, 0)  # its retries counted afresh
    assert (rearmed.seq, rearmed.cursor, rearmed.epoch) == (cp.seq, "two", 1)  # at its cursor


@pytest.mark.parametrize("ended", [RunStatus.DONE, RunStatus.CANCELLED, RunStatus.BUDGET_EXCEEDED])
def test_enqueueing_an_ended_run_again_leaves_it_ended(
    any_store: CheckpointStore, ended: RunStatus
) -> None:
    cp = _running(any_store)
    any_store.save(_advance(cp, status=ended, cursor="done"), cp)
    assert any_store.create_run("r1", "probe", {"x": 1}) is False
    assert _get(any_store, "r1").status == ended


# -- the guard -------------------------------------------------------------------------
def test_an_older_writer_is_rejected_and_the_row_not_rewound(any_store: CheckpointStore) -> None:
    cp = _new(any_store)
    a = _advance(cp, cursor="two", state={"by": "a"}, window=(_msg("a"),))
    b = _advance(a, cursor="three", state={"by": "b"})
    any_store.save(a, cp)
    any_store.save(b, a)
    with pytest.raises(StaleWrite):
        any_store.save(a, cp)  # the older writer replays its seq-1 save
    with pytest.raises(StaleWrite):
        any_store.save(dataclasses.replace(b, cursor="twin"), a)  # the same seq twice
    now = any_store.load("r1")
    assert now is not None and (now.seq, now.cursor, now.state) == (2, "three", {"by": "b"})
    assert now.window == (_msg("a"),)
    assert [h["seq"] for h in any_store.history("r1")] == [0, 1]  # rejected saves left no row


def test_a_fenced_epoch_cannot_save_even_with_a_higher_seq(any_store: CheckpointStore) -> None:
    cp = _new(any_store)
    zombie = _advance(cp, epoch=1)
    any_store.save(zombie, cp)
    assert any_store.claim("r1", 2) is not None  # a new owner fences the run at epoch 2
    with pytest.raises(StaleWrite):
        any_store.save(_advance(zombie, cursor="evil", window=(_msg("evil"),)), zombie)
    now = any_store.load("r1")
    assert now is not None and (now.cursor, now.seq, now.epoch, now.window) == ("one", 1, 2, ())
    assert any_store.claim("r1", 2) is None, "a claim must not go back or sideways"
    assert any_store.claim("r1", 1) is None


@hsettings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.tuples(st.sampled_from("ab"), st.integers(1, 6), st.integers(0, 3)), max_size=10)
)
def test_any_interleaving_leaves_the_newest_accepted_write(
    any_store: CheckpointStore, writes: list[tuple[str, int, int]]
) -> None:
    base = _new(any_store, f"r-{uuid.uuid4().hex[:8]}")
    accepted = base
    for writer, seq, epoch in writes:
        cp = dataclasses.replace(base, seq=seq, epoch=epoch, cursor=f"{writer}{seq}.{epoch}")
        try:
            any_store.save(cp, base)
            assert seq > accepted.seq and epoch >= accepted.epoch
            accepted = cp
        except StaleWrite:
            assert not (seq > accepted.seq and epoch >= accepted.epoch)
    now = any_store.load(base.run_id)
    assert now is not None
    assert (now.seq, now.epoch, now.cursor) == (accepted.seq, accepted.epoch, accepted.cursor)


# -- the claim -------------------------------------------------------------------------
def test_a_claim_fences_counts_a_delivery_and_a_save_resets_the_count(
    any_store: CheckpointStore,
) -> None:
    _new(any_store)
    first = any_store.claim("r1", 1)
    assert first is not None and (first.epoch, first.deliveries, first.status) == (1, 1, "pending")
    second = any_store.claim("r1", 3)
    assert second is not None and (second.epoch, second.deliveries) == (3, 2)
    assert second.updated_at is not None and first.updated_at is not None
    assert second.updated_at > first.updated_at  # a claim is a sign of life
    saved = _advance(second)
    any_store.save(saved, second)
    after = any_store.load("r1")
    assert after is not None and (after.deliveries, after.attempts, after.epoch) == (0, 0, 3)


def test_an_unclaimed_delivery_is_not_counted_and_holds_the_reaper_off(backend: Backend) -> None:
    """A worker that gives a run back for a key it lacks (unclaim): its claim counts no
    delivery toward poison, and the reaper leaves the run alone for the hold while the
    worker sends it again itself; a waiting run's claim counted none to give back."""
    store = backend.store
    _new(store)
    assert store.claim("r1", 1) is not None
    store.unclaim("r1", 1, 60)
    store.unclaim("r1", 0, 60)  # an older epoch's: fenced, nothing changes
    assert _load(store, "r1").deliveries == 0
    backend.elapse(30)
    assert _stalled(store, running_after=1) == []
    backend.elapse(31.5)  # the hold is over by more than running_after
    assert [r["run_id"] for r in _stalled(store, running_after=1)] == ["r1"]
    cp = _running(store, "w")
    _wait(store, cp, Wait(event="paid"))
    store.signal("w", "paid", {}, "s-1")
    assert store.claim("w", 5) is not None
    store.unclaim("w", 5, 60)
    assert _load(store, "w").deliveries == 0  # a waiting run's claim counted none
    backend.elapse(30)
    assert "w" not in {r["run_id"] for r in _stalled(store, running_after=1)}
    backend.elapse(31.5)
    assert "w" in {r["run_id"] for r in _stalled(store, running_after=1)}


def test_a_claim_of_a_waiting_run_is_not_a_delivery(any_store: CheckpointStore) -> None:
    cp = _running(any_store)
    waiting = _advance(cp, status=RunStatus.WAITING, cursor="settle")
    any_store.save(waiting, cp, wait=Wait(event="paid"))
    woken = any_store.claim("r1", 2)
    assert woken is not None and (woken.status, woken.deliveries, woken.epoch) == ("waiting", 0, 2)


@pytest.mark.parametrize("status", sorted(STOPPED))
def test_a_claim_leaves_a_stopped_run_as_it_is(
    any_store: CheckpointStore, status: RunStatus
) -> None:
    # The worker claims before it reads: a finished run delivered again must not look
    # alive (updated_at), count a delivery, or take the new epoch.
    cp = _running(any_store)
    if status == RunStatus.DONE:
        any_store.save(_advance(cp, status=status, cursor="done"), cp)
    else:
        any_store.end_attempt(cp, status, "stopped", Attempt(started=time.time()))
    before = any_store.load("r1")
    assert before is not None and before.status == status
    assert any_store.claim("r1", 5) is None
    assert any_store.load("r1") == before  # updated_at, deliveries and epoch included


# -- end_attempt -----------------------------------------------------------------------
def test_a_retry_is_counted_fenced_and_recorded(any_store: CheckpointStore) -> None:
    cp = _running(any_store)
    attempt = Attempt(started=time.time(), worker="h:1:n", effect_key="cairn:r1:two:0")
    assert any_store.end_attempt(cp, RunStatus.RUNNING, "Transient: 503", attempt, retry_in=5) == 1
    assert any_store.end_attempt(cp, RunStatus.RUNNING, "Transient: 429", attempt, retry_in=9) == 2
    now = any_store.load("r1")
    assert now is not None
    assert (now.status, now.attempts, now.error, now.seq) == ("running", 2, "Transient: 429", 1)
    retries = any_store.history("r1")[1:]
    assert [(h["seq"], h["cursor"], h["visit"], h["outcome"]) for h in retries] == [
        (1, "two", 0, "retry"),
        (1, "two", 0, "retry"),
    ]
    assert [h["error"] for h in retries] == ["Transient: 503", "Transient: 429"]
    recorded = {(h["worker"], h["effect_key"], h["epoch"], h["cost_usd"]) for h in retries}
    assert recorded == {("h:1:n", "cairn:r1:two:0", 1, 0)}
    # A new owner fences the old one out: its attempt is not recorded.
    assert any_store.claim("r1", 2) is not None
    assert any_store.end_attempt(cp, RunStatus.RUNNING, "late", attempt, retry_in=1) is None
    # Nor is one at another seq.
    at_two = dataclasses.replace(cp, epoch=2)
    assert any_store.end_attempt(_advance(at_two), RunStatus.FAILED, "x", attempt) is None
    assert _load(any_store, "r1").attempts == 2
    assert len(any_store.history("r1")) == 3
    # A save of the step resets the count.
    any_store.save(_advance(at_two, cursor="three"), at_two)
    assert _load(any_store, "r1").attempts == 0


# -- code versions ---------------------------------------------------------------------
def test_a_run_keeps_the_version_that_started_it_and_each_step_the_one_that_wrote_it(
    any_store: CheckpointStore,
) -> None:
    _new(any_store)
    assert _get(any_store, "r1").started_version is None  # no worker has claimed it yet
    claimed = any_store.claim("r1", 1, "v1")
    assert claimed is not None
    one = _advance(claimed, cursor="two", visits={"one": 1})
    any_store.save(one, claimed, attempt=Attempt(started=time.time(), code_version="v1"))
    # The new code's worker takes the run over: it started on v1 all the same, and the
    # history says which code wrote each row, a retry's too.
    again = any_store.claim("r1", 2, "v2")
    assert again is not None
    v2 = Attempt(started=time.time(), code_version="v2")
    any_store.end_attempt(again, RunStatus.RUNNING, "Transient: 503", v2, retry_in=0)
    any_store.save(_advance(again, cursor="three"), again, attempt=v2)
    assert _get(any_store, "r1").started_version == "v1"
    assert [h["code_version"] for h in any_store.history("r1")] == ["v1", "v2", "v2"]
    assert [r.started_version for r in any_store.list_runs()] == ["v1"]
    listed = any_store.list_runs(RunFilter(status=RunStatus.RUNNING))
    assert [r.started_version for r in listed] == ["v1"]
    # A fork starts on the code of the first worker that claims it.
    assert any_store.fork("r1", 2, "f1") is True
    assert _get(any_store, "f1").started_version is None
    assert any_store.claim("f1", 1, "v3") is not None
    assert [f.started_version for f in any_store.forks("r1")] == ["v3"]
    assert any_store.history("f1")[-1]["code_version"] is None  # the fork's mark: no worker's
    # A run first claimed by a worker that stated no version (one from before versions)
    # is not stamped later by one that does: its start stays unknown.
    _new(any_store, "r2")
    assert any_store.claim("r2", 1) is not None
    assert any_store.claim("r2", 2, "v2") is not None
    assert _get(any_store, "r2").started_version is None


def test_a_pinned_run_is_claimed_only_under_the_version_that_started_it(
    any_store: CheckpointStore,
) -> None:
    _new(any_store, "p1", workflow="kept")
    _new(any_store, "u1", workflow="moved")
    # The first claim pins the run when its workflow is among the worker's pinned ones.
    claimed = any_store.claim("p1", 1, "v1", ["kept"])
    assert claimed is not None and claimed.pinned_to == "v1"
    assert any_store.claim("u1", 1, "v1", ["kept"]) is not None
    assert any_store.routes(["p1", "u1", "nope"]) == {"p1": "v1"}
    # Another version's claim takes nothing and changes nothing: the fence stays at 1.
    assert any_store.claim("p1", 5, "v2", ["kept"]) is None
    assert _load(any_store, "p1").epoch == 1
    assert _load(any_store, "p1").pinned_to == "v1"
    assert any_store.claim("p1", 6, "v1") is not None  # v1's claims go on
    moved = any_store.claim("u1", 2, "v2", ["kept"])  # an unpinned run: any version
    assert moved is not None and moved.pinned_to is None
    assert any_store.pinned_runs() == {"v1": (1, 0)}
    last = _load(any_store, "p1")
    any_store.save(_advance(last, cursor="done", status=RunStatus.DONE), last)
    assert any_store.pinned_runs() == {}


def test_only_failures_and_retries_count_as_attempts(any_store: CheckpointStore) -> None:
    cp = _running(any_store)
    assert any_store.end_attempt(cp, RunStatus.CANCELLED, "stop", Attempt(started=time.time())) == 0
    assert any_store.history("r1")[-1]["outcome"] == "cancelled"
    other = _running(any_store, "r2")
    assert any_store.end_attempt(other, RunStatus.FAILED, "x" * 5000, Attempt(started=0.0)) == 1
    failed = any_store.get("r2")
    assert failed is not None and failed.status == "failed" and failed.error == "x" * 4000
    # Without an attempt (no step ran) nothing is counted and no history row is written.
    third = _running(any_store, "r3")
    assert any_store.end_attempt(third, RunStatus.FAILED, "poison") == 0
    assert [h["outcome"] for h in any_store.history("r3")] == ["saved"]


def test_a_done_run_cannot_be_ended_again(any_store: CheckpointStore) -> None:
    cp = _running(any_store)
    done = _advance(cp, status=RunStatus.DONE, cursor="done")
    any_store.save(done, cp)
    assert any_store.end_attempt(done, RunStatus.FAILED, "late", Attempt(started=0.0)) is None
    assert any_store.mark_failed(done, "late") is False
    assert any_store.mark_unreadable("r1", RunStatus.FAILED, "late") is False
    assert _get(any_store, "r1").status == "done"


def test_mark_failed_keeps_the_checkpoint_and_mark_unreadable_ignores_its_seq(
    any_store: CheckpointStore,
) -> None:
    cp = _running(any_store)
    assert any_store.mark_failed(cp, "boom") is True
    now = any_store.load("r1")
    assert now is not None and (now.status, now.error) == ("failed", "boom")
    assert (now.seq, now.cursor, now.visits) == (cp.seq, "two", cp.visits)
    _running(any_store, "r2")
    assert any_store.mark_unreadable("r2", RunStatus.INCOMPATIBLE, "version 7") is True
    assert _get(any_store, "r2").status == "incompatible"


def test_a_checkpoint_of_another_version_is_refused_fenced_and_rearmed(
    any_store: CheckpointStore,
) -> None:
    cp = _running(any_store)
    any_store.save(_advance(cp, version=7), cp)
    with pytest.raises(IncompatibleCheckpoint) as info:
        any_store.load("r1")
    assert info.value.found == 7
    with pytest.raises(IncompatibleCheckpoint):
        any_store.claim("r1", 5)  # fenced first, then refused when read
    assert any_store.claim("r1", 5) is None  # the fence held
    assert any_store.mark_unreadable("r1", RunStatus.INCOMPATIBLE, "version 7") is True
    assert _get(any_store, "r1").status == "incompatible"
    assert any_store.create_run("r1", "probe", {"x": 1}) is False
    assert _get(any_store, "r1").status == "pending"


# -- the window ------------------------------------------------------------------------
def test_window_appends_load_back_exactly(any_store: CheckpointStore) -> None:
    cp = _new(any_store)
    window: tuple[dict[str, Any], ...] = ()
    for i in range(12):
        if i % 3:  # steps that leave the window alone in between
            window = (*window, {"role": "user", "content": [{"type": "text", "text": f"m{i}"}]})
        nxt = _advance(cp, window=window, state={"i": i})
        any_store.save(nxt, cp)
        cp = nxt
    loaded = any_store.load("r1")
    assert loaded is not None and loaded.window == window and loaded.win_start == 0
    assert (loaded.win_end, loaded.state) == (len(window), {"i": 11})


def test_a_rewritten_window_is_a_fresh_range_and_appends_go_on_after_it(
    any_store: CheckpointStore,
) -> None:
    cp = _new(any_store)
    long = tuple(_msg(f"m{i}") for i in range(5))
    a = _advance(cp, window=long)
    any_store.save(a, cp)
    compacted = (_msg("summary"), long[-1])
    b = _advance(a, window=compacted, win_start=a.win_end)
    any_store.save(b, a)
    c = _advance(b, window=(*compacted, _msg("after")))
    any_store.save(c, b)
    loaded = any_store.load("r1")
    assert loaded is not None and loaded.window == c.window
    assert (loaded.win_start, loaded.win_end) == (5, 8)


def test_a_rejected_save_writes_no_window_message(any_store: CheckpointStore) -> None:
    cp = _new(any_store)
    first = _advance(cp, window=(_msg("hi"),))
    any_store.save(first, cp)
    with pytest.raises(StaleWrite):
        any_store.save(_advance(cp, window=(_msg("zombie"),)), cp)  # would write index 0
    grown = _advance(first, window=(_msg("hi"), _msg("there")))
    any_store.save(grown, first)
    assert _load(any_store, "r1").window == (_msg("hi"), _msg("there"))


def test_what_a_caller_keeps_of_a_saved_or_loaded_checkpoint_is_its_own(
    any_store: CheckpointStore,
) -> None:
    cp = _new(any_store)
    state: dict[str, Any] = {"items": [1]}
    message = _msg("hi")
    nxt = _advance(cp, state=state, window=(message,))
    any_store.save(nxt, cp)
    state["items"].append(2)  # edited after the save: not what was saved
    message["content"] = "changed"
    loaded = any_store.load("r1")
    assert loaded is not None and loaded.state == {"items": [1]}
    assert loaded.window == (_msg("hi"),)
    loaded.state["items"].append(3)
    assert _load(any_store, "r1").state == {"items": [1]}


# -- waits and signals -----------------------------------------------------------------
def _wait(store: CheckpointStore, cp: Checkpoint, wait: Wait, **changes: Any) -> Any:
    nxt = _advance(cp, status=RunStatus.WAITING, cursor="settle", **changes)
    return nxt, store.save(nxt, cp, wait=wait)


def test_a_signal_sent_before_the_wait_is_found_by_it(any_store: CheckpointStore) -> None:
    cp = _running(any_store)
    assert any_store.signal("r1", "paid", {"n": 1}, "s-b") == ("running", True)
    assert any_store.signal("r1", "paid", {"n": 1}, "s-b") == ("running", False)  # one signal
    assert any_store.signal("r1", "paid", {"n": 2}, "s-a") == ("running", True)
    assert any_store.signal("r1", "other", {}, "s-0") == ("running", True)
    assert _load(any_store, "r1").signal is None  # not waiting
    _, saved = _wait(any_store, cp, Wait(event="paid", timeout=60, on_timeout="late"))
    assert saved.signalled is True and saved.cancel_reason is None
    loaded = any_store.load("r1")
    assert loaded is not None and loaded.status == "waiting"
    assert (loaded.wait_event, loaded.wait_timeout_cursor) == ("paid", "late")
    assert loaded.signal == {"id": "s-b", "payload": {"n": 1}}  # the oldest, not the least id
    woken = any_store.claim("r1", 2)
    assert woken is not None and woken.signal == loaded.signal
    # The step that received s-b consumes it with its save; s-a is next.
    nxt = _advance(dataclasses.replace(woken, epoch=2), status=RunStatus.WAITING)
    saved = any_store.save(
        nxt, woken, attempt=Attempt(started=0.0, signal_id="s-b"), wait=Wait(event="paid")
    )
    assert saved.signalled is True  # s-a was already there
    assert _load(any_store, "r1").signal == {"id": "s-a", "payload": {"n": 2}}
    last = _advance(nxt, status=RunStatus.WAITING)
    saved = any_store.save(
        last, nxt, attempt=Attempt(started=0.0, signal_id="s-a"), wait=Wait(event="paid")
    )
    assert saved.signalled is False
    assert _load(any_store, "r1").signal is None


def test_a_signal_sent_after_the_wait_reaches_it(any_store: CheckpointStore) -> None:
    cp = _running(any_store)
    _, saved = _wait(any_store, cp, Wait(event="paid"))
    assert saved.signalled is False
    assert any_store.signal("r1", "other", {}, "s-0") == ("waiting", True)
    assert _load(any_store, "r1").signal is None  # another event
    assert any_store.signal("r1", "paid", {"amount": 42}, "s-1") == ("waiting", True)
    assert _load(any_store, "r1").signal == {"id": "s-1", "payload": {"amount": 42}}


def test_a_wait_is_over_when_its_timeout_passes(backend: Backend) -> None:
    store = backend.store
    cp = _running(store)
    _wait(store, cp, Wait(event="paid", timeout=60))
    _running(store, "r2")
    _wait(store, _load(store, "r2"), Wait(event="paid"))  # no timeout
    backend.elapse(59)
    assert _load(store, "r1").wait_over is False
    backend.elapse(1)  # its timeout, to the second
    assert _load(store, "r1").wait_over is True
    backend.elapse(10 * 365 * 86400)
    assert _load(store, "r2").wait_over is False


# -- cancel ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "after"),
    [(RunStatus.PENDING, RunStatus.CANCELLED), (RunStatus.WAITING, RunStatus.CANCELLED)],
)
def test_a_run_no_worker_holds_is_cancelled_at_once(
    any_store: CheckpointStore, status: RunStatus, after: RunStatus
) -> None:
    cp = _new(any_store)
    if status == RunStatus.WAITING:
        _wait(any_store, cp, Wait(event="paid"))
    assert any_store.cancel("r1", "closed") == after
    run = any_store.get("r1")
    assert run is not None and (run.status, run.error) == (after, "closed")
    assert any_store.cancel_reason("r1") == "closed"
    assert any_store.cancel("r1", "again") is None  # it has stopped: nothing to ask


def test_a_running_run_is_asked_to_stop_and_its_next_save_hears_it(
    any_store: CheckpointStore,
) -> None:
    cp = _running(any_store)
    assert any_store.cancel("r1", "first reason") == "running"
    assert any_store.cancel("r1", "second reason") == "running"
    run = any_store.get("r1")
    assert run is not None and (run.status, run.error) == ("running", None)
    assert any_store.cancel_reason("r1") == "first reason"  # the first reason stays
    saved = any_store.save(_advance(cp), cp)
    assert saved.cancel_reason == "first reason"


def test_an_ended_run_cannot_be_cancelled(any_store: CheckpointStore) -> None:
    cp = _running(any_store)
    any_store.save(_advance(cp, status=RunStatus.DONE, cursor="done"), cp)
    assert any_store.cancel("r1", "late") is None
    assert any_store.cancel_reason("r1") is None and _get(any_store, "r1").status == "done"


# -- the ledger and the history --------------------------------------------------------
def test_the_ledger_keeps_the_first_result(any_store: CheckpointStore) -> None:
    cp = _running(any_store, epoch=3)
    assert any_store.was_done("k") == (False, None)
    assert any_store.mark_done(cp, "k", {"id": 7})
    assert any_store.claim("r1", 4) is not None
    at_four = dataclasses.replace(cp, epoch=4)
    assert any_store.mark_done(at_four, "k", {"id": 8})  # first write wins
    assert any_store.was_done("k") == (True, {"id": 7})
    assert any_store.mark_done(at_four, "k2", None)
    assert any_store.was_done("k2") == (True, None)  # a recorded None is not "not done"


def test_a_done_mark_is_fenced_like_every_write_of_a_step(any_store: CheckpointStore) -> None:
    cp = _running(any_store, epoch=1)
    assert any_store.claim("r1", 2) is not None
    assert not any_store.mark_done(cp, "k", {"by": "zombie"})  # the old owner: fenced
    assert any_store.was_done("k") == (False, None)
    at_two = dataclasses.replace(cp, epoch=2)
    assert not any_store.mark_done(dataclasses.replace(at_two, seq=cp.seq + 1), "k", 1)
    assert any_store.mark_done(at_two, "k", {"by": "owner"})
    assert any_store.was_done("k") == (True, {"by": "owner"})


def test_each_save_writes_one_history_row(any_store: CheckpointStore) -> None:
    cp = _new(any_store)
    started = time.time() - 2.0
    attempt = Attempt(started=started, worker="host:7:abc", effect_key="cairn:r1:one:0")
    nxt = _advance(cp, cursor="two", visits={"one": 1}, cost_usd=0.25, epoch=4)
    any_store.save(nxt, cp, attempt=attempt)
    any_store.save(_advance(nxt, cursor="done", cost_usd=0.75), nxt)
    first, second = any_store.history("r1")
    assert (first["seq"], first["cursor"], first["visit"]) == (0, "one", 0)  # where it began
    assert first["outcome"] == "saved"
    assert (first["worker"], first["epoch"], first["cost_usd"]) == ("host:7:abc", 4, 0.25)
    assert (first["effect_key"], first["error"]) == ("cairn:r1:one:0", None)
    assert abs(first["started_at"].timestamp() - started) < 0.01
    assert first["ended_at"] >= first["started_at"]
    assert (second["seq"], second["cursor"], second["visit"]) == (1, "two", 0)
    assert second["cost_usd"] == 0.5  # each row costs its own step


# -- the Client's queries --------------------------------------------------------------
def test_runs_are_listed_newest_first_a_keyset_page_at_a_time(backend: Backend) -> None:
    store = backend.store
    for i in range(6):
        cp = _new(store, f"r{i}", "probe" if i % 3 else "other")
        if i % 2:
            store.end_attempt(cp, RunStatus.FAILED, "x")
        backend.elapse(1)

    def ids(**which: Any) -> list[str]:
        return [r.run_id for r in store.list_runs(RunFilter(**which))]

    everything = ids(limit=100)
    assert (
        everything == ["r5", "r4", "r3", "r2", "r1", "r0"] == [r.run_id for r in store.list_runs()]
    )
    page1 = ids(limit=4)
    assert page1 + ids(limit=4, after=page1[-1]) == everything
    assert ids(status=RunStatus.FAILED) == ["r5", "r3", "r1"]
    failed1 = ids(status=RunStatus.FAILED, limit=2)
    failed2 = ids(status=RunStatus.FAILED, limit=2, after=failed1[-1])
    assert failed1 + failed2 == ["r5", "r3", "r1"]
    assert ids(workflow="other") == ["r3", "r0"]
    assert ids(status=RunStatus.PENDING, workflow="probe") == ["r4", "r2"]
    assert ids(status=RunStatus.RUNNING) == []
    middle = store.get("r3")
    assert middle is not None
    assert ids(since=middle.created_at) == ["r5", "r4", "r3"]
    assert ids(until=middle.created_at) == ["r2", "r1", "r0"]
    assert ids(after="no-such-run") == []
    listed = store.list_runs(RunFilter(limit=1))[0]
    assert (listed.status, listed.cursor) == ("failed", "one")
    assert listed.input is None and listed.state is None  # a list shows no payloads


def test_counts_follow_every_transition(any_store: CheckpointStore) -> None:
    def counts() -> dict[str, int]:
        return {status: int(row["n"]) for status, row in any_store.counts().items()}

    assert counts() == {}
    for run_id in ("a", "b", "c", "d", "e"):
        _new(any_store, run_id)
    assert counts() == {"pending": 5}
    a = any_store.claim("a", 1)
    assert a is not None
    any_store.save(_advance(a), a)
    b = _running(any_store, "f")
    any_store.save(_advance(b, status=RunStatus.DONE, cursor="done"), b)
    any_store.cancel("b", "no")
    c = any_store.load("c")
    assert c is not None
    _wait(any_store, c, Wait(event="x"))
    d = any_store.load("d")
    assert d is not None
    any_store.end_attempt(d, RunStatus.FAILED, "x")
    expected = {"pending": 1, "running": 1, "done": 1, "cancelled": 1, "waiting": 1, "failed": 1}
    assert counts() == expected
    any_store.create_run("d", "probe", {"x": 1})  # re-armed
    expected["pending"] = 2
    del expected["failed"]
    assert counts() == expected
    assert any_store.fold_counts() >= 0
    assert counts() == expected  # folding changes no total


# -- the reaper's and the sweep's queries ----------------------------------------------
def test_the_reapers_second_look_drops_runs_a_worker_touched_since_it_listed_them(
    backend: Backend,
) -> None:
    """The reaper lists runs, then checks their leases: a run taken, run and released in
    between has no lease either. Only runs as they were listed may be sent again."""
    store = backend.store
    for run_id in ("idle", "claimed", "finished", "taken"):
        _new(store, run_id)
    backend.elapse(60)
    cp = store.claim("claimed", 1)
    assert cp is not None
    store.save(_advance(cp, cursor="two"), cp)  # claimed and saved: stalled again later
    finished = store.claim("finished", 1)
    assert finished is not None
    backend.elapse(60)
    listed = _stalled(store, running_after=1)
    # Never-taken runs are not walked: their messages are the broker's (unclaimed).
    assert {r["run_id"] for r in listed} == {"claimed", "finished"}
    assert {r["run_id"]: (r["status"], r["epoch"]) for r in listed} == {
        "claimed": ("running", 1),
        "finished": ("pending", 1),  # claimed by a worker that may have died in its step
    }
    unclaimed = store.unclaimed(older_than=90)
    assert [r["run_id"] for r in unclaimed] == ["idle", "taken"]  # oldest first
    assert [r["run_id"] for r in store.unclaimed(older_than=90, limit=1)] == ["idle"]
    first = unclaimed[0]
    after = (first["created_at"], first["run_id"])
    assert [r["run_id"] for r in store.unclaimed(older_than=90, after=after)] == ["taken"]
    assert store.unclaimed(older_than=200) == []
    assert store.unclaimed_count(older_than=90, upto=10) == 2
    assert store.unclaimed_count(older_than=90, upto=1) == 1  # counted no further
    assert store.unclaimed_count(older_than=200, upto=10) == 0
    # "finished" is pending too, but a worker claimed it (its epoch): not unclaimed.
    assert [r["run_id"] for r in store.unclaimed(older_than=30)] == ["idle", "taken"]
    # Meanwhile a worker ends one run and takes another (a claim is a sign of life).
    store.save(_advance(finished, cursor="done", status=RunStatus.DONE), finished)
    assert store.claim("taken", 1) is not None
    assert "taken" not in {r["run_id"] for r in _stalled(store, running_after=1)}
    assert store.unchanged(listed) == {"claimed"}
    assert store.unchanged(unclaimed) == {"idle"}
    assert store.unchanged([]) == set()


def _stalled(store: CheckpointStore, running_after: float, limit: int = 500) -> list[dict]:
    """Every page of the reaper's walk, each at most limit runs, in run_id order."""
    found: list[dict] = []
    after: str | None = ""
    while after is not None:
        rows, after = store.stalled(running_after, after=after, limit=limit)
        assert len(rows) <= limit
        found += rows
    return found


def test_the_reapers_walk_pages_in_run_id_order_and_skips_runs_never_taken(
    backend: Backend,
) -> None:
    """A page holds at most its limit of the runs a worker took (or that wait with a
    signal unseen), stale or not; the walk goes on after the last run of each and meets
    every stale run once. A backlog of runs never taken is not walked at all."""
    store = backend.store
    for i in range(7):
        cp = _running(store, f"took-{i}")
        if i % 3 == 0:
            store.save(_advance(cp), cp)
    for i in range(5):
        _new(store, f"never-{i}")  # pending, epoch 0: the broker's
    _wait(store, _running(store, "took-signalled"), Wait(event="paid"))
    store.signal("took-signalled", "paid", {}, "s-1")
    backend.elapse(61)
    fresh = _running(store, "took-fresh")  # just claimed: a sign of life
    rows, after = store.stalled(60, after="", limit=3)
    assert [r["run_id"] for r in rows] == ["took-0", "took-1", "took-2"] and after == "took-2"
    rows, after = store.stalled(60, after=after, limit=3)
    assert [r["run_id"] for r in rows] == ["took-3", "took-4", "took-5"] and after == "took-5"
    rows, after = store.stalled(60, after=after, limit=3)
    # took-fresh is on the page (it counts toward the limit) but not stale.
    assert [r["run_id"] for r in rows] == ["took-6", "took-signalled"] and after == "took-signalled"
    rows, after = store.stalled(60, after=after, limit=3)
    assert rows == [] and after is None
    walked = [r["run_id"] for r in _stalled(store, 60, limit=2)]
    assert walked == sorted({f"took-{i}" for i in range(7)} | {"took-signalled"})
    assert fresh.run_id not in walked


def test_a_run_with_a_retry_scheduled_is_left_alone_until_it_is_overdue(
    backend: Backend,
) -> None:
    store = backend.store
    cp = _running(store)
    store.end_attempt(cp, RunStatus.RUNNING, "E", Attempt(started=0.0), retry_in=10)
    backend.elapse(5)
    assert _stalled(store, running_after=1) == []
    backend.elapse(6.5)  # the retry is overdue by more than running_after
    assert [r["run_id"] for r in _stalled(store, running_after=1)] == ["r1"]
    claimed = store.claim("r1", 2)  # a claim clears the schedule, and is a sign of life
    assert claimed is not None
    assert _stalled(store, running_after=1) == []
    backend.elapse(2)
    assert [r["run_id"] for r in _stalled(store, running_after=1)] == ["r1"]
    # A retry that then saved its step clears the schedule too.
    store.end_attempt(claimed, RunStatus.RUNNING, "E", Attempt(started=0.0), retry_in=100)
    store.save(_advance(claimed), claimed)
    backend.elapse(2)
    assert [r["run_id"] for r in _stalled(store, running_after=1)] == ["r1"]


def test_a_waiting_run_is_stalled_once_its_timeout_passes_or_a_signal_waits_unseen(
    backend: Backend,
) -> None:
    store = backend.store
    _wait(store, _running(store, "timeout"), Wait(event="paid", timeout=30))
    _wait(store, _running(store, "signalled"), Wait(event="paid"))
    _wait(store, _running(store, "other"), Wait(event="paid"))
    store.signal("other", "another-event", {}, "s-1")
    backend.elapse(10)
    assert _stalled(store, running_after=60) == []  # a save is life
    store.signal("signalled", "paid", {}, "s-1")
    backend.elapse(30)
    # A timeout that passed is the wake pass's, never the reaper's: one sender per wake.
    assert _stalled(store, running_after=60) == []
    backend.elapse(31)  # the signal nobody picked up is older than running_after now
    found = _stalled(store, running_after=60)
    assert {r["run_id"]: r["status"] for r in found} == {"signalled": "waiting"}
    assert store.wake() == ["timeout"]


# -- sleeps and timeouts: the wake pass --------------------------------------------------
def test_a_sleep_wakes_once_when_its_time_comes_and_not_before(backend: Backend) -> None:
    """A sleep is a wait for no event: parked with a wake time; wake() moves each due run
    out of waiting (to pending, the wait kept and read as over) and returns it once."""
    store = backend.store
    _wait(store, _running(store, "late"), Wait(event=None, timeout=90))
    _wait(store, _running(store, "soon"), Wait(event=None, timeout=30))
    _wait(store, _running(store, "forever"), Wait(event="paid"))  # no wake time
    sleeping = _get(store, "soon")
    assert sleeping.status == RunStatus.WAITING and sleeping.wakes_at is not None
    assert sleeping.to_json()["wakes_at"] == sleeping.wakes_at.isoformat()
    loaded = _load(store, "soon")
    assert (loaded.wait_event, loaded.wait_over, loaded.signal) == (None, False, None)
    # A signal does not end a sleep: it is kept for a later wait of its event.
    assert store.signal("soon", "paid", {}, "s-1") == ("waiting", True)
    assert _load(store, "soon").signal is None
    assert store.wake() == []
    backend.elapse(31)
    assert store.wake() == ["soon"]
    assert store.wake() == []  # woken once: no longer waiting
    woken = _load(store, "soon")
    assert (woken.status, woken.wait_over, woken.cursor) == (RunStatus.PENDING, True, "settle")
    assert _get(store, "soon").wakes_at is None
    # The woken run's message may be lost (a waker killed before it sent): it was claimed
    # before it slept, so the reaper finds it once it is quiet.
    backend.elapse(61)
    listed = {r["run_id"] for r in _stalled(store, running_after=60)}
    assert listed == {"soon"}
    assert store.wake(batch=1) == ["late"]  # the most overdue first, a batch at a time
    assert store.wake() == []
    assert _get(store, "forever").status == RunStatus.WAITING


def test_a_cancel_stops_a_sleeping_run_at_once_and_nothing_wakes_it(backend: Backend) -> None:
    store = backend.store
    _wait(store, _running(store), Wait(event=None, timeout=30))
    assert store.cancel("r1", "not needed") == RunStatus.CANCELLED
    backend.elapse(31)
    assert store.wake() == []
    assert _get(store, "r1").wakes_at is None


def test_two_wakers_at_once_wake_a_run_once(backend: Backend) -> None:
    """One waker holds its batch, not committed (a beat's pass paused in its transaction):
    another pass at that moment gets none of those runs, and never waits on them for
    long; the first then commits them. Both stores: Postgres skips the locked rows,
    MemoryStore's lock serialises the two."""
    store = backend.store
    for run_id in ("a", "b"):
        _wait(store, _running(store, run_id), Wait(event=None, timeout=5))
    backend.elapse(6)
    inside, go = threading.Event(), threading.Event()
    got: dict[str, list[str]] = {}

    def hold(ids: list[str]) -> None:
        inside.set()
        assert go.wait(10)

    first = threading.Thread(target=lambda: got.update(first=store.wake(before_commit=hold)))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=lambda: got.update(second=store.wake()))
    second.start()
    second.join(0.5)
    go.set()
    first.join(10)
    second.join(10)
    assert sorted(got["first"]) == ["a", "b"]
    assert got["second"] == []
    assert store.wake() == []


# -- debounce: enqueues that collapse into one run, sent by the wake pass ---------------
def test_debounced_enqueues_collapse_into_one_run_that_wakes_once_with_the_latest_input(
    backend: Backend,
) -> None:
    """Each enqueue of a key returns the run not started yet and moves its start to
    `debounce` after it (at most max_wait after the first); wake() sends it once, with
    the last input; the next enqueue of the key makes a new run."""
    store = backend.store
    assert store.debounce("d1", "probe", {"n": 1}, "conv-42", 10, 20) == ("d1", True)
    run = _get(store, "d1")
    assert (run.status, run.seq, run.cursor) == (RunStatus.WAITING, 0, "")
    assert run.wakes_at is not None
    backend.elapse(8)
    assert store.debounce("d2", "probe", {"n": 2}, "conv-42", 10, 20) == ("d1", False)
    assert store.debounce("o1", "other", {"n": 9}, "conv-42", 5) == ("o1", True)  # its own
    assert store.debounce("k1", "probe", {"n": 9}, "conv-7", 5) == ("k1", True)
    backend.elapse(8)  # 16 s after the first, 8 after the last: still quiet
    assert sorted(store.wake()) == ["k1", "o1"]  # the other key's, the other workflow's
    assert store.debounce("d3", "probe", {"n": 3}, "conv-42", 10, 20) == ("d1", False)
    backend.elapse(5)  # 21 s after the first: past max_wait, the last came 5 s ago
    assert store.wake() == ["d1"]
    assert store.wake() == []
    woken = _load(store, "d1")
    assert (woken.status, woken.input, woken.seq) == (RunStatus.PENDING, {"n": 3}, 0)
    assert store.get("d2") is None and store.get("d3") is None
    # Started (sent): the key is free, and the next enqueue is a new run.
    assert store.debounce("d4", "probe", {"n": 4}, "conv-42", 10) == ("d4", True)
    assert store.cancel("d4", "no") == RunStatus.CANCELLED
    assert store.debounce("d5", "probe", {"n": 5}, "conv-42", 10) == ("d5", True)
    counts = {s: int(r["n"]) for s, r in store.counts().items()}
    assert counts == {"pending": 3, "cancelled": 1, "waiting": 1}


def test_a_debounced_run_that_sleeps_later_does_not_take_its_keys_enqueues(
    backend: Backend,
) -> None:
    """Only a run not started holds its key: one woken, run and parked in a sleep (waiting
    again, past seq 0) is no longer the key's."""
    store = backend.store
    store.debounce("d1", "probe", {"n": 1}, "k", 1)
    backend.elapse(2)
    assert store.wake() == ["d1"]
    claimed = store.claim("d1", 1)
    assert claimed is not None
    _wait(store, claimed, Wait(event=None, timeout=60))
    assert _get(store, "d1").status == RunStatus.WAITING
    assert store.debounce("d2", "probe", {"n": 2}, "k", 1) == ("d2", True)
    assert _load(store, "d1").input == {"n": 1}


def test_two_debounced_enqueues_racing_make_one_run(
    backend: Backend, request: pytest.FixtureRequest
) -> None:
    """Enqueuers of one key at once: one run, which every one of them returns. On Postgres
    they meet inside the enqueue by construction: the first is held after its checkpoint's
    insert (a trigger on runs), the others queue behind it on the key's unique index (or,
    without the key, are held beside it), until all are in."""
    store = backend.store
    n = 3  # within the store's pool of 4, so every racer is in Postgres, not waiting for it

    def enqueue(i: int) -> Callable[[], tuple[str, bool]]:
        return lambda: store.debounce(f"d{i}", "probe", {"n": i}, "k", 30)

    if isinstance(store, MemoryStore):
        got = [r.outcome() for r in [Racer(enqueue(i)) for i in range(n)]]
    else:
        with held_inside(request.getfixturevalue("db_url"), "runs") as gate:
            racers = [Racer(enqueue(i)) for i in range(n)]
            wait_for(lambda: gate.blocked() == n, 10, "every enqueue to be in, held or queued")
            assert gate.held() == 1  # the key's guard: the others wait for the first
            gate.release()
            got = [r.outcome() for r in racers]
    assert len({run_id for run_id, _ in got}) == 1
    assert sum(created for _, created in got) == 1


def test_the_sweep_removes_old_terminal_runs_with_everything_they_own(backend: Backend) -> None:
    store = backend.store
    for run_id, status in (
        ("old-done", RunStatus.DONE),
        ("old-failed", RunStatus.FAILED),
        ("old-cancelled", RunStatus.CANCELLED),
        ("old-running", RunStatus.RUNNING),
        ("old-incompatible", RunStatus.INCOMPATIBLE),
        ("new-done", RunStatus.DONE),
    ):
        if run_id == "new-done":
            backend.elapse(8 * 86400)
        cp = _new(store, run_id)
        store.signal(run_id, "e", {}, "s-1")
        assert store.mark_done(cp, f"k-{run_id}", {"ok": True})
        assert store.record_call(cp, 0, Call(pos=0, name="tool", result=[run_id]))
        nxt = _advance(cp, window=(_msg("m"),))
        store.save(nxt, cp)
        if status == RunStatus.INCOMPATIBLE:
            store.mark_unreadable(run_id, status, "v7")
        elif status != RunStatus.RUNNING:
            store.save(_advance(nxt, status=status), nxt)
    seen: list[int] = []
    assert store.sweep(older_than=7 * 86400, batch=2, progress=seen.append) == 3
    assert seen == [2, 3]  # batch runs per transaction, progress after each
    kept = ["new-done", "old-incompatible", "old-running"]
    assert sorted(r.run_id for r in store.list_runs()) == kept
    for run_id in ("old-done", "old-failed", "old-cancelled"):
        assert store.get(run_id) is None and store.history(run_id) == []
        assert store.was_done(f"k-{run_id}") == (False, None)
        assert store.journal(run_id, "one", 0) == []
    for run_id in kept:
        assert store.was_done(f"k-{run_id}") == (True, {"ok": True})
        assert [c.result for c in store.journal(run_id, "one", 0)] == [[run_id]]
    assert store.sweep(older_than=7 * 86400) == 0
    # A swept run id starts afresh: no window, no signal of the old run.
    cp = _new(store, "old-done")
    assert (cp.window, cp.seq) == ((), 0)
    _wait(store, cp, Wait(event="e"))
    assert _load(store, "old-done").signal is None


def test_the_sweep_removes_a_swept_runs_budget_with_its_holds(backend: Backend) -> None:
    store = backend.store
    assert store.create_run("tree", "probe", {}, "one", budget_usd=1.0)
    cp = store.claim("tree", 1)
    assert cp is not None and cp.budgets == ["run:tree"]
    assert store.reserve(cp, 0, 0, 0.5) is None  # a call in flight when the run stopped
    store.save(_advance(cp, status=RunStatus.DONE), cp)
    backend.elapse(8 * 86400)
    assert store.budget("tree") is not None
    assert store.sweep(older_than=7 * 86400) == 1
    assert store.budget("tree") is None
    # The id enqueued again is a new tree, with a new budget.
    assert store.create_run("tree", "probe", {}, "one", budget_usd=2.0)
    got = store.budget("tree")
    assert got is not None and (got.limit_usd, got.spent_usd, got.reserved_usd) == (2.0, 0, 0)


def test_a_stale_epochs_reserve_holds_nothing_and_is_fenced(backend: Backend) -> None:
    store = backend.store
    assert store.create_run("tree", "probe", {}, "one", budget_usd=1.0)
    zombie = store.claim("tree", 1)
    assert zombie is not None
    # The zombie's lease lapsed after its check; another worker claimed the run.
    owner = store.claim("tree", 2)
    assert owner is not None and owner.epoch == 2
    with pytest.raises(StaleWrite):
        store.reserve(zombie, 0, 0, 0.5)
    got = store.budget("tree")
    assert got is not None and got.reserved_usd == 0
    # The owner's hold is the only one: all the room but its own is left.
    assert store.reserve(owner, 0, 0, 0.5) is None
    over = store.reserve(owner, 0, 1, 0.6)
    assert over is not None and over.reserved_usd == pytest.approx(0.5)
    # A writer whose run moved past its seq is fenced too.
    store.save(_advance(owner), owner)
    with pytest.raises(StaleWrite):
        store.reserve(owner, 0, 2, 0.1)


# -- the journal of calls inside a step --------------------------------------------------
def test_calls_are_journaled_in_order_per_visit(any_store: CheckpointStore) -> None:
    cp = _running(any_store)  # at cursor "two", seq 1, epoch 1
    made = [
        Call(pos=0, name="model", result={"role": "assistant", "content": "hi"}, cost_usd=0.01),
        Call(
            pos=1,
            name="search",
            error={"type": "ValueError", "module": "builtins", "args": ["no"], "message": "no"},
        ),
        Call(pos=2, name="search", result=None),
    ]
    for call in reversed(made):  # read back by position, whatever the order of writing
        assert any_store.record_call(cp, 0, call)
    assert any_store.journal("r1", "two", 0) == made
    assert any_store.journal("r1", "two", 1) == []  # another visit: nothing
    assert any_store.journal("r1", "one", 0) == []


def test_a_journal_record_is_fenced_like_a_save(any_store: CheckpointStore) -> None:
    cp = _running(any_store)
    call = Call(pos=0, name="tool", result=1)
    # Not at the run's seq (it moved on, or this writer is behind): refused.
    assert not any_store.record_call(dataclasses.replace(cp, seq=0), 0, call)
    assert any_store.record_call(cp, 0, call)
    # The same writer again (its first try committed, the reply was lost): recorded.
    assert any_store.record_call(cp, 0, call)
    # Another name at that place is not this writer's record: refused.
    assert not any_store.record_call(cp, 0, Call(pos=0, name="other", result=2))
    # A newer epoch claims the run: the old owner records nothing more.
    assert any_store.claim("r1", 2) is not None
    assert not any_store.record_call(cp, 0, Call(pos=1, name="tool", result=3))
    assert not any_store.record_call(cp, 0, call)
    assert any_store.journal("r1", "two", 0) == [call]
    assert any_store.record_call(dataclasses.replace(cp, epoch=2), 0, Call(pos=1, name="x"))
    assert not any_store.record_call(dataclasses.replace(cp, run_id="nope"), 0, call)


def test_a_journal_record_reads_the_runs_cancel_reason(any_store: CheckpointStore) -> None:
    # The step's check before its next call stands on it (steps/context.py, CANCEL_FRESH).
    cp = _running(any_store)
    assert any_store.record_call(cp, 0, Call(pos=0, name="x")) == Recorded(None)
    assert any_store.cancel("r1", "customer left") == RunStatus.RUNNING
    assert any_store.record_call(cp, 0, Call(pos=1, name="x")) == Recorded("customer left")
    assert [c.pos for c in any_store.journal("r1", "two", 0)] == [0, 1]  # kept all the same


def test_a_journal_record_is_progress_and_restarts_the_delivery_count(
    any_store: CheckpointStore,
) -> None:
    cp = _running(any_store)
    for epoch in (2, 3, 4):  # delivered three times since the save, no step finished
        assert any_store.claim("r1", epoch) is not None
    assert _load(any_store, "r1").deliveries == 3
    assert any_store.record_call(dataclasses.replace(cp, epoch=4), 0, Call(pos=0, name="x"))
    assert _load(any_store, "r1").deliveries == 1
    assert not any_store.record_call(cp, 0, Call(pos=1, name="x"))  # fenced: no progress
    assert any_store.claim("r1", 5) is not None
    assert _load(any_store, "r1").deliveries == 2


def test_an_intent_is_fenced_and_found_open_until_its_mark(any_store: CheckpointStore) -> None:
    cp = _running(any_store)
    assert any_store.record_intent(dataclasses.replace(cp, seq=0), "k1") == ("fenced", None)
    assert any_store.record_intent(cp, "k1") == ("written", None)
    # The same writer again (its first try committed, the reply was lost): still its own.
    assert any_store.record_intent(cp, "k1") == ("written", None)
    assert any_store.was_done("k1") == (False, None)  # an intent is not a done mark
    assert any_store.open_intents("r1")[0]["key"] == "k1"
    # A newer owner finds it open: the outcome is unknown.
    assert any_store.claim("r1", 2) is not None
    at_two = dataclasses.replace(cp, epoch=2)
    assert any_store.record_intent(at_two, "k1") == ("open", None)
    assert any_store.record_intent(cp, "k2") == ("fenced", None)  # the old owner: fenced
    # The old owner's effect ran after all, but its late mark is fenced: the outcome stays
    # unknown to the new owner, whose reconcile (or an operator) settles it.
    assert not any_store.mark_done(cp, "k1", {"ok": 1})
    assert any_store.record_intent(at_two, "k1") == ("open", None)
    assert any_store.mark_done(at_two, "k1", {"ok": 2})  # the reconciled outcome
    assert any_store.record_intent(at_two, "k1") == ("done", {"ok": 2})
    assert any_store.mark_done(at_two, "k1", {"ok": 3})
    assert any_store.was_done("k1") == (True, {"ok": 2})  # the first mark stays
    assert any_store.open_intents("r1") == []


# -- a step's transaction --------------------------------------------------------------
def test_a_transaction_the_step_never_used_is_not_open_and_the_save_goes_on(
    any_store: CheckpointStore,
) -> None:
    cp = _new(any_store)
    tx = any_store.transaction()
    try:
        assert tx.open is None
        any_store.save(_advance(cp), cp, tx)
    finally:
        tx.close()
    assert _load(any_store, "r1").seq == 1
    assert any_store.outage(ValueError("a step's own bug")) is None


# -- leases ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LeaseBackend:
    leases: LeaseManager
    elapse: Callable[[float], None]


@pytest.fixture(params=["memory", "redis"])
def lease_backend(request: pytest.FixtureRequest) -> LeaseBackend:
    if request.param == "memory":
        clock = ManualClock()
        return LeaseBackend(MemoryLeases(clock), clock.advance)
    return LeaseBackend(request.getfixturevalue("leases"), time.sleep)


@pytest.fixture
def any_leases(lease_backend: LeaseBackend) -> LeaseManager:
    return lease_backend.leases


def test_one_owner_at_a_time_and_epochs_only_grow(any_leases: LeaseManager) -> None:
    a = any_leases.acquire("r1", ttl=10)
    assert a is not None and a.epoch == 1 and a.token.epoch == 1
    assert a.start_heartbeat() is a
    assert any_leases.acquire("r1", ttl=10) is None  # held
    assert any_leases.holder("r1") == a.token
    assert any_leases.unheld(["r1", "r2"]) == ["r2"]
    a.release()
    assert any_leases.holder("r1") is None and any_leases.unheld(["r1"]) == ["r1"]
    b = any_leases.acquire("r1", ttl=10)
    assert b is not None and b.epoch == 2  # the counter outlives the lease
    b.release()
    c = any_leases.acquire("r1", ttl=10, floor=7)  # the stored epoch is ahead of the counter
    assert c is not None and c.epoch == 8
    c.release(ended=True)  # the run ended: its counter goes too
    d = any_leases.acquire("r1", ttl=10)
    assert d is not None and d.epoch == 1
    d.release()


def test_only_the_owner_renews_or_releases(lease_backend: LeaseBackend) -> None:
    leases = lease_backend.leases
    old = leases.acquire("r1", ttl=0.4)
    assert old is not None
    old.renew()
    lease_backend.elapse(0.6)  # paused past its TTL: the lease expired
    assert leases.holder("r1") is None
    new = leases.acquire("r1", ttl=10)
    assert new is not None and new.epoch == old.epoch + 1
    old.release()  # compare-and-delete: the successor's lease stays
    assert leases.holder("r1") == new.token
    with pytest.raises(LeaseLost, match="now held by"):
        old.ensure()  # its last renewal is old: it asks, and learns
    with pytest.raises(LeaseLost):
        old.renew()
    new.ensure(fresh=True)
    new.renew()
    new.release()
    assert leases.holder("r1") is None


def test_ensure_trusts_a_fresh_renewal_unless_asked_to_check(any_leases: LeaseManager) -> None:
    a = any_leases.acquire("r1", ttl=30)
    assert a is not None
    assert any_leases.break_dead("r1", a.token) is True  # gone behind its back
    b = any_leases.acquire("r1", ttl=30)
    assert b is not None
    a.ensure()  # renewed under half a TTL ago: trusted, as the real one does
    with pytest.raises(LeaseLost, match=re.escape(str(b.token))):
        a.ensure(fresh=True)  # before an effect nothing else fences: ask
    with pytest.raises(LeaseLost):
        a.ensure()  # lost is remembered
    b.release()


def test_a_dead_owners_lease_is_broken_only_if_it_is_still_that_owners(
    any_leases: LeaseManager,
) -> None:
    a = any_leases.acquire("r1", ttl=30)
    assert a is not None
    impostor = LeaseToken("elsewhere", 1, "nonce", a.epoch)
    assert any_leases.break_dead("r1", impostor) is False
    assert any_leases.holder("r1") == a.token
    assert any_leases.break_dead("r1", a.token) is True
    assert any_leases.holder("r1") is None
    assert any_leases.break_dead("r1", a.token) is False


def test_one_message_out_per_run_until_taken_or_expired(lease_backend: LeaseBackend) -> None:
    leases = lease_backend.leases
    assert leases.mark_sent("r1", window=30) is True
    assert leases.mark_sent("r1", window=30) is False  # one out and untaken
    assert leases.mark_sent("r2", window=0.3) is True
    lease = leases.acquire("r1", ttl=10)  # a worker took r1's message
    assert lease is not None
    lease.release()
    assert leases.mark_sent("r1", window=30) is True
    lease_backend.elapse(0.5)
    assert leases.mark_sent("r2", window=30) is True  # the lost message's window passed


def test_a_run_offered_waits_while_its_message_is_out_each_wait_twice_the_last(
    lease_backend: LeaseBackend,
) -> None:
    """The reaper's one round trip a batch (offer.lua): a run with no lease and no
    message out is offered and marked; while the message is out (untaken) it is not
    offered again; once its wait is over it is, and the next wait is twice as long (up to
    the cap); a worker taking the run starts over; a run held is never offered."""
    leases, wait = lease_backend.leases, 0.6
    held = leases.acquire("held", ttl=30)
    assert held is not None
    assert leases.offer(["r1", "held", "r2"], window=wait, cap=4 * wait) == ["r1", "r2"]
    assert leases.offer(["r1", "held", "r2"], window=wait, cap=4 * wait) == []  # out
    lease_backend.elapse(wait + 0.1)
    assert leases.offer(["r1"], window=wait, cap=4 * wait) == ["r1"]  # its wait is over
    lease_backend.elapse(wait + 0.1)
    assert leases.offer(["r1"], window=wait, cap=4 * wait) == []  # now twice as long
    lease_backend.elapse(wait)
    assert leases.offer(["r1"], window=wait, cap=4 * wait) == ["r1"]
    taken = leases.acquire("r1", ttl=30)  # a worker takes it: its mark goes
    assert taken is not None
    taken.release()
    assert leases.offer(["r1", "r2"], window=wait, cap=4 * wait) == ["r1", "r2"]
    # At most `most`; the others are neither offered nor marked.
    assert leases.offer(["a", "b", "c"], window=wait, cap=wait, most=2) == ["a", "b"]
    assert leases.offer(["a", "b", "c"], window=wait, cap=wait, most=2) == ["c"]
    leases.unmark(["a"])  # offered, then not sent: free again at once
    assert leases.offer(["a", "b"], window=wait, cap=wait) == ["a"]
    # mark_sent's bare mark (a lost pool process's resend) holds until it expires.
    assert leases.mark_sent("bare", window=wait)
    assert leases.offer(["bare"], window=wait, cap=wait) == []
    lease_backend.elapse(wait + 0.1)
    assert leases.offer(["bare"], window=wait, cap=wait) == ["bare"]
    held.release()


def test_memory_twins_follow_the_given_clock() -> None:
    clock = ManualClock(start=1_000_000.0)
    store, leases = MemoryStore(clock), MemoryLeases(clock)
    store.create_run("r1", "probe", {})
    created = _get(store, "r1").created_at
    assert created == dt.datetime.fromtimestamp(1_000_000.0, dt.UTC)
    lease = leases.acquire("r1", ttl=10)
    assert lease is not None
    clock.advance(9)
    assert leases.holder("r1") == lease.token
    clock.advance(1)
    assert leases.holder("r1") is None


@pytest.mark.parametrize(
    ("protocol", "twin"),
    [
        (CheckpointStore, MemoryStore),
        (Schedules, MemorySchedules),
        (LeaseManager, MemoryLeases),
        (HeldLease, MemoryLease),
    ],
)
def test_memory_twins_have_every_method_of_the_contract(protocol: type, twin: type) -> None:
    # As tests/contract/test_contract.py asks of PgStore and the Redis leases: a method added to
    # the contract and not to a twin fails here before any behaviour is compared.
    for name, fn in contract_methods(protocol).items():
        wanted = [p for p in inspect.signature(fn).parameters if p != "self"]
        found = [p for p in inspect.signature(getattr(twin, name)).parameters if p != "self"]
        assert found[: len(wanted)] == wanted, f"{twin.__name__}.{name}{found} vs {wanted}"
        both = inspect.iscoroutinefunction(fn), inspect.iscoroutinefunction(getattr(twin, name))
        assert both[0] == both[1], f"{twin.__name__}.{name}: async in one, not the other"
    lease = MemoryLeases().acquire("r1", ttl=10)
    assert lease is not None and all(hasattr(lease, a) for a in ("run_id", "epoch", "token"))


# -- child runs ------------------------------------------------------------------------
def _spawn(store: CheckpointStore, kids: int = 3, need: int = 3) -> tuple[Checkpoint, list[str]]:
    """r1 saves a step that spawns kids children and waits for need of them."""
    from cairn.core.records import Spawned

    cp = _running(store)
    ids = [f"r1.two.0.{i}" for i in range(kids)]
    spawned = Spawned(tuple((k, "probe", {"i": i}) for i, k in enumerate(ids)), need, 1)
    nxt = _advance(cp, status=RunStatus.WAITING, cursor="collect")
    event = f"cairn.children:{nxt.seq}"
    saved = store.save(nxt, cp, wait=Wait(event=event), spawn=spawned)
    assert saved.signalled is False
    return nxt, ids


def _finish(store: CheckpointStore, run_id: str, status: RunStatus, epoch: int = 1) -> None:
    claimed = store.claim(run_id, epoch)
    assert claimed is not None
    if status == RunStatus.DONE:
        store.save(_advance(claimed, status=status, cursor="done", state={"got": run_id}), claimed)
    else:
        store.end_attempt(claimed, status, f"{run_id} {status}", Attempt(started=0.0))


def test_a_spawn_creates_its_children_with_the_save_and_once(any_store: CheckpointStore) -> None:
    from cairn.core.records import Spawned

    nxt, ids = _spawn(any_store)
    kids = any_store.children("r1")
    assert [k.run_id for k in kids] == ids  # in the spawn's order
    assert all(k.status == "pending" and k.parent_id == "r1" for k in kids)
    assert _get(any_store, ids[0]).parent_id == "r1"
    assert _load(any_store, ids[2]).input == {"i": 2} and _load(any_store, ids[2]).depth == 1
    # A fenced save (a zombie replaying the step) creates nothing, not even new ids.
    stale = Spawned((("r1.two.0.9", "probe", {}),), 1, 1)
    with pytest.raises(StaleWrite):
        any_store.save(nxt, nxt, wait=Wait(event="x"), spawn=stale)
    assert any_store.get("r1.two.0.9") is None
    assert any_store.children("r1", seq=nxt.seq) == kids
    assert any_store.children("r1", seq=nxt.seq + 1) == []


def test_a_spawn_gathers_when_enough_children_stop_and_signals_once(
    any_store: CheckpointStore,
) -> None:
    nxt, ids = _spawn(any_store, kids=3, need=3)
    event = f"cairn.children:{nxt.seq}"
    _finish(any_store, ids[0], RunStatus.DONE)
    _finish(any_store, ids[1], RunStatus.FAILED)
    assert any_store.gathered("r1") is False and _load(any_store, "r1").signal is None
    _finish(any_store, ids[2], RunStatus.DONE)
    assert any_store.gathered("r1") is True
    assert _load(any_store, "r1").signal == {"id": event, "payload": {"seq": nxt.seq}}
    kids = {k.run_id: k for k in any_store.children("r1")}
    assert kids[ids[0]].state == {"got": ids[0]} and kids[ids[1]].error == f"{ids[1]} failed"
    # A failed child re-armed and failed again does not signal twice.
    assert any_store.create_run(ids[1], "probe", {"i": 1}) is False
    _finish(any_store, ids[1], RunStatus.FAILED, epoch=2)
    woken = any_store.claim("r1", 2)
    assert woken is not None
    after = _advance(dataclasses.replace(woken, epoch=2), cursor="done", status=RunStatus.DONE)
    any_store.save(after, woken, attempt=Attempt(started=0.0, signal_id=event))
    assert any_store.gathered("r1") is False


def test_a_spawn_waiting_for_any_child_gathers_at_the_first(any_store: CheckpointStore) -> None:
    _, ids = _spawn(any_store, kids=3, need=1)
    _finish(any_store, ids[1], RunStatus.CANCELLED)
    assert any_store.gathered("r1") is True
    _finish(any_store, ids[0], RunStatus.DONE)  # later ones change nothing
    assert any_store.gathered("r1") is True


def test_cancelling_a_parent_cancels_its_children_and_theirs(any_store: CheckpointStore) -> None:
    from cairn.core.records import Spawned

    _, ids = _spawn(any_store, kids=2, need=2)
    busy = any_store.claim(ids[0], 1)  # a worker has the first child: it stops at its next step
    assert busy is not None
    grand = _advance(busy, cursor="wait", status=RunStatus.WAITING)
    any_store.save(
        grand,
        busy,
        wait=Wait(event=f"cairn.children:{grand.seq}"),
        spawn=Spawned(((f"{ids[0]}.a.0.0", "probe", {}),), 1, 2),
    )
    assert any_store.cancel("r1", "user asked") == "cancelled"  # r1 waited: cancelled at once
    assert _get(any_store, ids[1]).status == "cancelled"  # pending
    assert _get(any_store, ids[0]).status == "cancelled"  # waiting
    assert _get(any_store, f"{ids[0]}.a.0.0").status == "cancelled"  # a grandchild
    assert _load(any_store, ids[1]).cancel_reason == "its parent was cancelled"


# -- concurrency keys --------------------------------------------------------------------
def _keyed(
    store: CheckpointStore, run_id: str, key: str = "user:1", limit: int = 1, priority: int = 0,
    workflow: str = "probe",
) -> RunStatus:  # fmt: skip
    assert store.create_run(
        run_id, workflow, {"id": run_id}, "one", priority=priority, concurrency_key=key,
        concurrency_limit=limit,
    )  # fmt: skip
    return _get(store, run_id).status


def _statuses(store: CheckpointStore, *run_ids: str) -> list[str]:
    return [str(_get(store, r).status) for r in run_ids]


def test_a_concurrency_key_admits_up_to_its_limit_and_queues_the_rest(
    any_store: CheckpointStore,
) -> None:
    assert [_keyed(any_store, r, limit=2) for r in ("a", "b", "c")] == [
        "pending", "pending", "queued",
    ]  # fmt: skip
    assert sorted(any_store.admitted("probe", "user:1")) == [("a", 0), ("b", 0)]
    assert any_store.admitted("probe", "user:1") == []  # each admitted run is sent once
    assert any_store.claim("c", 1) is None  # a queued run's delivery does nothing
    assert _get(any_store, "c").concurrency_key == "user:1"
    _finish(any_store, "a", RunStatus.DONE)  # its slot goes to c in the same write
    assert _statuses(any_store, "a", "b", "c") == ["done", "pending", "pending"]
    assert any_store.admitted("probe", "user:1") == [("c", 0)]
    # Keys are a workflow's: the same key of another workflow has slots of its own.
    assert _keyed(any_store, "other", workflow="other-flow") == "pending"


def test_a_keys_queue_is_best_priority_first_then_oldest(any_store: CheckpointStore) -> None:
    _keyed(any_store, "first")
    for run_id, priority in (("low", -5), ("b", 0), ("c", 7), ("d", 7), ("e", 0)):
        assert _keyed(any_store, run_id, priority=priority) == "queued"
    order = []
    running = "first"
    for _ in range(5):
        _finish(any_store, running, RunStatus.DONE)
        ((running, _),) = any_store.admitted("probe", "user:1")
        order.append(running)
    assert order == ["c", "d", "b", "e", "low"]
    assert _get(any_store, "c").priority == 7


def test_every_way_a_run_stops_gives_back_its_slot_and_a_waiting_run_keeps_it(
    any_store: CheckpointStore,
) -> None:
    for r in ("a", "b", "c", "d", "e"):
        _keyed(any_store, r)
    claimed = any_store.claim("a", 1)  # a waits for a signal: it keeps its slot
    assert claimed is not None
    parked = _advance(claimed, cursor="two", status=RunStatus.WAITING)
    any_store.save(parked, claimed, wait=Wait(event="go"))
    assert _statuses(any_store, "a", "b") == ["waiting", "queued"]
    assert any_store.cancel("c", "no longer wanted") == "cancelled"  # queued: out of line
    assert any_store.cancel("a", "enough") == "cancelled"  # its slot goes to b
    assert _statuses(any_store, "b", "c", "d") == ["pending", "cancelled", "queued"]
    _finish(any_store, "b", RunStatus.FAILED)
    assert _statuses(any_store, "d", "e") == ["pending", "queued"]
    # A failed run enqueued again while the key's slot is taken waits its turn again.
    assert any_store.create_run("b", "probe", {"id": "b"}, concurrency_key="user:1") is False
    assert _statuses(any_store, "b") == ["queued"]
    claimed = any_store.claim("d", 1)  # a running run cancelled stops at its next save
    assert claimed is not None
    busy = _advance(claimed, cursor="two")
    any_store.save(busy, claimed)
    assert any_store.cancel("d", "stop") == "running"
    any_store.save(_advance(busy, status=RunStatus.CANCELLED, cursor="three"), busy)
    assert _statuses(any_store, "d", "e", "b") == ["cancelled", "pending", "queued"]
    _finish(any_store, "e", RunStatus.DONE)
    assert _statuses(any_store, "b") == ["pending"]


def test_a_higher_limit_admits_at_once_and_an_idle_key_is_forgotten(
    any_store: CheckpointStore,
) -> None:
    for r in ("a", "b", "c"):
        _keyed(any_store, r)
    assert _keyed(any_store, "d", limit=3) == "queued"  # b and c go first: they came first
    assert _statuses(any_store, "a", "b", "c") == ["pending", "pending", "pending"]
    assert sorted(r for r, _ in any_store.admitted("probe", "user:1")) == ["a", "b", "c"]
    for r in ("a", "b", "c", "d"):
        _finish(any_store, r, RunStatus.DONE)
    # No slot held, none queued: the key is gone, and comes back with the next enqueue's
    # limit.
    assert _keyed(any_store, "e", limit=1) == "pending" and _keyed(any_store, "f") == "queued"


# -- the operator's: forks, rewinds, replays, resolves, waits -----------------------------
def _three_steps(store: CheckpointStore, run_id: str = "r1") -> list[Checkpoint]:
    """run_id claimed at epoch 1 and run to the end: one -> two -> three -> done, a message
    and 0.25 a step; the step at seq 2 leaves the state as it was. Its checkpoints, seq 0-3."""
    _new(store, run_id)
    claimed = store.claim(run_id, 1)
    assert claimed is not None
    saved = [claimed]
    for cursor, state in (("two", {"a": 1}), ("three", {"a": 1}), ("done", {"a": 1, "c": 3})):
        prev = saved[-1]
        nxt = _advance(
            prev,
            cursor=cursor,
            state=state,
            visits={**prev.visits, prev.cursor: prev.visits.get(prev.cursor, 0) + 1},
            window=(*prev.window, _msg(cursor)),
            cost_usd=prev.cost_usd + 0.25,
            status=RunStatus.DONE if cursor == "done" else RunStatus.RUNNING,
        )
        store.save(nxt, prev)
        saved.append(nxt)
    return saved


def test_a_fork_is_a_new_run_from_a_saved_step_and_leaves_its_origin(
    any_store: CheckpointStore,
) -> None:
    _three_steps(any_store)
    before = (_get(any_store, "r1"), any_store.history("r1"))
    assert any_store.fork("r1", 2, "f1", {"y": True}) is True
    cp = _load(any_store, "f1")
    assert (cp.seq, cp.cursor, cp.status, cp.epoch) == (2, "three", "pending", 0)
    assert (cp.state, cp.visits) == ({"a": 1}, {"one": 1, "two": 1})  # as of seq 1's save
    assert (cp.window, cp.win_start) == ((_msg("two"), _msg("three")), 0)
    assert (cp.input, cp.cost_usd, cp.forked_at) == ({"x": 1, "y": True}, 0.0, 2)
    run = _get(any_store, "f1")
    assert (run.forked_from, run.forked_at, run.workflow) == ("r1", 2, "probe")
    row = any_store.load_row("f1")
    assert row is not None and (row["forked_from"], row["forked_at"]) == ("r1", 2)
    [mark] = any_store.history("f1")
    assert (mark["seq"], mark["cursor"], mark["visit"], mark["outcome"]) == (
        1,
        "three",
        0,
        "forked",
    )
    assert (mark["worker"], mark["epoch"], mark["next_cursor"]) == ("client", 0, "three")
    assert mark["error"] == "forked from r1 at seq 2"
    assert [(f.run_id, f.forked_from, f.forked_at) for f in any_store.forks("r1")] == [
        ("f1", "r1", 2)
    ]
    assert (_get(any_store, "r1"), any_store.history("r1")) == before  # untouched
    # The same new run id again is the same fork; a fork of a fork starts from its mark.
    assert any_store.fork("r1", 1, "f1") is False and _load(any_store, "f1").seq == 2
    assert any_store.fork("f1", 2, "f2") is True
    assert (_load(any_store, "f2").cursor, _load(any_store, "f2").state) == ("three", {"a": 1})
    assert [f.run_id for f in any_store.forks("f1")] == ["f2"] and any_store.forks("f2") == []
    # A fork goes on as any run does: its seq grows from the fork's.
    claimed = any_store.claim("f1", 1)
    assert claimed is not None
    any_store.save(_advance(claimed, cursor="done", status=RunStatus.DONE), claimed)
    assert _get(any_store, "f1").seq == 3
    with pytest.raises(UnknownRun):
        any_store.fork("nope", 1, "f3")
    with pytest.raises(InvalidInput, match="saved no checkpoint at seq 9"):
        any_store.fork("r1", 9, "f3")
    assert any_store.get("f3") is None


def test_a_fork_or_a_rewind_at_the_checkpoint_a_run_ended_with_is_done_at_once(
    any_store: CheckpointStore,
) -> None:
    # Found by the chaos mix: pending at cursor "done", such a run was claimed and never
    # saved (no step left to run) until it failed as poison after CAIRN_MAX_DELIVERIES.
    done = _three_steps(any_store)[-1]
    assert done.cursor == "done"
    assert any_store.fork("r1", done.seq, "f1", {"y": True}) is True
    forked = _load(any_store, "f1")
    assert (forked.cursor, forked.status, forked.input) == ("done", "done", {"x": 1, "y": True})
    assert forked.state == done.state
    assert any_store.rewind("r1", done.seq) == done.seq + 1
    rewound = _load(any_store, "r1")
    assert (rewound.cursor, rewound.status, rewound.state) == ("done", "done", done.state)
    # An earlier checkpoint still makes a run that goes on.
    assert any_store.rewind("r1", 2) == done.seq + 2
    assert (_load(any_store, "r1").cursor, _load(any_store, "r1").status) == ("three", "pending")


def test_a_stopped_run_rewound_goes_on_from_a_saved_step_with_new_visits(
    any_store: CheckpointStore,
) -> None:
    done = _three_steps(any_store)[-1]
    assert any_store.rewind("r1", 1) == 4  # seq only grows
    cp = _load(any_store, "r1")
    assert (cp.seq, cp.cursor, cp.status, cp.error, cp.epoch) == (4, "two", "pending", None, 1)
    assert (cp.state, cp.window, cp.cost_usd) == ({"a": 1}, (_msg("two"),), 0.75)  # cost stays
    assert cp.visits == {"one": 1, "two": 1, "three": 1}  # past every visit it made
    mark = any_store.history("r1")[-1]
    assert (mark["seq"], mark["cursor"], mark["outcome"], mark["epoch"]) == (3, "two", "rewound", 1)
    assert mark["error"] == "rewound to seq 1"
    with pytest.raises(StaleWrite):  # the old timeline's writer is fenced
        any_store.save(_advance(done), done)
    with pytest.raises(RunNotStopped, match="r1 is pending"):
        any_store.rewind("r1", 1)
    with pytest.raises(UnknownRun):
        any_store.rewind("nope", 1)
    claimed = any_store.claim("r1", 2)
    assert claimed is not None
    any_store.save(_advance(claimed, cursor="done", status=RunStatus.DONE), claimed)
    with pytest.raises(InvalidInput, match="saved no checkpoint at seq 7"):
        any_store.rewind("r1", 7)
    assert any_store.rewind("r1", 4) == 6  # back to the rewound step: its mark's checkpoint
    again = _load(any_store, "r1")
    assert (again.cursor, again.visits["two"]) == ("two", 2)  # its visit 1 is used now


def test_a_rewound_failed_run_with_a_key_takes_a_free_slot_or_queues(
    any_store: CheckpointStore,
) -> None:
    assert _keyed(any_store, "k1") == "pending"
    claimed = any_store.claim("k1", 1)
    assert claimed is not None
    nxt = _advance(claimed, cursor="two", visits={"one": 1})
    any_store.save(nxt, claimed)
    any_store.end_attempt(nxt, RunStatus.FAILED, "broken", Attempt(started=0.0))
    assert _keyed(any_store, "k2") == "pending"  # the slot k1 gave back
    any_store.rewind("k1", 1)
    assert _statuses(any_store, "k1", "k2") == ["queued", "pending"]
    _finish(any_store, "k2", RunStatus.DONE)
    assert _statuses(any_store, "k1") == ["pending"]


def test_replay_rearms_the_runs_that_failed_since_a_time_once_oldest_first(
    backend: Backend,
) -> None:
    store = backend.store
    _new(store, "r0")
    _finish(store, "r0", RunStatus.FAILED)
    backend.elapse(7200)
    for r in ("r1", "r2", "r3", "r4"):
        _new(store, r)
    _new(store, "r5", "other")
    for r, status in (("r1", "failed"), ("r3", "failed"), ("r2", "failed"), ("r4", "done")):
        _finish(store, r, RunStatus(status))
    _finish(store, "r5", RunStatus.FAILED)
    now = store.clock()
    assert now.tzinfo is not None
    since, failed = now - dt.timedelta(hours=1), (RunStatus.FAILED,)
    listed = store.replay("probe", failed, since, now, 10, dry_run=True)
    assert [r.run_id for r in listed] == ["r1", "r3", "r2"]  # by when they stopped
    assert {(r.status, r.cursor) for r in listed} == {("failed", "one")}
    assert _statuses(store, "r1", "r2", "r3") == ["failed"] * 3  # a dry run writes nothing
    batch = store.replay("probe", failed, since, now, 2)
    assert [(r.run_id, r.status) for r in batch] == [("r1", "failed"), ("r3", "failed")]
    rearmed = _load(store, "r1")
    assert (rearmed.status, rearmed.error, rearmed.attempts, rearmed.cursor) == (
        "pending", None, 0, "one",
    )  # fmt: skip
    assert [r.run_id for r in store.replay("probe", failed, since, now, 10)] == ["r2"]
    assert store.replay("probe", failed, since, now, 10) == []  # each run once
    _finish(store, "r1", RunStatus.FAILED, epoch=2)  # fails again after the replay began
    assert store.replay("probe", failed, since, now, 10) == []
    assert _statuses(store, "r0", "r5") == ["failed", "failed"]  # too old; another workflow
    with pytest.raises(InvalidInput, match="failed or incompatible runs, not done"):
        store.replay("probe", (RunStatus.DONE,), since, now, 10)


def test_an_unknown_outcome_resolved_done_or_not_and_the_run_goes_on(
    any_store: CheckpointStore,
) -> None:
    cp = _running(any_store)
    assert any_store.record_intent(cp, "k1") == ("written", None)
    assert any_store.record_intent(cp, "k2") == ("written", None)
    first, second = any_store.open_intents("r1")
    assert (first["key"], first["epoch"], second["key"]) == ("k1", 1, "k2")
    assert first["created_at"] <= second["created_at"]
    any_store.end_attempt(cp, RunStatus.UNKNOWN, "outcome lost", Attempt(started=0.0))
    rearmed, keys = any_store.resolve("r1", True, {"sent": 1})
    assert rearmed is True and sorted(keys) == ["k1", "k2"]
    assert any_store.was_done("k2") == (True, {"sent": 1}) and any_store.open_intents("r1") == []
    run = _load(any_store, "r1")
    assert (run.status, run.error, run.attempts, run.cursor) == ("pending", None, 0, "two")
    assert any_store.resolve("r1", True) == (False, [])  # again: nothing to settle
    other = _running(any_store, "r2")
    assert any_store.record_intent(other, "k3") == ("written", None)
    any_store.end_attempt(other, RunStatus.UNKNOWN, "outcome lost", Attempt(started=0.0))
    assert any_store.resolve("r2", False) == (True, ["k3"])  # not done: the intent goes
    assert any_store.was_done("k3") == (False, None) and any_store.open_intents("r2") == []
    again = any_store.claim("r2", 2)
    assert again is not None and any_store.record_intent(again, "k3") == ("written", None)


def test_wait_returns_a_settled_run_and_times_out_clearly(any_store: CheckpointStore) -> None:
    cp = _running(any_store)
    with pytest.raises(WaitTimedOut, match="r1 is still running at 'two'"):
        any_store.wait("r1", timeout=0.2)
    with pytest.raises(UnknownRun):
        any_store.wait("nope", timeout=1)
    with pytest.raises(WaitTimedOut):
        asyncio.run(any_store.wait_async("r1", timeout=0.2))
    _wait(any_store, cp, Wait(event="go"))
    assert any_store.wait("r1", timeout=5).status == "waiting"  # parked: settled
    run = asyncio.run(any_store.wait_async("r1", timeout=5))
    assert (run.status, run.input, run.state) == ("waiting", {"x": 1}, {})


@pytest.mark.skipif(bool(PGBOUNCER_PORT), reason="PgBouncer passes no notifications")
@pytest.mark.parametrize("waiter", ["sync", "async"])
def test_wait_is_woken_by_the_change_not_by_looking_again(
    any_store: CheckpointStore, waiter: str
) -> None:
    cp = _running(any_store)
    later = threading.Timer(0.3, lambda: any_store.mark_failed(cp, "boom"))
    started = time.monotonic()
    later.start()
    try:
        if waiter == "sync":
            run = any_store.wait("r1", timeout=20, poll=30)  # a look every 30 s: too slow
        else:
            run = asyncio.run(any_store.wait_async("r1", timeout=20, poll=30))
    finally:
        later.join()
    assert (run.status, run.error) == ("failed", "boom")
    assert time.monotonic() - started < 3


def test_the_operators_reads_of_runs(any_store: CheckpointStore) -> None:
    _running(any_store)
    row = any_store.load_row("r1")
    assert row is not None and (row["run_id"], row["status"], row["cursor"]) == (
        "r1", "running", "two",
    )  # fmt: skip
    assert (row["seq"], row["window"], row["input"], row["forked_from"]) == (1, [], {"x": 1}, None)
    assert any_store.load_row("nope") is None
    other = _running(any_store, "r2")
    _wait(any_store, other, Wait(event="go", timeout=60, on_timeout="late"))
    _new(any_store, "r3")
    _finish(any_store, "r3", RunStatus.DONE)
    _new(any_store, "r4")
    _finish(any_store, "r4", RunStatus.FAILED)
    any_store.create_run("r5", "other", {})  # its first step is not known yet
    live = sorted((r["workflow"], r["cursor"], r["runs"]) for r in any_store.live_cursors())
    assert live == [
        ("other", "", 1), ("probe", "late", 1), ("probe", "one", 1), ("probe", "settle", 1),
        ("probe", "two", 1),
    ]  # fmt: skip
    now = any_store.clock()
    assert now.tzinfo is not None and abs((now - dt.datetime.now(dt.UTC)).total_seconds()) < 60
    assert now >= _get(any_store, "r5").updated_at  # after every write so far
    assert any_store.ping() is None


# -- schedules -----------------------------------------------------------------------------
T = dt.datetime(2030, 1, 1, 3, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)


def _schedule(name: str = "nightly", **changes: Any) -> Schedule:
    fields: dict[str, Any] = {
        "name": name, "workflow": "probe", "input": {"n": 1}, "cron": None, "every": 3600,
        "catch_up": "latest", "paused": False, "next_at": T,
    }  # fmt: skip
    return Schedule(**{**fields, **changes})


def test_schedules_are_added_replaced_paused_resumed_and_removed(
    any_store: CheckpointStore,
) -> None:
    s = any_store.schedule_store()
    added = s.add(_schedule(paused=True))  # an added schedule is active
    assert added is not None and (added.name, added.input, added.next_at) == (
        "nightly",
        {"n": 1},
        T,
    )
    assert (added.paused, added.last_fired_at, added.every) == (False, None, 3600)
    assert added.created_at is not None and s.get("nightly") == added
    assert s.add(_schedule(input={"n": 2})) is None  # the name is taken
    # Replaced: a new timing takes its own next tick; the same timing keeps the old one.
    moved = s.add(_schedule(every=7200, next_at=T + HOUR), replace=True)
    assert moved is not None and (moved.every, moved.next_at) == (7200, T + HOUR)
    assert s.pause("nightly") is not None
    kept = s.add(_schedule(every=7200, next_at=T + 5 * HOUR, input={"n": 3}), replace=True)
    assert kept is not None and (kept.next_at, kept.input, kept.paused) == (
        T + HOUR,
        {"n": 3},
        True,
    )
    assert s.resume(_schedule(every=60), T + 2 * HOUR) is None  # replaced meanwhile
    resumed = s.resume(kept, T + 2 * HOUR)
    assert resumed is not None and (resumed.paused, resumed.next_at) == (False, T + 2 * HOUR)
    assert s.resume(kept, T + 3 * HOUR) is None  # not paused
    for name in ("b", "a"):
        s.add(_schedule(name))
    assert [x.name for x in s.list_schedules()] == ["a", "b", "nightly"]
    assert s.remove("nightly") is True and s.remove("nightly") is False
    assert s.get("nightly") is None and s.pause("nightly") is None


def test_a_due_schedule_fires_its_ticks_runs_once(any_store: CheckpointStore) -> None:
    s = any_store.schedule_store()
    for name, at in (("x", T), ("later", T + 2 * HOUR), ("off", T)):
        s.add(_schedule(name, next_at=at))
    s.pause("off")
    [due] = s.due(T + HOUR, 10)
    assert due.name == "x" and s.due(T - HOUR, 10) == []
    made = s.fire(due, T + 2 * HOUR, [("sched:x:1", T), ("sched:x:2", T + HOUR)])
    assert made == ["sched:x:1", "sched:x:2"]
    run = _get(any_store, "sched:x:1")
    assert (run.workflow, run.input, run.status, run.cursor) == ("probe", {"n": 1}, "pending", "")
    fired = s.get("x")
    assert fired is not None and (fired.next_at, fired.last_fired_at) == (T + 2 * HOUR, T + HOUR)
    assert s.fire(due, T + 3 * HOUR, [("sched:x:9", T)]) is None  # another firer moved it
    again = s.fire(fired, T + 3 * HOUR, [("sched:x:2", T + HOUR), ("sched:x:3", T + 2 * HOUR)])
    assert again == ["sched:x:3"]  # a run id made before is left as it is

    def crash() -> None:
        raise RuntimeError("killed before the commit")

    current = s.get("x")
    assert current is not None
    with pytest.raises(RuntimeError):
        s.fire(current, T + 4 * HOUR, [("sched:x:4", T + 3 * HOUR)], before_commit=crash)
    assert s.get("x") == current and any_store.get("sched:x:4") is None  # nothing of it
    assert s.fire(_schedule("off"), T + HOUR, [("sched:off:1", T)]) is None  # paused
