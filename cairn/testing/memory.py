"""In-memory twins of the checkpoint store and the leases, for loop-logic tests without
Postgres, Redis or Celery (procrastinate's InMemoryConnector, LangGraph's InMemorySaver).

    clock = ManualClock()
    store = MemoryStore(clock)
    deps = loop.Deps(settings=Settings(), store=store, leases=MemoryLeases(clock), model=None)
    store.create_run("r1", "my-flow", {})
    assert loop.run("r1", deps) == RunStatus.WAITING    # its first step waits, an hour at most
    clock.advance(3600)                                  # and then the timeout has passed

Each MemoryStore method follows its named query in store/sql/queries.sql clause by clause
(the guard, the claim's fence, what a save writes and answers, a fork's and a rewind's
snapshot), MemorySchedules follows store/sql/schedules.sql, and MemoryLeases follows
store/lua/*.lua. tests/test_store_contract.py runs one suite against these and against
PgStore, ScheduleStore and the Redis Leases: a twin that drifts fails there, not in
production. The whole of the store contract is here, so `cairn.Client(store=MemoryStore())`
is the real Client with no service (cairn.testing.LocalWorker runs what it enqueues).
Where a twin cannot be the real thing (ctx.db has no database) it says so loudly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, cast

from cairn.core.errors import CairnError, LeaseLost, RunIdConflict, StaleWrite, StoreError
from cairn.core.records import (
    CHECKPOINT_VERSION,
    START,
    Attempt,
    Call,
    Checkpoint,
    Run,
    RunFilter,
    Saved,
    Spawned,
    Wait,
)
from cairn.core.status import ACTIVE, IDLE, REARMABLE, STOPPED, TERMINAL, RunStatus
from cairn.store.checkpoints import (
    FOLD_BATCH,
    _checkpoint,
    appended,
    forked,
    replay_params,
    rewound,
    settled,
)
from cairn.store.events import is_origin
from cairn.store.keys import EPOCH_TTL
from cairn.store.lease import LeaseToken
from cairn.store.schedules import Schedule

if TYPE_CHECKING:
    from cairn.store.contract import StepTx

Clock = Callable[[], float]


class ManualClock:
    """A clock a test moves by hand: pass it to MemoryStore and MemoryLeases, then
    `advance(seconds)` to let a wait time out, a retry fall due or a lease expire.
    Starts at the real time, so timestamps a step takes itself (time.time()) agree."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _dump(value: Any) -> str:
    # Stored as JSON text, as jsonb stores it: a caller's later edit of a dict it saved
    # (or read) cannot reach the stored copy, and what JSON cannot hold fails here too.
    return json.dumps(value)


def _status(value: str) -> RunStatus:
    try:
        return RunStatus(value)
    except ValueError:  # the CHECK constraint's refusal
        raise StoreError(f"refused: {value!r} is not a run status") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Signal:
    event: str
    payload: str  # JSON
    created_at: dt.datetime
    consumed_seq: int | None = None
    traceparent: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Snap:
    """What a step_history row keeps of the checkpoint its step saved (the snapshot
    fragment's columns): where a fork or a rewind goes on from."""

    visits: str  # JSON
    win_start: int
    win_end: int
    total_cost: float
    flow_version: int | None
    state: str | None  # JSON; None: unchanged by the step (an older row has it)


@dataclasses.dataclass(kw_only=True)
class _Row:
    """One run: its `runs` row and its `checkpoints` row (one each per run), and the rows
    of the tables keyed by run that the sweep deletes with it. JSON columns hold text."""

    run_id: str
    workflow: str
    input: str
    max_cost_usd: float | None
    created_at: dt.datetime
    cursor: str
    state: str
    version: int
    updated_at: dt.datetime
    seq: int = 0
    visits: str = "{}"
    win_start: int = 0
    win_end: int = 0
    cost_usd: float = 0.0
    status: RunStatus = RunStatus.PENDING
    error: str | None = None
    epoch: int = 0
    resumes: int = 0
    attempts: int = 0
    deliveries: int = 0
    retry_at: dt.datetime | None = None
    cancel_reason: str | None = None
    wait_event: str | None = None
    wait_until: dt.datetime | None = None
    wait_timeout_cursor: str | None = None
    flow_version: int | None = None
    parent_id: str | None = None  # a child run: its parent, the parent's spawn, its depth
    parent_seq: int | None = None
    depth: int = 0
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    priority: int = 0
    traceparent: str | None = None
    forked_from: str | None = None  # a fork: its origin, and the seq it was forked at
    forked_at: int | None = None
    window: dict[int, str] = dataclasses.field(default_factory=dict)  # window_messages
    signals: dict[str, _Signal] = dataclasses.field(default_factory=dict)
    # step_history: each row as the history query selects it, and the checkpoint it saved
    # (a fork's or a rewind's snapshot; None for an attempt that saved nothing)
    history: list[tuple[dict[str, Any], _Snap | None]] = dataclasses.field(default_factory=list)
    # journal: (cursor, visit, pos) -> (the call with its result and error as JSON text, epoch)
    journal: dict[tuple[str, int, int], tuple[Call, int]] = dataclasses.field(default_factory=dict)


class _NoTransaction:
    """What MemoryStore.transaction() gives a step: nothing is open, nothing to close,
    and ctx.db, which needs a real database, says so."""

    open = None

    @property
    def connection(self) -> NoReturn:
        raise CairnError(
            "ctx.db needs PgStore (Postgres): a step's own SQL commits with its checkpoint "
            "in one Postgres transaction, which MemoryStore cannot give; test this step "
            "against PgStore on a real database"
        )

    def close(self) -> None:
        """Nothing to give back."""


class _Changes:
    """The store's lock. Leaving it wakes whoever waits for a run to settle (wait), as the
    status trigger's NOTIFY does in Postgres; a waiter looks again under the lock."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())

    def __enter__(self) -> None:
        self.cond.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cond.notify_all()
        self.cond.release()


class MemoryStore:
    """CheckpointStore in dicts under one lock, with the SQL's semantics; `clock` (seconds,
    as time.time) stands for Postgres's now(), so a test can move time. Give it to
    cairn.Client(store=...) to drive the real Client without a service
    (cairn.testing.LocalWorker runs what it enqueues)."""

    def __init__(self, clock: Clock = time.time) -> None:
        self._clock = clock
        self._lock = _Changes()
        self._rows: dict[str, _Row] = {}
        # key: (run_id, result as JSON text, epoch, done: False while only an intent,
        # created_at)
        self._effects: dict[str, tuple[str, str, int, bool, dt.datetime]] = {}
        # gathers: (parent, spawn seq) -> [need, fired]
        self._gathers: dict[tuple[str, int], list[Any]] = {}
        # concurrency keys: (workflow, key) -> limit; run -> [workflow, key, sent] for the
        # runs holding a slot; run -> (workflow, key, -priority, n) for the queued
        self._keys: dict[tuple[str, str], int] = {}
        self._slots: dict[str, list[Any]] = {}
        self._queued: dict[str, tuple[str, str, int, int]] = {}
        self._queue_n = 0
        self._last = dt.datetime.min.replace(tzinfo=dt.UTC)
        self._schedules = MemorySchedules(self)

    def _now(self) -> dt.datetime:
        """The clock's time: what reads compare with, and what deadlines count from."""
        return dt.datetime.fromtimestamp(self._clock(), dt.UTC)

    def _stamp(self) -> dt.datetime:
        """A write's updated_at (or created_at). Postgres's now() moves on between
        statements; a clock a test holds still must not give two writes one updated_at
        (the reaper's second look compares it), so stamps are bumped a microsecond apart.
        Deadlines count from _now(), unbumped: advancing the clock by a wait's timeout
        ends the wait, however many writes came before."""
        stamp = max(self._now(), self._last + dt.timedelta(microseconds=1))
        self._last = stamp
        return stamp

    # -- runs ------------------------------------------------------------------------
    def create_run(
        self,
        run_id: str,
        workflow: str,
        input: dict[str, Any],
        cursor: str = START,
        max_cost_usd: float | None = None,
        *,
        priority: int = 0,
        concurrency_key: str | None = None,
        concurrency_limit: int = 1,
        traceparent: str | None = None,
    ) -> bool:
        """Insert a run at seq 0; False if it existed (a failed one is re-armed). With a
        concurrency key it is admitted if a slot is free, else queued.

        Raises RunIdConflict if run_id exists with another workflow or input.
        """
        text = _dump(input)
        with self._lock:
            stamp = self._stamp()
            row = self._rows.get(run_id)
            created = row is None
            if concurrency_key is not None:  # create_keyed_run's upsert of the key
                self._keys[(workflow, concurrency_key)] = concurrency_limit
            if row is None:  # create_run
                row = self._new_row(
                    run_id, workflow, text, stamp, cursor, max_cost_usd,
                    priority=priority, traceparent=traceparent, concurrency_key=concurrency_key,
                    concurrency_limit=concurrency_limit if concurrency_key is not None else None,
                )  # fmt: skip
                if concurrency_key is not None:
                    row.status = RunStatus.QUEUED
                    self._enqueue(row)
            if concurrency_key is not None:
                self._admit(workflow, concurrency_key)  # admit
            if created:
                return True
            # existing_run: jsonb equality, so key order does not matter
            same_workflow = row.workflow == workflow
            same_input = json.loads(row.input) == json.loads(text)
            if not (same_workflow and same_input):
                what = "workflow" if not same_workflow else "input"
                raise RunIdConflict(
                    f"run id {run_id!r} already names a {row.workflow!r} run with another "
                    f"{what}; use a new run id, or the same workflow and input to resume it"
                )
            if row.status in REARMABLE:  # rearm_failed
                row.status, row.error, row.attempts, row.deliveries = RunStatus.PENDING, None, 0, 0
                row.retry_at, row.updated_at = None, stamp
                self._rearmed(row)
            return False

    def _new_row(
        self,
        run_id: str,
        workflow: str,
        input: str,
        stamp: dt.datetime,
        cursor: str = START,
        max_cost_usd: float | None = None,
        **columns: Any,
    ) -> _Row:
        """create_run's insert (under the lock): the run at seq 0, pending."""
        row = self._rows[run_id] = _Row(
            run_id=run_id,
            workflow=workflow,
            input=input,
            max_cost_usd=max_cost_usd,
            created_at=stamp,
            cursor=cursor,
            state="{}",
            version=CHECKPOINT_VERSION,
            updated_at=stamp,
            **columns,
        )
        return row

    def admitted(self, workflow: str, key: str) -> list[tuple[str, int]]:
        """The key's runs admitted and not sent yet, each (run id, priority), marked sent."""
        with self._lock:
            out = []
            for run_id, slot in self._slots.items():
                if slot[:2] == [workflow, key] and not slot[2]:
                    slot[2] = True
                    out.append((run_id, self._rows[run_id].priority))
            return out

    def _enqueue(self, row: _Row) -> None:
        assert row.concurrency_key is not None
        self._queue_n += 1
        self._queued[row.run_id] = (row.workflow, row.concurrency_key, -row.priority, self._queue_n)

    def _admit(self, workflow: str, key: str) -> None:
        """cairn_admit: fill the key's free slots from its queue, best first."""
        limit = self._keys.get((workflow, key))
        if limit is None:
            return
        held = sum(1 for slot in self._slots.values() if slot[:2] == [workflow, key])
        waiting = sorted(
            (q[2:], run_id) for run_id, q in self._queued.items() if q[:2] == (workflow, key)
        )
        for _, run_id in waiting[: max(limit - held, 0)]:
            del self._queued[run_id]
            self._slots[run_id] = [workflow, key, False]
            row = self._rows[run_id]
            row.status, row.updated_at = RunStatus.PENDING, self._stamp()
        if not any(s[:2] == [workflow, key] for s in self._slots.values()) and not any(
            q[:2] == (workflow, key) for q in self._queued.values()
        ):
            del self._keys[(workflow, key)]  # idle: forgotten

    def _rearmed(self, row: _Row) -> None:
        """cairn_run_rearmed: a re-armed run with a key takes a free slot, or queues."""
        key = row.concurrency_key
        if key is None:
            return
        limit = self._keys.setdefault((row.workflow, key), row.concurrency_limit or 1)
        held = sum(1 for slot in self._slots.values() if slot[:2] == [row.workflow, key])
        if held < limit:
            self._slots[row.run_id] = [row.workflow, key, True]
        else:
            row.status = RunStatus.QUEUED
            self._enqueue(row)

    def get(self, run_id: str) -> Run | None:
        """The run without its window."""
        with self._lock:
            row = self._rows.get(run_id)
            return self._run(row) if row is not None else None

    def load_row(self, run_id: str) -> dict[str, Any] | None:
        """The run's checkpoint as `load` selects it, unparsed (forked_from with it)."""
        with self._lock:
            row = self._rows.get(run_id)
            return (
                {**self._columns(row, self._now()), "forked_from": row.forked_from} if row else None
            )

    def load(self, run_id: str) -> Checkpoint | None:
        """The run's checkpoint with its live window, or None: no such run."""
        with self._lock:
            row = self._rows.get(run_id)
            return _checkpoint(self._columns(row, self._now())) if row else None

    def claim(self, run_id: str, epoch: int) -> Checkpoint | None:
        """Fence the run at epoch and return it; None if it stopped or its epoch is not
        older. Like the SQL, the fence is written before the row is read back (a row this
        code cannot parse is fenced, then refused)."""
        with self._lock:
            row = self._rows.get(run_id)
            if row is None or row.epoch >= epoch or row.status in IDLE:
                return None
            row.epoch, row.retry_at, row.updated_at = epoch, None, self._stamp()
            row.deliveries += 0 if row.status == RunStatus.WAITING else 1
            return _checkpoint(self._columns(row, self._now()))

    # -- the per-step write ----------------------------------------------------------
    def transaction(self) -> _NoTransaction:
        """No database: ctx.db raises, saying it needs PgStore."""
        return _NoTransaction()

    @staticmethod
    def outage(exc: BaseException) -> Exception | None:
        """None: no driver here, so no step's error is a store outage."""
        return None

    def save(
        self,
        cp: Checkpoint,
        previous: Checkpoint,
        tx: StepTx | None = None,
        attempt: Attempt | None = None,
        wait: Wait | None = None,
        spawn: Spawned | None = None,
    ) -> Saved:
        """Write cp (its window's new messages, the step's history row, the wait, the
        signal it consumed, the children it spawned) if its seq is newer and its epoch not
        older; else StaleWrite. tx is ignored: a MemoryStore transaction never opens."""
        first_idx, messages = appended(previous, cp)
        attempt = attempt or Attempt(started=self._clock())
        status, state, visits = _status(cp.status), _dump(cp.state), _dump(cp.visits)
        texts = [_dump(m) for m in messages]
        with self._lock:
            now, stamp = self._now(), self._stamp()
            row = self._rows.get(cp.run_id)
            if row is None:  # the checkpoint's foreign key: the run was swept, or never was
                raise StoreError(f"refused: no run {cp.run_id!r} to save a checkpoint for")
            if not (row.seq < cp.seq and row.epoch <= cp.epoch):  # the guard
                raise StaleWrite(cp.run_id, cp.seq, cp.epoch)
            old = row.status
            row.seq, row.cursor, row.state, row.visits = cp.seq, cp.cursor, state, visits
            row.win_start, row.win_end, row.cost_usd = cp.win_start, cp.win_end, cp.cost_usd
            row.version, row.status, row.error, row.epoch = cp.version, status, cp.error, cp.epoch
            row.resumes, row.updated_at, row.attempts, row.deliveries = cp.resumes, stamp, 0, 0
            row.retry_at, row.flow_version = None, cp.flow_version
            row.wait_event = wait.event if wait else None
            timeout = wait.timeout if wait else None
            row.wait_until = now + dt.timedelta(seconds=timeout) if timeout is not None else None
            row.wait_timeout_cursor = wait.on_timeout if wait else None
            for i, text in enumerate(texts):  # appended: the new tail, or a fresh range
                row.window[first_idx + i] = text
            # The state only when the step changed it (the SQL's state_changed)
            changed = cp.state != previous.state or previous.seq == 0
            snap = _Snap(
                visits=visits,
                win_start=cp.win_start,
                win_end=cp.win_end,
                total_cost=cp.cost_usd,
                flow_version=cp.flow_version,
                state=state if changed else None,
            )
            shown = self._history(
                cp.seq - 1,
                previous.cursor,
                previous.visits.get(previous.cursor, 0),
                "saved",
                attempt,
                cp.epoch,
                cp.cost_usd - previous.cost_usd,
                None,
                stamp,
                cp.cursor,
            )
            row.history.append((shown, snap))
            consumed = row.signals.get(attempt.signal_id or "")
            if attempt.signal_id is not None and consumed is not None:
                row.signals[attempt.signal_id] = dataclasses.replace(consumed, consumed_seq=cp.seq)
            if spawn is not None:
                self._spawn(row, spawn, stamp)
            if old in ACTIVE and row.status in STOPPED:
                self._stopped(row)
            signalled = row.wait_event is not None and self._pending(row) is not None
            return Saved(row.cancel_reason, signalled)

    def _spawn(self, parent: _Row, spawn: Spawned, stamp: dt.datetime) -> None:
        """save_spawn's children and gather row (an existing run id is left as it is)."""
        for n, (run_id, workflow, data) in enumerate(spawn.children):
            if run_id not in self._rows:
                made = stamp + dt.timedelta(microseconds=n)
                self._rows[run_id] = _Row(
                    run_id=run_id,
                    workflow=workflow,
                    input=_dump(data),
                    max_cost_usd=None,
                    created_at=made,
                    cursor=START,
                    state="{}",
                    version=CHECKPOINT_VERSION,
                    updated_at=made,
                    parent_id=parent.run_id,
                    parent_seq=parent.seq,
                    depth=spawn.depth,
                    traceparent=spawn.traceparent,
                )
        self._gathers.setdefault((parent.run_id, parent.seq), [spawn.need, False])

    def _stopped(self, row: _Row) -> None:
        """The cairn_run_stopped trigger: a run that stopped gives back its key's slot (or
        its place in the queue) and counts toward its parent's spawn (whose signal is
        written once enough stopped); a cancelled one cancels its children."""
        if row.concurrency_key is not None:
            self._queued.pop(row.run_id, None)
            if self._slots.pop(row.run_id, None) is not None:
                self._admit(row.workflow, row.concurrency_key)
        key = (row.parent_id or "", row.parent_seq or 0)
        gather = self._gathers.get(key) if row.parent_id is not None else None
        if gather is not None and not gather[1]:
            stopped = sum(
                1
                for r in self._rows.values()
                if (r.parent_id, r.parent_seq) == key and r.status in STOPPED
            )
            parent = self._rows.get(key[0])
            if stopped >= gather[0] and parent is not None:
                gather[1] = True
                event = f"cairn.children:{key[1]}"
                if event not in parent.signals:
                    parent.signals[event] = _Signal(
                        event=event, payload=_dump({"seq": key[1]}), created_at=self._stamp()
                    )
        if row.status == RunStatus.CANCELLED:
            for child in [r for r in self._rows.values() if r.parent_id == row.run_id]:
                if child.status not in ACTIVE:
                    continue
                if child.cancel_reason is None:
                    child.cancel_reason = "its parent was cancelled"
                if child.status != RunStatus.RUNNING:
                    child.status, child.error = RunStatus.CANCELLED, child.cancel_reason
                    child.updated_at = self._stamp()
                    self._stopped(child)

    def end_attempt(
        self,
        cp: Checkpoint,
        status: RunStatus,
        error: str,
        attempt: Attempt | None = None,
        retry_in: float | None = None,
    ) -> int | None:
        """Record a step attempt that did not save: a retry in retry_in seconds (status
        running), or the run stopping with status. Fenced like a save; returns the run's
        failed attempts so far, or None if another worker owns the run."""
        counted = retry_in is not None or status == RunStatus.FAILED
        checked = _status(status)
        with self._lock:
            return self._end_attempt(cp, checked, error, attempt, retry_in, counted)

    def _end_attempt(
        self,
        cp: Checkpoint,
        status: RunStatus,
        error: str,
        attempt: Attempt | None,
        retry_in: float | None,
        counted: bool,
    ) -> int | None:
        now, stamp = self._now(), self._stamp()
        row = self._rows.get(cp.run_id)
        if row is None or row.epoch > cp.epoch or row.seq != cp.seq or row.status == RunStatus.DONE:
            return None
        old = row.status
        row.status, row.error = status, error[:4000]
        if old in ACTIVE and status in STOPPED:
            self._stopped(row)
        row.attempts += int(counted and attempt is not None)
        row.retry_at = now + dt.timedelta(seconds=retry_in) if retry_in is not None else None
        row.updated_at = stamp
        if attempt is not None:
            outcome = "retry" if retry_in is not None else str(status)
            visit = cp.visits.get(cp.cursor, 0)
            shown = self._history(
                cp.seq, cp.cursor, visit, outcome, attempt, cp.epoch, 0.0, error[:4000], stamp
            )
            row.history.append((shown, None))
        return row.attempts

    def mark_failed(self, cp: Checkpoint, error: str, attempt: Attempt | None = None) -> bool:
        """Fail the run with error, its checkpoint data untouched."""
        return self.end_attempt(cp, RunStatus.FAILED, error, attempt) is not None

    def mark_unreadable(self, run_id: str, status: RunStatus, error: str) -> bool:
        """Status and error for a row this code cannot parse, whatever its seq."""
        with self._lock:
            row = self._rows.get(run_id)
            if row is None:
                return False
            cp = Checkpoint(
                run_id=run_id,
                workflow=row.workflow,
                input={},
                seq=row.seq,
                cursor=row.cursor,
                state={},
                visits={},
                window=(),
                win_start=0,
                cost_usd=0.0,
                epoch=row.epoch,
            )
            counted = status == RunStatus.FAILED
            return self._end_attempt(cp, _status(status), error, None, None, counted) is not None

    def signal(
        self, run_id: str, event: str, payload: Any, signal_id: str, traceparent: str | None = None
    ) -> tuple[RunStatus, bool] | None:
        """Store a signal (the same id twice is one signal): (the run's status, whether it
        was new), or None: no such run."""
        text = _dump(payload)
        with self._lock:
            stamp = self._stamp()  # signals are taken oldest first
            row = self._rows.get(run_id)
            if row is None:
                return None
            stored = signal_id not in row.signals
            if stored:
                row.signals[signal_id] = _Signal(
                    event=event, payload=text, created_at=stamp, traceparent=traceparent
                )
            return row.status, stored

    def cancel_reason(self, run_id: str) -> str | None:
        """Why the run was cancelled, or None."""
        with self._lock:
            row = self._rows.get(run_id)
            return row.cancel_reason if row else None

    def cancel(self, run_id: str, reason: str) -> RunStatus | None:
        """Ask the run to stop: one no worker holds (pending, waiting) at once, a running
        one at its next step boundary. Its status now, or None: no such run, or ended."""
        with self._lock:
            stamp = self._stamp()
            row = self._rows.get(run_id)
            if row is None or row.status not in ACTIVE:
                return None
            if row.cancel_reason is None:
                row.cancel_reason = reason
            if row.status != RunStatus.RUNNING:
                row.status, row.error = RunStatus.CANCELLED, reason
                row.updated_at = stamp
                self._stopped(row)
            row.updated_at = stamp
            return row.status

    def children(self, run_id: str, seq: int | None = None, limit: int = 10_000) -> list[Run]:
        """The run's children (of the spawn saved at seq, or all), in their spawn's order."""
        with self._lock:
            kids = [
                r
                for r in self._rows.values()
                if r.parent_id == run_id and (seq is None or r.parent_seq == seq)
            ]
            kids.sort(key=lambda r: (r.parent_seq or 0, r.created_at, r.run_id))
            return [Run(**self._listed(r), state=json.loads(r.state)) for r in kids[:limit]]

    def gathered(self, run_id: str) -> bool:
        """Whether the run waits for a spawn that has gathered: its signal is unconsumed."""
        with self._lock:
            row = self._rows.get(run_id)
            return (
                row is not None
                and row.status == RunStatus.WAITING
                and row.wait_event is not None
                and self._pending(row) is not None
            )

    def history(self, run_id: str) -> list[dict[str, Any]]:
        """The run's step attempts, oldest first."""
        with self._lock:
            row = self._rows.get(run_id)
            return [dict(h) for h, _ in row.history] if row else []

    def calls(self, run_id: str, limit: int = 500) -> list[dict[str, Any]]:
        """The run's journaled calls, oldest first (calls in SQL)."""
        with self._lock:
            row = self._rows.get(run_id)
            found = [
                {"cursor": cursor, "visit": visit, **dataclasses.asdict(_loaded(call))}
                for (cursor, visit, _), (call, _) in (row.journal.items() if row else ())
            ]
        return found[:limit]

    # -- forks, rewinds, replays, waits ------------------------------------------------
    def fork(
        self,
        origin: str,
        at: int,
        run_id: str,
        patch: dict[str, Any] | None = None,
        traceparent: str | None = None,
    ) -> bool:
        """Create run_id, pending, from the checkpoint origin saved at seq `at` (fork in
        the SQL): its input patched, its state, cursor, visits and window there, its cost
        at 0, a `forked` mark in its history. False if run_id existed (unchanged). Raises
        UnknownRun, or InvalidInput when origin saved no checkpoint at that seq."""
        extra = json.loads(_dump(patch or {}))
        with self._lock:
            src = self._rows.get(origin)
            found = self._snapshot(src, at) if src is not None else None
            made = src is not None and found is not None and run_id not in self._rows
            if made:
                assert src is not None and found is not None
                cursor, snap = found
                stamp = self._stamp()
                row = self._new_row(
                    run_id, src.workflow, _dump({**json.loads(src.input), **extra}), stamp,
                    cursor, src.max_cost_usd, priority=src.priority, traceparent=traceparent,
                    forked_from=origin, forked_at=at, seq=at, visits=snap.visits,
                    win_start=snap.win_start, win_end=snap.win_end,
                    flow_version=snap.flow_version,
                )  # fmt: skip
                row.state = snap.state or "{}"
                row.window = {
                    i: src.window[i] for i in range(snap.win_start, snap.win_end) if i in src.window
                }
                mark = self._history(
                    at - 1, cursor, 0, "forked", Attempt(started=stamp.timestamp(), worker="client"),
                    0, 0.0, f"forked from {origin} at seq {at}", stamp, cursor,
                )  # fmt: skip
                row.history.append((mark, dataclasses.replace(snap, total_cost=0.0)))
            answer = {
                "origin_found": src is not None,
                "found": found is not None,
                "run_id": run_id if made else None,
            }
        return forked(answer, origin, at)

    def rewind(self, run_id: str, at: int) -> int:
        """Move the stopped run back to the checkpoint it saved at seq `at`, in place (rewind
        in the SQL): at a new seq, its visits past every visit it ever made of each step,
        its cost kept, a `rewound` mark in its history; its new seq. Raises UnknownRun,
        InvalidInput (no checkpoint at that seq), or RunNotStopped."""
        with self._lock:
            row = self._rows.get(run_id)
            found = self._snapshot(row, at) if row is not None else None
            answer: dict[str, Any] = {
                "status": row.status if row is not None else None,
                "found": found is not None,
                "seq": None,
            }
            if row is not None and found is not None and row.status in STOPPED:
                cursor, snap = found
                used: dict[str, int] = {}  # each step's next unused visit
                steps = [(h["cursor"], h["visit"]) for h, _ in row.history]
                for step, visit in steps + [(c, v) for c, v, _ in row.journal]:
                    used[step] = max(used.get(step, 0), visit + 1)
                kept = json.loads(snap.visits)
                visits = {k: max(kept.get(k, 0), used.get(k, 0)) for k in {*kept, *used}}
                old, stamp = row.status, self._stamp()
                row.seq, row.cursor, row.state = row.seq + 1, cursor, snap.state or "{}"
                row.visits, row.win_start, row.win_end = _dump(visits), snap.win_start, snap.win_end
                row.flow_version, row.status, row.error = snap.flow_version, RunStatus.PENDING, None
                row.attempts, row.deliveries, row.retry_at, row.cancel_reason = 0, 0, None, None
                row.wait_event = row.wait_until = row.wait_timeout_cursor = None
                row.updated_at = stamp
                mark = self._history(
                    row.seq - 1, cursor, 0, "rewound",
                    Attempt(started=stamp.timestamp(), worker="client"), row.epoch, 0.0,
                    f"rewound to seq {at}", stamp, cursor,
                )  # fmt: skip
                moved = dataclasses.replace(snap, visits=row.visits, total_cost=row.cost_usd)
                row.history.append((mark, moved))
                if old in REARMABLE or old == RunStatus.UNKNOWN:  # cairn_run_rearmed
                    self._rearmed(row)
                answer["seq"] = row.seq
        return rewound(answer, run_id, at)

    def replay(
        self,
        workflow: str,
        statuses: tuple[RunStatus, ...],
        since: dt.datetime,
        until: dt.datetime,
        limit: int,
        *,
        dry_run: bool = False,
    ) -> list[Run]:
        """Re-arm up to limit of the workflow's runs that stopped in one of the statuses in
        [since, until) (by their last change), oldest first, each as it stopped (replay
        in the SQL); dry_run: only which."""
        replay_params(workflow, statuses, since, until, limit)  # the same refusals
        with self._lock:
            picked = sorted(
                (
                    r
                    for r in self._rows.values()
                    if r.status in statuses
                    and r.workflow == workflow
                    and since <= r.updated_at < until
                ),
                key=lambda r: (r.updated_at, r.run_id),
            )[:limit]
            out = [Run(**self._listed(r)) for r in picked]
            if not dry_run:
                for r in picked:
                    r.status, r.error, r.attempts, r.deliveries = RunStatus.PENDING, None, 0, 0
                    r.retry_at, r.updated_at = None, self._stamp()
                    self._rearmed(r)
            return out

    def forks(self, run_id: str) -> list[Run]:
        """The runs forked from run_id, oldest first."""
        with self._lock:
            found = sorted(
                (r for r in self._rows.values() if r.forked_from == run_id),
                key=lambda r: (r.created_at, r.run_id),
            )
            keep = ("parent_id", "concurrency_key", "priority")  # not among forks' columns
            return [
                Run(
                    **{k: v for k, v in self._listed(r).items() if k not in keep},
                    forked_from=r.forked_from,
                    forked_at=r.forked_at,
                )
                for r in found
            ]

    def clock(self) -> dt.datetime:
        """The clock's time now, and after every write so far (as clock_timestamp() is
        after every commit): a clock a test holds still moves writes a microsecond on."""
        with self._lock:
            return self._stamp()

    def ping(self) -> None:
        """Always answers: nothing to reach."""

    def wait(self, run_id: str, timeout: float | None = None, poll: float = 2.0) -> Run:
        """The run once it is stopped or waiting (cairn.status.SETTLED), woken by any
        change to the store (its lock's release) and looking again every poll seconds.
        Raises UnknownRun, or WaitTimedOut after timeout seconds (real ones, not the
        clock's; None: no limit)."""
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        cond = self._lock.cond
        with cond:  # the bare condition: a waiter's looks wake no other waiter
            while True:
                row = self._rows.get(run_id)
                run = self._run(row) if row is not None else None
                left = settled(run_id, run, timeout, deadline)
                if left is None:
                    assert run is not None
                    return run
                cond.wait(min(poll, left))

    async def wait_async(self, run_id: str, timeout: float | None = None, poll: float = 2.0) -> Run:
        """wait() in a worker thread."""
        return await asyncio.to_thread(self.wait, run_id, timeout, poll)

    def live_cursors(self) -> list[dict[str, Any]]:
        """Where runs that may still go on stand (live_cursors in the SQL): {workflow,
        cursor, runs}, a waiting run's timeout cursor too."""
        live = ACTIVE | REARMABLE | {RunStatus.UNKNOWN}
        counted: dict[tuple[str, str], int] = {}
        with self._lock:
            for r in self._rows.values():
                if r.status not in live:
                    continue
                for cursor in (r.cursor, r.wait_timeout_cursor):
                    if cursor is not None:
                        counted[(r.workflow, cursor)] = counted.get((r.workflow, cursor), 0) + 1
        return [{"workflow": w, "cursor": c, "runs": n} for (w, c), n in sorted(counted.items())]

    def schedule_store(self) -> MemorySchedules:
        """The schedules kept beside these runs."""
        return self._schedules

    def _snapshot(self, row: _Row, at: int) -> tuple[str, _Snap] | None:
        """The snapshot fragment: the checkpoint the run saved at seq `at` (the latest
        history row that saved it, or a fork's or a rewind's mark), with the state as of
        then (the last row up to it that changed it): (its cursor, the snapshot)."""
        for i in range(len(row.history) - 1, -1, -1):
            shown, snap = row.history[i]
            if snap is None or shown["seq"] != at - 1 or shown["next_cursor"] is None:
                continue
            if shown["outcome"] not in ("saved", "forked", "rewound"):
                continue
            state = next(
                (s.state for _, s in reversed(row.history[: i + 1]) if s and s.state), None
            )
            return shown["next_cursor"], dataclasses.replace(snap, state=state)
        return None

    # -- ledger ----------------------------------------------------------------------
    def was_done(self, key: str) -> tuple[bool, Any]:
        """Whether the ledger holds key's done mark, and the effect's recorded result."""
        with self._lock:
            found = self._effects.get(key)
        return (True, json.loads(found[1])) if found and found[3] else (False, None)

    def mark_done(self, cp: Checkpoint, key: str, result: Any) -> bool:
        """Record that the effect of key ran (over its intent), fenced like a save; the
        first mark stays. False if fenced."""
        text = _dump(result)
        with self._lock:
            row = self._rows.get(cp.run_id)
            if row is None or row.seq != cp.seq or row.epoch > cp.epoch:
                return False
            found = self._effects.get(key)
            if found is None or not found[3]:
                made = found[4] if found is not None else self._stamp()
                self._effects[key] = (cp.run_id, text, cp.epoch, True, made)
            return True

    def record_intent(self, cp: Checkpoint, key: str) -> tuple[str, Any]:
        """record_intent and intent_state of the SQL: written, open, done or fenced."""
        with self._lock:
            row = self._rows.get(cp.run_id)
            found = self._effects.get(key)
            fenced = row is None or row.seq != cp.seq or row.epoch > cp.epoch
            if found is None:
                if fenced:
                    return "fenced", None
                self._effects[key] = (cp.run_id, "null", cp.epoch, False, self._stamp())
                return "written", None
            if found[3]:
                return "done", json.loads(found[1])
            if not fenced and found[2] == cp.epoch:
                return "written", None  # this writer's own intent (a retried write)
            return "open", None

    def open_intents(self, run_id: str) -> list[dict[str, Any]]:
        """The run's effects with an intent and no mark: {key, epoch, created_at}, oldest
        first."""
        with self._lock:
            found = [
                (v[4], k, v[2]) for k, v in self._effects.items() if v[0] == run_id and not v[3]
            ]
        return [{"key": k, "epoch": e, "created_at": t} for t, k, e in sorted(found)]

    def resolve(self, run_id: str, done: bool, result: Any = None) -> tuple[bool, list[str]]:
        """Settle the run's unknown effects and re-arm it if it stopped as unknown."""
        text = _dump(result)
        with self._lock:
            keys = [k for k, v in sorted(self._effects.items()) if v[0] == run_id and not v[3]]
            for k in keys:
                if done:
                    run, _, epoch, _, made = self._effects[k]
                    self._effects[k] = (run, text, epoch, True, made)
                else:
                    del self._effects[k]
            row = self._rows.get(run_id)
            rearmed = row is not None and row.status == RunStatus.UNKNOWN
            if row is not None and rearmed:
                row.status, row.error, row.attempts, row.deliveries = RunStatus.PENDING, None, 0, 0
                row.retry_at, row.updated_at = None, self._stamp()
                self._rearmed(row)
            return rearmed, keys

    # -- journal ---------------------------------------------------------------------
    def journal(self, run_id: str, cursor: str, visit: int) -> list[Call]:
        """The calls recorded for the step's visit, in order."""
        with self._lock:
            row = self._rows.get(run_id)
            found = sorted(
                (key[2], call)
                for key, (call, _) in (row.journal.items() if row else ())
                if key[:2] == (cursor, visit)
            )
        return [_loaded(call) for _, call in found]

    def record_call(self, cp: Checkpoint, visit: int, call: Call, tx: Any = None) -> bool:
        """Journal call for the step at cp, fenced like a save (record_call in the SQL);
        False if fenced. The same writer recording it again gets True."""
        stored = dataclasses.replace(
            call,
            result=_dump(call.result) if call.error is None else None,
            # JSON text in a field typed for the parsed dict, as the SQL store's row has it
            error=cast(Any, _dump(call.error)) if call.error is not None else None,
        )
        with self._lock:
            row = self._rows.get(cp.run_id)
            if row is None or row.seq != cp.seq or row.epoch > cp.epoch:
                return False
            key = (cp.cursor, visit, call.pos)
            if key in row.journal:
                held, epoch = row.journal[key]
                if not (epoch == cp.epoch and held.name == call.name):
                    return False
            else:
                row.journal[key] = (stored, cp.epoch)
            row.deliveries = min(row.deliveries, 1)  # progress: not poison
            return True

    # -- queries for the CLI, the reaper and the sweep -------------------------------
    def list_runs(self, which: RunFilter | None = None) -> list[Run]:
        """Runs newest first, created in [since, until); after: the last run id of the
        previous page (an unknown one ends the list, as the SQL's keyset does)."""
        w = which or RunFilter()
        with self._lock:
            rows: Iterable[_Row] = self._rows.values()
            if w.after is not None:
                mark = self._rows.get(w.after)
                if mark is None:
                    return []
                at = (mark.created_at, w.after)
                rows = [r for r in rows if (r.created_at, r.run_id) < at]
            found = [
                r
                for r in rows
                if (w.status is None or r.status == w.status)
                and (w.workflow is None or r.workflow == w.workflow)
                and (w.since is None or r.created_at >= w.since)
                and (w.until is None or r.created_at < w.until)
            ]
            found.sort(key=lambda r: (r.created_at, r.run_id), reverse=True)
            return [Run(**self._listed(r)) for r in found[: w.limit]]

    def counts(self) -> dict[str, dict[str, Any]]:
        """Runs per status ({status: {"n": ...}}), the statuses that have runs."""
        with self._lock:
            totals: dict[str, int] = {}
            for row in self._rows.values():
                totals[str(row.status)] = totals.get(str(row.status), 0) + 1
        return {s: {"status": s, "n": n, "unfolded": 0} for s, n in totals.items()}

    def fold_counts(self, batch: int = FOLD_BATCH) -> int:
        """0: counts are read from the rows themselves, so there are no deltas to fold."""
        return 0

    def stalled(self, pending_after: float, running_after: float) -> list[dict[str, Any]]:
        """Reaper candidates: {run_id, status, epoch, updated_at} (see the SQL's stalled)."""
        with self._lock:
            now = self._now()
            running_since = now - dt.timedelta(seconds=running_after)
            pending_since = now - dt.timedelta(seconds=pending_after)
            found = []
            for r in self._rows.values():
                claimed = r.status == RunStatus.RUNNING or (
                    r.status == RunStatus.PENDING and r.epoch > 0
                )
                quiet = (claimed and r.updated_at < running_since) or (
                    r.status == RunStatus.PENDING and r.updated_at < pending_since
                )
                due = r.retry_at is None or r.retry_at < running_since
                woken = r.status == RunStatus.WAITING and (
                    (r.wait_until is not None and r.wait_until < now)
                    or any(s.created_at < running_since for _, s in _unconsumed(r, r.wait_event))
                )
                if (quiet and due) or woken:
                    found.append(
                        {
                            "run_id": r.run_id,
                            "status": str(r.status),
                            "epoch": r.epoch,
                            "updated_at": r.updated_at,
                        }
                    )
            return found

    def unclaimed(self, older_than: float, limit: int = 10_000) -> list[dict[str, Any]]:
        """Pending runs no worker has taken, sent over older_than seconds ago, oldest
        first: {run_id, epoch, updated_at}."""
        with self._lock:
            since = self._now() - dt.timedelta(seconds=older_than)
            found = sorted(
                (
                    r
                    for r in self._rows.values()
                    if r.status == RunStatus.PENDING and r.epoch == 0 and r.updated_at < since
                ),
                key=lambda r: (r.updated_at, r.run_id),
            )
            return [
                {"run_id": r.run_id, "epoch": r.epoch, "updated_at": r.updated_at}
                for r in found[:limit]
            ]

    def unchanged(self, rows: list[dict[str, Any]]) -> set[str]:
        """The run ids among rows (as stalled or unclaimed listed them) whose epoch and
        updated_at are still the same."""
        with self._lock:
            return {
                r["run_id"]
                for r in rows
                if (row := self._rows.get(r["run_id"])) is not None
                and (row.epoch, row.updated_at) == (r["epoch"], r["updated_at"])
            }

    def sweep(
        self,
        older_than: float,
        batch: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Delete terminal runs older than older_than seconds with their window, ledger,
        history and signals, batch runs at a time; returns how many went."""
        total = 0
        while True:
            with self._lock:
                since = self._now() - dt.timedelta(seconds=older_than)
                old = [
                    r.run_id
                    for r in self._rows.values()
                    if r.status in TERMINAL and r.updated_at < since
                ][:batch]
                for run_id in old:
                    del self._rows[run_id]
                gone = set(old)
                for key in [k for k, (run_id, *_) in self._effects.items() if run_id in gone]:
                    del self._effects[key]
            total += len(old)
            if progress is not None and old:
                progress(total)
            if len(old) < batch:
                return total

    # -- helpers, called under the lock ----------------------------------------------
    @staticmethod
    def _pending(row: _Row) -> tuple[str, _Signal] | None:
        """The oldest signal not consumed yet of the event the run waits for, by id."""
        found = _unconsumed(row, row.wait_event)
        return found[0] if found else None

    def _columns(self, row: _Row, now: dt.datetime) -> dict[str, Any]:
        """The row as `load` and `claim` select it (the checkpoint_columns fragment)."""
        pending = self._pending(row)
        return {
            "run_id": row.run_id,
            "workflow": row.workflow,
            "input": json.loads(row.input),
            "seq": row.seq,
            "cursor": row.cursor,
            "state": json.loads(row.state),
            "visits": json.loads(row.visits),
            "win_start": row.win_start,
            "win_end": row.win_end,
            "cost_usd": row.cost_usd,
            "version": row.version,
            "status": row.status,
            "error": row.error,
            "epoch": row.epoch,
            "resumes": row.resumes,
            "updated_at": row.updated_at,
            "attempts": row.attempts,
            "deliveries": row.deliveries,
            "cancel_reason": row.cancel_reason,
            "max_cost_usd": row.max_cost_usd,
            "wait_event": row.wait_event,
            "wait_timeout_cursor": row.wait_timeout_cursor,
            "wait_over": row.wait_until is not None and row.wait_until <= now,
            "flow_version": row.flow_version,
            "parent_id": row.parent_id,
            "depth": row.depth,
            "concurrency_key": row.concurrency_key,
            "priority": row.priority,
            "traceparent": row.traceparent,
            "forked_at": row.forked_at,
            "signal": _signal_of(*pending) if pending else None,
            "window": [
                json.loads(row.window[i])
                for i in range(row.win_start, row.win_end)
                if i in row.window
            ],
        }

    @classmethod
    def _run(cls, row: _Row) -> Run:
        """The run as get_run selects it."""
        return Run(
            **cls._listed(row),
            input=json.loads(row.input),
            state=json.loads(row.state),
            traceparent=row.traceparent,
            forked_from=row.forked_from,
            forked_at=row.forked_at,
        )

    @staticmethod
    def _listed(row: _Row) -> dict[str, Any]:
        """What list_runs and get select of a run."""
        return {
            "run_id": row.run_id,
            "workflow": row.workflow,
            "status": row.status,
            "cursor": row.cursor,
            "seq": row.seq,
            "cost_usd": row.cost_usd,
            "resumes": row.resumes,
            "error": row.error,
            "created_at": row.created_at,
            "updated_at": row.updated_at,
            "parent_id": row.parent_id,
            "concurrency_key": row.concurrency_key,
            "priority": row.priority,
        }

    @staticmethod
    def _history(
        seq: int,
        cursor: str,
        visit: int,
        outcome: str,
        attempt: Attempt,
        epoch: int,
        cost_usd: float,
        error: str | None,
        ended_at: dt.datetime,
        next_cursor: str | None = None,
    ) -> dict[str, Any]:
        """One step_history row, as the history query selects it."""
        return {
            "seq": seq,
            "cursor": cursor,
            "visit": visit,
            "outcome": outcome,
            "started_at": dt.datetime.fromtimestamp(attempt.started, dt.UTC),
            "ended_at": ended_at,
            "worker": attempt.worker,
            "epoch": epoch,
            "cost_usd": cost_usd,
            "effect_key": attempt.effect_key,
            "error": error,
            "next_cursor": next_cursor,
        }


class MemorySchedules:
    """Schedules in a dict, beside a MemoryStore (a fired tick's runs are created in it),
    as store/sql/schedules.sql keeps them: MemoryStore.schedule_store() gives it."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._rows: dict[str, Schedule] = {}

    def add(self, schedule: Schedule, *, replace: bool = False) -> Schedule | None:
        """Insert (or with replace, overwrite) the schedule; None if the name was taken.
        Replaced, it keeps its paused state, and its next tick if the timing is the same."""
        data = json.loads(_dump(dict(schedule.input)))  # a copy, as jsonb keeps it
        with self._store._lock:
            old = self._rows.get(schedule.name)
            if old is not None and not replace:
                return None
            if old is None:
                new = dataclasses.replace(
                    schedule,
                    input=data,
                    paused=False,
                    last_fired_at=None,
                    created_at=self._store._stamp(),
                )
            else:
                same = (old.cron, old.every) == (schedule.cron, schedule.every)
                new = dataclasses.replace(
                    old,
                    workflow=schedule.workflow,
                    input=data,
                    catch_up=schedule.catch_up,
                    cron=schedule.cron,
                    every=schedule.every,
                    next_at=old.next_at if same else schedule.next_at,
                )
            self._rows[schedule.name] = new
            return new

    def get(self, name: str) -> Schedule | None:
        """The schedule of that name, or None."""
        with self._store._lock:
            return self._rows.get(name)

    def list_schedules(self) -> list[Schedule]:
        """Every schedule, by name."""
        with self._store._lock:
            return [self._rows[n] for n in sorted(self._rows)]

    def pause(self, name: str) -> Schedule | None:
        """Stop firing it; None: no such schedule."""
        with self._store._lock:
            return self._set(name, paused=True)

    def resume(self, current: Schedule, next_at: dt.datetime) -> Schedule | None:
        """Unpause at next_at; None if it was not paused, or its timing is not current's
        (replaced meanwhile)."""
        with self._store._lock:
            row = self._rows.get(current.name)
            if (
                row is None
                or not row.paused
                or (row.cron, row.every) != (current.cron, current.every)
            ):
                return None
            return self._set(current.name, paused=False, next_at=next_at)

    def remove(self, name: str) -> bool:
        """Delete it; False if there was none."""
        with self._store._lock:
            return self._rows.pop(name, None) is not None

    def due(self, now: dt.datetime, limit: int) -> list[Schedule]:
        """The active schedules whose next tick has come, oldest first."""
        with self._store._lock:
            found = [s for s in self._rows.values() if not s.paused and s.next_at <= now]
        return sorted(found, key=lambda s: (s.next_at, s.name))[:limit]

    def fire(
        self,
        schedule: Schedule,
        next_at: dt.datetime,
        runs: Sequence[tuple[str, dt.datetime]],
        *,
        before_commit: Callable[[], None] | None = None,
    ) -> list[str] | None:
        """Move next_at from the tick the schedule was read at (a compare-and-set) and
        create the runs, at once; the run ids created (an existing one is left as it is),
        or None if next_at had moved, or it was paused or removed. before_commit raising
        leaves nothing, as a rolled-back transaction does."""
        fired = max((tick for _, tick in runs), default=None)
        store = self._store
        with store._lock:
            row = self._rows.get(schedule.name)
            if row is None or row.paused or row.next_at != schedule.next_at:
                return None
            if before_commit is not None:
                before_commit()
            self._set(row.name, next_at=next_at, last_fired_at=fired or row.last_fired_at)
            created = []
            for run_id, _ in runs:
                if run_id not in store._rows:
                    store._new_row(run_id, row.workflow, _dump(dict(row.input)), store._stamp())
                    created.append(run_id)
            return created

    def _set(self, name: str, **changes: Any) -> Schedule | None:
        row = self._rows.get(name)
        if row is None:
            return None
        self._rows[name] = dataclasses.replace(row, **changes)
        return self._rows[name]


class MemoryLease:
    """A lease MemoryLeases handed out; its TTL runs on the leases' clock.

    start_heartbeat does nothing: time moves only when a test moves the clock, so a lease
    expires only when a test moves it past the TTL without a renewal, which is how a test
    plays a process paused (SIGSTOP) while it held the run. ensure() then behaves as
    Lease.ensure: a renewal younger than half the TTL is trusted, an older one is checked.
    """

    def __init__(self, leases: MemoryLeases, run_id: str, token: LeaseToken, ttl: float) -> None:
        self._leases, self.run_id, self.token, self.ttl = leases, run_id, token, ttl
        self.epoch = token.epoch
        self._renewed_at = leases._clock()
        self._lost: str | None = None

    def start_heartbeat(self) -> MemoryLease:
        """No heartbeat thread: the test's clock stands still unless moved."""
        return self

    def renew(self) -> None:
        """Extend it now; raise LeaseLost if another owner holds it or it expired."""
        if self._lost:
            raise LeaseLost(self.run_id, self._lost)
        started = self._leases._clock()
        held = self._leases._renew(self.run_id, self.token, self.ttl)
        if held is not True:
            self._lost = f"now held by {held or 'nobody (expired)'}"
            raise LeaseLost(self.run_id, self._lost)
        self._renewed_at = started

    def ensure(self, fresh: bool = False) -> None:
        """Raise LeaseLost unless this worker provably still holds it (fresh: ask the
        leases whatever the last renewal's age)."""
        if self._lost:
            raise LeaseLost(self.run_id, self._lost)
        if self._leases._clock() - self._renewed_at < self.ttl / 2 and not fresh:
            return
        self.renew()

    def release(self, ended: bool = False) -> None:
        """Let go of the run, only if still ours (ended: its epoch counter goes too)."""
        self._leases._release(self.run_id, self.token, ended)


class MemoryLeases:
    """LeaseManager in dicts under one lock, as store/lua/*.lua do it in Redis: an epoch
    counter per run that grows above a floor, leases and `sent` marks that expire on
    `clock` (seconds; a ManualClock lets a test move it)."""

    def __init__(self, clock: Clock = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # run_id: (value, expires at): the keys cairn:lease, cairn:epoch and cairn:sent
        self._leases: dict[str, tuple[LeaseToken, float]] = {}
        self._epochs: dict[str, tuple[int, float]] = {}
        self._sent: dict[str, tuple[bool, float]] = {}
        self._deliveries: dict[str, float] = {}  # keys.DELIVERIES: run -> when taken

    def acquire(
        self, run_id: str, ttl: float, floor: int = 0, owner: LeaseToken | None = None
    ) -> MemoryLease | None:
        """The run's lease with an epoch above floor, or None while another owner holds
        it (acquire.lua)."""
        owner = owner or LeaseToken.mine()
        with self._lock:
            now = self._clock()
            if _live(self._leases, run_id, now) is not None:
                return None
            counter = _live(self._epochs, run_id, now) or 0
            epoch = max(counter + 1, floor + 1)
            self._epochs[run_id] = (epoch, now + EPOCH_TTL)
            token = dataclasses.replace(owner, epoch=epoch)
            self._leases[run_id] = (token, now + ttl)
            self._sent.pop(run_id, None)
            self._deliveries[run_id] = now
        return MemoryLease(self, run_id, token, ttl)

    def holder(self, run_id: str) -> LeaseToken | None:
        """Who holds the run's lease."""
        with self._lock:
            held: LeaseToken | None = _live(self._leases, run_id, self._clock())
            return held

    def break_dead(self, run_id: str, token: LeaseToken) -> bool:
        """Delete a lease whose owner is known dead, only if it is still token."""
        return self._release(run_id, token, ended=False, listed=True)

    def lost_deliveries(self, older_than: float, limit: int = 10_000) -> list[str]:
        """Runs a delivery took over older_than seconds ago and never let go of."""
        with self._lock:
            before = self._clock() - older_than
            found = sorted((t, r) for r, t in self._deliveries.items() if t <= before)
        return [r for _, r in found[:limit]]

    def unheld(self, run_ids: list[str]) -> list[str]:
        """The run ids whose lease is gone."""
        with self._lock:
            now = self._clock()
            return [r for r in run_ids if _live(self._leases, r, now) is None]

    def mark_sent(self, run_id: str, window: float) -> bool:
        """False while an earlier message for the run is out and untaken (SET NX PX)."""
        with self._lock:
            now = self._clock()
            if _live(self._sent, run_id, now) is not None:
                return False
            self._sent[run_id] = (True, now + window)
            return True

    def _renew(self, run_id: str, token: LeaseToken, ttl: float) -> LeaseToken | bool | None:
        """renew.lua: True if extended, else who holds it now (None: nobody)."""
        with self._lock:
            now = self._clock()
            held: LeaseToken | None = _live(self._leases, run_id, now)
            if held is not None and str(held) == str(token):
                self._leases[run_id] = (held, now + ttl)
                return True
            return held

    def _release(self, run_id: str, token: LeaseToken, ended: bool, listed: bool = False) -> bool:
        """release.lua: compare and delete, never a successor's lease; the delivery leaves
        keys.DELIVERIES (listed: it stays, a dead owner's broken lease)."""
        with self._lock:
            held = _live(self._leases, run_id, self._clock())
            if held is None or str(held) != str(token):
                return False
            del self._leases[run_id]
            if not listed:
                self._deliveries.pop(run_id, None)
            if ended:
                self._epochs.pop(run_id, None)
            return True


def _signal_of(signal_id: str, signal: _Signal) -> dict[str, Any]:
    """The checkpoint's signal as the SQL builds it (traceparent only when stored)."""
    out = {"id": signal_id, "payload": json.loads(signal.payload)}
    if signal.traceparent is not None:
        out["traceparent"] = signal.traceparent
    return out


def _loaded(call: Call) -> Call:
    """A journaled call as read back: its result and error parsed from their JSON text."""
    return dataclasses.replace(
        call,
        result=json.loads(call.result) if call.result is not None else None,
        error=json.loads(cast(str, call.error)) if call.error is not None else None,
    )


def _unconsumed(row: _Row, event: str | None) -> list[tuple[str, _Signal]]:
    """The run's signals of event not consumed yet, oldest first (created_at, then id)."""
    found = [
        (sid, s) for sid, s in row.signals.items() if s.consumed_seq is None and s.event == event
    ]
    return sorted(found, key=lambda found: (found[1].created_at, found[0]))


def _live(table: dict[str, tuple[Any, float]], key: str, now: float) -> Any:
    """The key's value unless it expired (then it is gone, as in Redis)."""
    entry = table.get(key)
    if entry is None:
        return None
    if entry[1] <= now:
        del table[key]
        return None
    return entry[0]


class MemoryEvents:
    """The run event streams (EventLog) in dicts, as store/lua/emit.lua and Redis Streams
    do it: ids "<ms>-<n>" rising per run, MAXLEN trimming, the fence against MemoryLeases,
    the cap. Give it to an Outbox (`loop.Deps(events=Outbox(MemoryEvents(leases), settings))`)
    to see a step's events in process."""

    def __init__(self, leases: MemoryLeases, clock: Clock = time.time) -> None:
        self._leases, self._clock = leases, clock
        self._cond = threading.Condition()
        self._streams: dict[str, list[tuple[str, str]]] = {}
        self._added: dict[str, int] = {}  # entries ever added (XINFO's entries-added)
        self._counted: dict[str, int] = {}  # events counted toward the cap
        self._newest: dict[str, int] = {}  # the newest epoch that wrote or claimed
        self._last: dict[str, tuple[int, int]] = {}

    def _id(self, run_id: str) -> str:
        ms = int(self._clock() * 1000)
        last_ms, n = self._last.get(run_id, (0, -1))
        ms, n = (last_ms, n + 1) if ms <= last_ms else (ms, 0)
        self._last[run_id] = (ms, n)
        return f"{ms}-{n}"

    def append(self, batches: Any, *, maxlen: int, ttl: float, cap: int) -> list[list[Any]]:
        out = []
        with self._cond:
            for run_id, token, events in batches:
                with self._leases._lock:
                    held = _live(self._leases._leases, run_id, self._leases._clock())
                held_by = str(held) if held is not None else None
                writer = LeaseToken.parse(token).epoch if token else 0
                stale = writer < self._newest.get(run_id, 0)
                ids: list[Any] = []
                for raw in events:
                    flag, blob = raw[0], raw[1:]
                    if (
                        stale
                        or (flag == "f" and held_by != token)
                        or (flag == "g" and held_by is not None and held_by != token)
                    ):
                        ids.append(0)
                        continue
                    if flag == "f" and cap > 0 and self._counted.get(run_id, 0) >= cap:
                        ids.append(1)
                        continue
                    if flag == "f":
                        self._counted[run_id] = self._counted.get(run_id, 0) + 1
                    entry = (self._id(run_id), blob)
                    stream = self._streams.setdefault(run_id, [])
                    stream.append(entry)
                    self._added[run_id] = self._added.get(run_id, 0) + 1
                    del stream[: max(0, len(stream) - maxlen)]
                    ids.append(entry[0])
                    self._newest[run_id] = max(writer, self._newest.get(run_id, 0))
                out.append(ids)
            self._cond.notify_all()
        return out

    def read(
        self, run_id: str, after: str = "0-0", count: int = 500, block: float | None = None
    ) -> list[tuple[str, str]]:
        def newer() -> list[tuple[str, str]]:
            at = _event_key(after)
            return [e for e in self._streams.get(run_id, []) if _event_key(e[0]) > at][:count]

        with self._cond:
            if block is not None:
                self._cond.wait_for(newer, timeout=block)
            return newer()

    def info(self, run_id: str) -> Any:
        from cairn.core.records import StreamInfo

        with self._cond:
            stream = self._streams.get(run_id)
            if not stream:
                return None
            trimmed = self._added[run_id] > len(stream)
            origin = is_origin(stream[0][1])
            return StreamInfo(stream[0][0], stream[-1][0], trimmed, origin)

    def claim(self, run_id: str, epoch: int, count: int, ttl: float) -> list[tuple[str, str]]:
        """claim.lua: fence the stream at epoch, then its newest entries, newest first."""
        with self._cond:
            self._newest[run_id] = max(epoch, self._newest.get(run_id, 0))
            return list(reversed(self._streams.get(run_id, [])[-count:]))

    def before(self, run_id: str, entry_id: str, count: int) -> list[tuple[str, str]]:
        with self._cond:
            at = _event_key(entry_id)
            older = [e for e in self._streams.get(run_id, []) if _event_key(e[0]) < at]
            return list(reversed(older[-count:]))

    def lose(self, run_id: str) -> None:
        """Drop the run's stream and its keys, as an expiry or a Redis that lost its data
        would."""
        with self._cond:
            for kept in (self._streams, self._added, self._counted, self._newest):
                kept.pop(run_id, None)


def _event_key(entry_id: str) -> tuple[int, int]:
    ms, _, n = entry_id.partition("-")
    return int(ms), int(n or 0)
