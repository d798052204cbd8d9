"""The loop's store (RunStore): load and claim a run, save a step's checkpoint, record
an attempt that did not save, the ledger of effects and the journal of calls."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
from typing import TYPE_CHECKING, Any, NoReturn, cast

from cairn.core.errors import CairnError, StaleWrite, StoreError
from cairn.core.records import (
    CHECKPOINT_VERSION,
    START,
    STEERED,
    Attempt,
    Budget,
    Call,
    Checkpoint,
    Recorded,
    Saved,
    Spawned,
    Wait,
)
from cairn.core.status import ACTIVE, IDLE, STOPPED, RunStatus
from cairn.store.rows import _checkpoint, appended
from cairn.testing.memory.rows import _dump, _loaded, _Row, _Snap, _status
from cairn.testing.memory.tables import _Tables

if TYPE_CHECKING:
    from collections.abc import Collection

    from cairn.core.cuts import Cut
    from cairn.store.contract import StepTx


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


class _Runs(_Tables):
    """RunStore: what a worker's loop asks of the store, step by step."""

    def load(self, run_id: str) -> Checkpoint | None:
        """The run's checkpoint with its live window, or None: no such run."""
        with self._lock:
            row = self._rows.get(run_id)
            return _checkpoint(self._columns(row, self._now())) if row else None

    def claim(
        self,
        run_id: str,
        epoch: int,
        code_version: str | None = None,
        pinned: Collection[str] = (),
    ) -> Checkpoint | None:
        """Fence the run at epoch and return it; None if it stopped, its epoch is not
        older, or it is pinned to another version. Like the SQL, the fence is written
        before the row is read back (a row this code cannot parse is fenced, then
        refused). A run's first claim (epoch 0) records code_version as the one that
        started it, and pins it when its workflow is in `pinned`."""
        with self._lock:
            row = self._rows.get(run_id)
            if row is None or row.epoch >= epoch or row.status in IDLE:
                return None
            if row.pinned and row.started_version != code_version:
                return None
            if row.epoch == 0:
                row.pinned = row.workflow in pinned
                if row.started_version is None:
                    row.started_version = code_version
            row.epoch, row.retry_at, row.updated_at = epoch, None, self._stamp()
            row.deliveries += 0 if row.status == RunStatus.WAITING else 1
            return _checkpoint(self._columns(row, self._now()))

    # -- the per-step write ----------------------------------------------------------
    def transaction(self) -> _NoTransaction:
        """No database: ctx.db raises, saying it needs PgStore."""
        return _NoTransaction()

    def held(self) -> contextlib.AbstractContextManager[None]:
        """No connections to hold."""
        return contextlib.nullcontext()

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
            if wait is not None and wait.request is not None:
                self._asks.ask(row, wait, stamp)
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
                    tenant=parent.tenant,
                    budgets=parent.budgets,  # a child spends its tree's
                )
        self._gathers.setdefault((parent.run_id, parent.seq), [spawn.need, False])

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

    def unclaim(self, run_id: str, epoch: int, hold: float) -> None:
        """The claim at epoch counts no delivery (the worker lacked a key), and the
        reaper leaves the run alone for hold seconds."""
        with self._lock:
            row = self._rows.get(run_id)
            if row is None or row.epoch != epoch:
                return
            if row.status != RunStatus.WAITING:
                row.deliveries = max(row.deliveries - 1, 0)
            row.retry_at = self._now() + dt.timedelta(seconds=hold)

    def cancel_reason(self, run_id: str) -> str | None:
        """Why the run was cancelled, or None."""
        with self._lock:
            row = self._rows.get(run_id)
            return row.cancel_reason if row else None

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

    def steers_pending(self, run_id: str) -> list[tuple[int, Any]]:
        """The run's steer messages no journal record delivered yet (steers_pending in the
        SQL), oldest first."""
        with self._lock:
            row = self._rows.get(run_id)
            if row is None:
                return []
            read = [
                json.loads(call.result)
                for call, _ in row.journal.values()
                if call.name == STEERED and call.result is not None
            ]
            last = max((n for got in read if isinstance(got, list) for n in got), default=0)
            return [(n, json.loads(m)) for n, m in enumerate(row.steers, 1) if n > last]

    def interrupts(self, run_id: str) -> contextlib.AbstractContextManager[Cut | None]:
        """The run's Cut while a call that may be interrupted runs: fired by a steer
        message with interrupt=True (steer)."""
        return self._cuts.watch(run_id)

    def steers(self, run_id: str, numbers: list[int]) -> list[tuple[int, Any]]:
        """The run's steer messages of these numbers, in order."""
        with self._lock:
            row = self._rows.get(run_id)
            kept = row.steers if row else []
            return [(n, json.loads(kept[n - 1])) for n in sorted(numbers) if 0 < n <= len(kept)]

    def record_call(
        self, cp: Checkpoint, visit: int, call: Call, tx: Any = None
    ) -> Recorded | None:
        """Journal call for the step at cp, fenced like a save (record_call in the SQL),
        with the run's cancel reason; None if fenced. The same writer recording it again
        gets it recorded."""
        stored = dataclasses.replace(
            call,
            result=_dump(call.result) if call.error is None else None,
            # JSON text in a field typed for the parsed dict, as the SQL store's row has it
            error=cast(Any, _dump(call.error)) if call.error is not None else None,
        )
        with self._lock:
            row = self._rows.get(cp.run_id)
            if row is None or row.seq != cp.seq or row.epoch > cp.epoch:
                return None
            key = (cp.cursor, visit, call.pos)
            crossed: tuple[str, ...] = ()
            if key in row.journal:
                held, epoch = row.journal[key]
                if not (epoch == cp.epoch and held.name == call.name):
                    return None
            else:
                row.journal[key] = (stored, cp.epoch)
                crossed = self._spend(cp, visit, call)
            row.deliveries = min(row.deliveries, 1)  # progress: not poison
            return Recorded(row.cancel_reason, crossed)

    # -- budgets (under the lock: the SQL's row lock on each budget) --------------------
    def reserve(
        self, cp: Checkpoint, visit: int, pos: int, usd: float, tokens: int = 0
    ) -> Budget | None:
        """Admit a call against the run's budgets, holding its worst case (budget_lock,
        budget_roll, budget_release and budget_reserve in the SQL); None, or the budget it
        would pass. Fenced like record_call: StaleWrite, holding nothing."""
        with self._lock:
            # budget_lock's rows: a scope deleted since the claim counts no more
            scopes = sorted(s for s in cp.budgets or () if s in self._budgets)
            row = self._rows.get(cp.run_id)
            if row is None or row.seq != cp.seq or row.epoch > cp.epoch:
                raise StaleWrite(cp.run_id, cp.seq, cp.epoch)
            self._roll(scopes)
            for hold, (seq, held, held_tokens) in list(self._holds.items()):  # budget_release
                run = self._rows.get(hold[0])
                if hold[4] in scopes and (run is None or run.seq > seq or run.status in STOPPED):
                    del self._holds[hold]
                    b = self._budgets[hold[4]]
                    b["reserved_usd"] = max(b["reserved_usd"] - held, 0.0)
                    b["reserved_tokens"] = max(b["reserved_tokens"] - held_tokens, 0)
            mine = {s: self._holds.get((cp.run_id, cp.cursor, visit, pos, s)) for s in scopes}
            for scope in scopes:
                b = self._budgets[scope]
                over_usd = b["limit_usd"] is not None and (
                    b["spent_usd"] + b["reserved_usd"] + usd > b["limit_usd"]
                )
                over_tokens = b["limit_tokens"] is not None and (
                    b["spent_tokens"] + b["reserved_tokens"] + tokens > b["limit_tokens"]
                )
                if mine[scope] is None and (over_usd or over_tokens):
                    return Budget(scope=scope, **{**b, "soft": None})
            for scope in scopes:
                b, before = self._budgets[scope], mine[scope]
                b["reserved_usd"] += usd - (before[1] if before else 0.0)
                b["reserved_tokens"] += tokens - (before[2] if before else 0)
                self._holds[(cp.run_id, cp.cursor, visit, pos, scope)] = (cp.seq, usd, tokens)
            return None

    def _spend(self, cp: Checkpoint, visit: int, call: Call) -> tuple[str, ...]:
        """record_budgeted_call's settling (under the lock): the call's holds released,
        its cost and tokens added; the scopes whose soft limit it crossed."""
        crossed = []
        self._roll(cp.budgets or ())  # a record that lands in a new period first
        for scope in sorted(s for s in cp.budgets or () if s in self._budgets):
            b = self._budgets[scope]
            hold = self._holds.pop((cp.run_id, cp.cursor, visit, call.pos, scope), None)
            b["reserved_usd"] = max(b["reserved_usd"] - (hold[1] if hold else 0.0), 0.0)
            b["reserved_tokens"] = max(b["reserved_tokens"] - (hold[2] if hold else 0), 0)
            b["spent_usd"] += call.cost_usd
            b["spent_tokens"] += call.tokens
            soft = b["soft"]
            if soft is not None and any(
                b[limit] is not None and b[spent] >= soft * b[limit] > b[spent] - added
                for limit, spent, added in (
                    ("limit_usd", "spent_usd", call.cost_usd),
                    ("limit_tokens", "spent_tokens", call.tokens),
                )
            ):
                crossed.append(scope)
        return tuple(crossed)
