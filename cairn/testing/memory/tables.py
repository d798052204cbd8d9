"""What MemoryStore's operations share, whoever they are for: the rows under one lock,
the clock's stamps, the insert, the triggers (a concurrency key's admission, a re-armed
run, a stopped run) and the rows as the SQL selects them."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

from cairn.core.cuts import Cuts
from cairn.core.inputs import key_scope
from cairn.core.records import CHECKPOINT_VERSION, START, Attempt, Run, tenant_scope
from cairn.core.status import ACTIVE, STOPPED, RunStatus
from cairn.testing.memory.approvals import _AskTables
from cairn.testing.memory.clock import Clock
from cairn.testing.memory.rows import _dump, _Row, _Signal, _signal_of, _unconsumed


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


class _Tables:
    """MemoryStore's state: its tables in dicts, under one lock. Each audience's operations
    (runs.py, admin.py, forks.py, maintenance.py) are a class on top of it, and MemoryStore
    is all of them at once, as PgStore is one class over one database."""

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
        self._asks = _AskTables()  # approvals, their audit rows and the standing rules
        self._last = dt.datetime.min.replace(tzinfo=dt.UTC)
        self._cuts = Cuts()  # the calls in flight a steer message may interrupt
        # budgets: scope -> its ledger (a Budget's fields); holds: (run, cursor, visit,
        # pos, scope) -> (seq, usd, tokens), the calls in flight each budget admitted
        self._budgets: dict[str, dict[str, Any]] = {}
        self._holds: dict[tuple[str, str, int, int, str], tuple[int, float, int]] = {}

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

    # -- the insert and the triggers, called under the lock --------------------------
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

    def _enqueue(self, row: _Row) -> None:
        assert row.concurrency_key is not None
        self._queue_n += 1
        scope = key_scope(row.workflow, row.concurrency_key)
        self._queued[row.run_id] = (scope, row.concurrency_key, -row.priority, self._queue_n)

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
        scope = key_scope(row.workflow, key)
        limit = self._keys.setdefault((scope, key), row.concurrency_limit or 1)
        held = sum(1 for slot in self._slots.values() if slot[:2] == [scope, key])
        if held < limit:
            self._slots[row.run_id] = [scope, key, True]
        else:
            row.status = RunStatus.QUEUED
            self._enqueue(row)

    def _stopped(self, row: _Row) -> None:
        """The cairn_run_stopped trigger: a run that stopped gives back its key's slot (or
        its place in the queue) and counts toward its parent's spawn (whose signal is
        written once enough stopped); a cancelled one cancels its children."""
        if row.concurrency_key is not None:
            self._queued.pop(row.run_id, None)
            if self._slots.pop(row.run_id, None) is not None:
                self._admit(key_scope(row.workflow, row.concurrency_key), row.concurrency_key)
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

    # -- the rows as the SQL selects them, called under the lock ---------------------
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
            "tenant": row.tenant,
            "pinned_to": row.started_version if row.pinned else None,
            "budgets": self._budgets_of(row),
            "signal": _signal_of(*pending) if pending else None,
            "window": [
                json.loads(row.window[i])
                for i in range(row.win_start, row.win_end)
                if i in row.window
            ],
        }

    def _budgets_of(self, row: _Row) -> list[str] | None:
        """The run's budget scopes, its tenant's appended while that budget exists (the
        checkpoint_columns fragment's CASE)."""
        if row.tenant is None or tenant_scope(row.tenant) not in self._budgets:
            return row.budgets
        return [*(row.budgets or ()), tenant_scope(row.tenant)]

    def _roll(self, scopes: Iterable[str]) -> None:
        """budget_roll: a tenant's budget in a later UTC day or month starts its spend
        again (its holds in flight stay held)."""
        for scope in scopes:
            b = self._budgets.get(scope)
            if b is None or b.get("period") is None:
                continue
            start = period_start(b["period"], self._now())
            if b["period_start"] < start:
                b["spent_usd"], b["spent_tokens"], b["period_start"] = 0.0, 0, start

    def _rearm_over_budget(self, of: Callable[[_Row], bool]) -> list[str]:
        """The runs of a budget raised that stopped over budget, re-armed (under the lock)."""
        stamp, rearmed = self._stamp(), []
        for row in self._rows.values():
            if row.status == RunStatus.BUDGET_EXCEEDED and of(row):
                row.status, row.error, row.attempts, row.deliveries = (
                    RunStatus.PENDING, None, 0, 0
                )  # fmt: skip
                row.retry_at, row.updated_at = None, stamp
                self._rearmed(row)
                rearmed.append(row.run_id)
        return rearmed

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
            wakes_at=row.wait_until if row.status == RunStatus.WAITING else None,
            cancelled_by=row.cancelled_by,
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
            "started_version": row.started_version,
            "tenant": row.tenant,
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
            "code_version": attempt.code_version,
        }


def period_start(period: str, now: dt.datetime) -> dt.datetime:
    """The start of the UTC day or month now is in (date_trunc in the SQL)."""
    day = now.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day if period == "day" else day.replace(day=1)
