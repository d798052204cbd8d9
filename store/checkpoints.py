"""The Postgres checkpoint store: load, claim, the seq/epoch-guarded save, the ledger."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from cairn.core.errors import (
    StaleWrite,
    StoreUnavailable,
)
from cairn.core.inputs import key_scope
from cairn.core.records import (
    START,
    STEERED,
    Attempt,
    Budget,
    Call,
    Checkpoint,
    Recorded,
    Run,
    RunFilter,
    Saved,
    Spawned,
    Wait,
    budget_scope,
    tenant_scope,
)
from cairn.core.status import TERMINAL, RunStatus
from cairn.store.approvals import ApprovalStore
from cairn.store.db import Database, opened, outage, translated
from cairn.store.payloads import Clear, Payload, text
from cairn.store.rows import (
    FOLD_AT,
    FOLD_BATCH,
    WAKE_BATCH,
    _checkpoint,
    conflict,
    create_params,
    debounce_params,
    fork_params,
    forked,
    list_query,
    replay_params,
    rewound,
    save_params,
)
from cairn.store.schedules import ScheduleStore
from cairn.store.sql import QUERIES
from cairn.store.steering import STEER_CHANNEL
from cairn.store.tx import StepTransaction

if TYPE_CHECKING:
    from cairn.core.cuts import Cut
    from cairn.store.contract import StepTx


class PgStore:
    """CheckpointStore (store/contract.py: the loop's, the operator's and maintenance's
    operations) on one Database."""

    def __init__(self, db: Database) -> None:
        self.db = db

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
        tenant: str | None = None,
        budget_usd: float | None = None,
        budget_soft: float | None = None,
        budget_tokens: int | None = None,
    ) -> bool:
        """Insert a run at seq 0 (for tenant, if given); False if it existed (a failed one
        is re-armed). With a concurrency key it is admitted if a slot is free, else queued
        (`admitted` then says which runs to send). With budget_usd, its tree's budget (the
        run and all its descendants) is made with it.

        Raises RunIdConflict if run_id exists with another workflow, input or tenant.
        """
        params = create_params(
            run_id, workflow, input, cursor, max_cost_usd, priority, concurrency_key,
            concurrency_limit, traceparent, tenant, budget_usd, budget_soft, budget_tokens,
        )  # fmt: skip
        budget = ("create_budget",) if params["budget_scope"] is not None else ()
        if concurrency_key is None:
            created = self.db.each(("create_run", *budget), params)[0] is not None
        else:
            names = ("create_keyed_run", "admit", *budget)
            created = self.db.each(names, params)[0] is not None
        if created:
            return True
        row = self.db.one("existing_run", params)
        if row is None:  # swept between the two statements: create it afresh
            return self.create_run(
                run_id, workflow, input, cursor, max_cost_usd, priority=priority,
                concurrency_key=concurrency_key, concurrency_limit=concurrency_limit,
                traceparent=traceparent, tenant=tenant, budget_usd=budget_usd,
                budget_soft=budget_soft, budget_tokens=budget_tokens,
            )  # fmt: skip
        conflict(run_id, row, input)
        self.db.one("rearm_failed", {"run_id": run_id})
        return False

    def debounce(
        self,
        run_id: str,
        workflow: str,
        input: dict[str, Any],
        key: str,
        debounce: float,
        max_wait: float | None = None,
        *,
        max_cost_usd: float | None = None,
        priority: int = 0,
        traceparent: str | None = None,
        tenant: str | None = None,
    ) -> tuple[str, bool]:
        """The (workflow, key)'s run that has not started, with this input, starting
        `debounce` seconds from now (at most max_wait after its first enqueue): run_id,
        created, or the one already waiting. Returns (its run id, created). It waits for
        the wake pass, which sends it: the caller sends nothing."""
        row = self.db.one("debounce", debounce_params(
            run_id, workflow, input, key, debounce, max_wait, max_cost_usd, priority,
            traceparent, tenant,
        ))  # fmt: skip
        assert row is not None
        return row["run_id"], bool(row["created"])

    def fork(
        self,
        origin: str,
        at: int,
        run_id: str,
        patch: dict[str, Any] | None = None,
        traceparent: str | None = None,
    ) -> bool:
        """Create run_id from the checkpoint origin saved at seq `at` (input patched);
        False if run_id existed (unchanged). Raises UnknownRun, or InvalidInput when
        origin saved no checkpoint at that seq."""
        input = None
        if patch:  # merged here, opened: a sealed input cannot be patched in SQL
            row = self.db.one("run_input", {"run_id": origin})
            input = {**row["input"], **patch} if row is not None else None
        row = self.db.one("fork", fork_params(origin, at, run_id, input, traceparent))
        return forked(row, origin, at)

    def rewind(self, run_id: str, at: int) -> int:
        """Move the stopped run back to the checkpoint it saved at seq `at`, in place (at
        a new seq, with new visit numbers); returns its new seq. Raises UnknownRun,
        InvalidInput (no checkpoint at that seq), or RunNotStopped."""
        return rewound(self.db.one("rewind", {"origin": run_id, "at": at}), run_id, at)

    def clock(self) -> dt.datetime:
        """The database's time now."""
        row = self.db.one("clock")
        assert row is not None
        now: dt.datetime = row["now"]
        return now

    def ping(self) -> None:
        """Raise StoreUnavailable unless Postgres answers (within the give-up time)."""
        self.db.one("ping")

    def schedule_store(self) -> ScheduleStore:
        """The schedules table on this database."""
        return ScheduleStore(self.db)

    def approval_store(self) -> ApprovalStore:
        """The approvals, their audit and the standing rules on this database."""
        return ApprovalStore(self.db)

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
        """Re-arm up to `limit` of the workflow's runs that stopped in one of the statuses
        in [since, until) at their cursor, oldest first; each as it stopped. dry_run:
        only which (nothing written). The caller sends the re-armed runs."""
        params = replay_params(workflow, statuses, since, until, limit)
        rows = self.db.all("replayable" if dry_run else "replay", params)
        return [Run.from_row(r) for r in rows]

    def forks(self, run_id: str) -> list[Run]:
        """The runs forked from run_id, oldest first."""
        return [Run.from_row(r) for r in self.db.all("forks", {"run_id": run_id})]

    def admitted(self, workflow: str, key: str) -> list[tuple[str, int]]:
        """The key's runs admitted and not sent yet, each (run id, priority), marked sent:
        the caller sends them (each run is returned to one caller)."""
        rows = self.db.all("admitted", {"workflow": key_scope(workflow, key), "key": key})
        return [(r["run_id"], r["priority"]) for r in rows]

    def get(self, run_id: str) -> Run | None:
        row = self.db.one("get_run", {"run_id": run_id})
        return Run.from_row(row) if row else None

    def children(self, run_id: str, seq: int | None = None, limit: int = 10_000) -> list[Run]:
        """The run's child runs (those of the spawn saved at seq, or all), in the order
        each spawn listed them."""
        rows = self.db.all("children", {"run_id": run_id, "seq": seq, "limit": limit})
        return [Run.from_row(r) for r in rows]

    def gathered(self, run_id: str) -> bool:
        """Whether the run waits for a spawn whose children have stopped (enough of
        them): its wake-up signal is written and not consumed."""
        row = self.db.one("gathered", {"run_id": run_id})
        return bool(row and row["ready"])

    def load_row(self, run_id: str) -> dict[str, Any] | None:
        return self.db.one("load", {"run_id": run_id})

    def load(self, run_id: str) -> Checkpoint | None:
        row = self.load_row(run_id)
        return _checkpoint(row) if row else None

    def claim(
        self,
        run_id: str,
        epoch: int,
        code_version: str | None = None,
        pinned: Collection[str] = (),
    ) -> Checkpoint | None:
        """Fence the run at epoch and return it; None if a newer epoch already holds it,
        or it is pinned to another version. A run's first claim records code_version as
        the one that started it, and pins it when its workflow is among `pinned`."""
        row = self.db.one(
            "claim",
            {
                "run_id": run_id,
                "epoch": epoch,
                "code_version": code_version,
                "pinned": list(pinned),
            },
        )
        return _checkpoint(row) if row else None

    # -- the per-step write ----------------------------------------------------------
    def transaction(self) -> StepTransaction:
        """A step's own connection (ctx.db), committed by save() with the checkpoint."""
        return StepTransaction(self.db)

    def held(self) -> contextlib.AbstractContextManager[None]:
        """This thread's statements on one connection until the block ends (a delivery's:
        Database.held)."""
        return self.db.held()

    @staticmethod
    def outage(exc: BaseException) -> StoreUnavailable | None:
        """StoreUnavailable for a driver error raised in a step (its ctx.db), else None."""
        return outage(exc)

    def save(
        self,
        cp: Checkpoint,
        previous: Checkpoint,
        tx: StepTx | None = None,
        attempt: Attempt | None = None,
        wait: Wait | None = None,
        spawn: Spawned | None = None,
    ) -> Saved:
        """Write cp (and the window's new messages, the step's history row, the wait, the
        signal it consumed and the children it spawned) if it is newer; else raise
        StaleWrite.

        With a transaction the step used, the save runs inside it and commits it, so the
        step's own Postgres writes land with the checkpoint or not at all.
        """
        query, params = save_params(cp, previous, attempt, wait, spawn)
        conn = tx.open if tx is not None else None
        if conn is not None:
            with translated():
                self.db.hold_row(conn)
                row = opened(conn).execute(query, params).fetchone()
                if row is not None:
                    conn.commit()
                else:
                    conn.rollback()
            if row is None:
                raise StaleWrite(cp.run_id, cp.seq, cp.epoch)
            return Saved(row["cancel_reason"], row["signalled"])

        tries = 0

        def write() -> dict[str, Any] | None:
            nonlocal tries
            tries += 1
            with self.db.connection() as c:
                return c.execute(query, params).fetchone()

        row = self.db.retry(write)
        if row is not None:
            return Saved(row["cancel_reason"], row["signalled"])
        if tries > 1:
            # A retried save whose first try committed before the link dropped finds its
            # own row (same seq, same epoch: same writer): success, not a lost run.
            now = self.db.one("position", {"run_id": cp.run_id})
            if now and now["seq"] == cp.seq and now["epoch"] == cp.epoch:
                return Saved(self.cancel_reason(cp.run_id), wait is not None)
        raise StaleWrite(cp.run_id, cp.seq, cp.epoch)

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
        row = self.db.one(
            "end_attempt",
            {
                "run_id": cp.run_id,
                "seq": cp.seq,
                "epoch": cp.epoch,
                "status": status,
                "error": error_text(status, error[:4000]),
                "attempt": int(counted and attempt is not None),
                "retry_in": retry_in,
                "step": cp.cursor if attempt is not None else None,
                "visit": cp.visits.get(cp.cursor, 0),
                "outcome": "retry" if retry_in is not None else status,
                "started": attempt.started if attempt else 0.0,
                "worker": attempt.worker if attempt else "",
                "effect_key": attempt.effect_key if attempt else None,
                "code_version": attempt.code_version if attempt else None,
            },
        )
        return int(row["attempts"]) if row else None

    def signal(
        self, run_id: str, event: str, payload: Any, signal_id: str, traceparent: str | None = None
    ) -> tuple[RunStatus, bool] | None:
        """Store a signal; (the run's status, whether it was new), or None: no such run."""
        row = self.db.one(
            "signal",
            {
                "run_id": run_id,
                "event": event,
                "payload": Payload(payload),
                "signal_id": signal_id,
                "traceparent": traceparent,
            },
        )
        return (RunStatus(row["status"]), row["stored"]) if row else None

    def steer(
        self, run_id: str, message: Any, interrupt: bool = False
    ) -> tuple[RunStatus, int | None] | None:
        """Store a steer message as the run's next: (the run's status, the message's number
        in the run, None when the run has ended and nothing was stored), or None: no such
        run. interrupt: and NOTIFY the run's calls in flight, at the commit."""
        params = {
            "run_id": run_id,
            "message": Payload(message),
            "terminal": sorted(TERMINAL),
            "channel": STEER_CHANNEL,
        }
        names = ("steer_lock", "steer_insert") + (("steer_notify",) if interrupt else ())
        locked, stored, *_ = self.db.each(names, params)
        if locked is None:
            return None
        return RunStatus(locked["status"]), stored["n"] if stored else None

    def interrupts(self, run_id: str) -> contextlib.AbstractContextManager[Cut | None]:
        """The run's Cut while a call that may be interrupted runs, fired by this process's
        steer listener (store/steering.py)."""
        return self.db.steers().watch(run_id)

    def steers(self, run_id: str, numbers: list[int]) -> list[tuple[int, Any]]:
        """The run's steer messages of these numbers, in order: (n, message) each."""
        rows = self.db.all("steers", {"run_id": run_id, "numbers": list(numbers)})
        return [(r["n"], r["message"]) for r in rows]

    def steers_pending(self, run_id: str) -> list[tuple[int, Any]]:
        """The run's steer messages no journal record delivered yet, oldest first: (n,
        message) each."""
        return [(r["n"], r["message"]) for r in self.db.all("steers_pending", {"run_id": run_id})]

    def cancel_reason(self, run_id: str) -> str | None:
        row = self.db.one("cancel_reason", {"run_id": run_id})
        return row["cancel_reason"] if row else None

    def cancel(self, run_id: str, reason: str) -> RunStatus | None:
        """Ask the run to stop; its status now (None: no such run, or it had ended)."""
        row = self.db.one("cancel", {"run_id": run_id, "reason": text(reason)})
        return RunStatus(row["status"]) if row else None

    def history(self, run_id: str) -> list[dict[str, Any]]:
        return self.db.all("history", {"run_id": run_id})

    def mark_failed(self, cp: Checkpoint, error: str, attempt: Attempt | None = None) -> bool:
        """Record a permanent error without touching the checkpoint's data."""
        return self.end_attempt(cp, RunStatus.FAILED, error, attempt) is not None

    def mark_unreadable(self, run_id: str, status: RunStatus, error: str) -> bool:
        """For a row we cannot even parse: status and error only, whatever its seq."""
        row = self.load_row(run_id)
        if row is None:
            return False
        cp = Checkpoint(
            run_id=run_id,
            workflow=row["workflow"],
            input={},
            seq=row["seq"],
            cursor=row["cursor"],
            state={},
            visits={},
            window=(),
            win_start=0,
            cost_usd=0.0,
            epoch=row["epoch"],
        )
        return self.end_attempt(cp, status, error) is not None

    def unclaim(self, run_id: str, epoch: int, hold: float) -> None:
        """The claim at epoch counts no delivery toward poison, and the reaper leaves the
        run alone for hold seconds: its worker gave it back for a cause of its own (it
        lacks a payload's key) and sends it again itself."""
        self.db.one("unclaim", {"run_id": run_id, "epoch": epoch, "hold": hold})

    # -- ledger ----------------------------------------------------------------------
    def was_done(self, key: str) -> tuple[bool, Any]:
        row = self.db.one("was_done", {"key": key})
        return (True, row["result"]) if row else (False, None)

    def mark_done(self, cp: Checkpoint, key: str, result: Any) -> bool:
        """Record that the effect of key ran, for the step at cp (its seq and epoch), over
        its intent if it had one; the first mark stays. False if fenced: another worker
        has claimed the run, or it moved on."""
        params = {
            "key": key,
            "run_id": cp.run_id,
            "seq": cp.seq,
            "epoch": cp.epoch,
            "result": Payload(result),
        }
        row = self.db.one("mark_done", params)
        return bool(row and row["owned"])

    def record_intent(self, cp: Checkpoint, key: str) -> tuple[str, Any]:
        """Before an at-most-once effect: its intent, fenced and committed. ("written",
        None); ("open", None): an earlier attempt's intent without its mark (the outcome is
        unknown); ("done", result): it ran; ("fenced", None): another worker has the run."""
        params = {"key": key, "run_id": cp.run_id, "seq": cp.seq, "epoch": cp.epoch}
        if self.db.one("record_intent", params):
            return "written", None
        row = self.db.one("intent_state", {"key": key})
        if row is None:
            return "fenced", None
        return ("done", row["result"]) if row["done"] else ("open", None)

    def open_intents(self, run_id: str) -> list[dict[str, Any]]:
        """The run's at-most-once effects whose outcome is unknown: {key, epoch, created_at}."""
        return self.db.all("open_intents", {"run_id": run_id})

    def resolve(self, run_id: str, done: bool, result: Any = None) -> tuple[bool, list[str]]:
        """Settle the run's unknown effects (done, with result; or not done: they run
        again) and re-arm it if it stopped as unknown: (re-armed, the keys settled)."""
        row = self.db.one(
            "resolve_intents", {"run_id": run_id, "done": done, "result": Payload(result)}
        )
        assert row is not None
        return bool(row["rearmed"]), list(row["keys"])

    def wait(self, run_id: str, timeout: float | None = None, poll: float = 2.0) -> Run:
        """The run once it is stopped or waiting (cairn.status.SETTLED), woken by the
        notification its status change sends, heard on the one connection all this
        database's waits share (store/waits.py), and read again every poll seconds in case
        none can come (PgBouncer in transaction mode). Raises UnknownRun, or WaitTimedOut
        after timeout seconds (None: no limit)."""
        return self.db.listener().wait(run_id, timeout, poll)

    async def wait_async(self, run_id: str, timeout: float | None = None, poll: float = 2.0) -> Run:
        """wait() for asyncio, on the same shared connection: the task awaits its news,
        holding no thread and no connection of its own."""
        return await self.db.listener().wait_async(run_id, timeout, poll)

    # -- journal ---------------------------------------------------------------------
    def journal(self, run_id: str, cursor: str, visit: int) -> list[Call]:
        """The calls recorded for the step's visit, in order."""
        rows = self.db.all("journal", {"run_id": run_id, "cursor": cursor, "visit": visit})
        return [Call(**row) for row in rows]

    def calls(self, run_id: str, limit: int = 500) -> list[dict[str, Any]]:
        """The run's journaled calls, oldest first (cursor, visit, pos, name, result,
        error, cost_usd, created_at): what a step's model requests and tools returned."""
        return self.db.all("calls", {"run_id": run_id, "limit": limit})

    def record_call(
        self, cp: Checkpoint, visit: int, call: Call, tx: StepTx | None = None
    ) -> Recorded | None:
        """Journal call for the step at cp (its seq, cursor and epoch), with the run's cancel
        reason as the statement read it; None if fenced: the run moved on, or a newer
        epoch claimed it. With the call's own transaction (ctx.db
        inside the call), the record runs in it and commits it: the call's writes land with
        its record or not at all.

        A record alone commits without waiting for its WAL to reach the disk: a killed
        worker loses nothing (the server has it), and the step's save, which waits,
        flushes it with everything before it. Only a crash of Postgres itself can lose
        the last records (three wal_writer_delays' worth at most, 600 ms by default) of a
        step not yet saved: their calls are made again, as a call cut short by a kill is. A record
        with the call's own writes commits as the session does: those are the user's."""
        params = {
            "run_id": cp.run_id,
            "seq": cp.seq,
            "epoch": cp.epoch,
            "cursor": cp.cursor,
            "visit": visit,
            "pos": call.pos,
            "name": call.name,
            # A steer read's record (its message numbers) stays readable to the SQL.
            "result": (Clear(call.result) if call.name == STEERED else Payload(call.result))
            if call.error is None
            else None,
            "error": Payload(call.error) if call.error is not None else None,
            "cost_usd": call.cost_usd,
        }
        conn = tx.open if tx is not None else None
        params["commit"] = "off" if conn is None else None
        # A run with budgets settles its hold and adds its cost in the same statement.
        name = "record_budgeted_call" if cp.budgets else "record_call"
        params["budgets"], params["tokens"] = cp.budgets, call.tokens
        if conn is None:
            row = self.db.one(name, params)
        else:
            with translated():
                self.db.hold_row(conn)
                row = opened(conn).execute(QUERIES[name], params).fetchone()
                if row is not None:
                    conn.commit()
                else:
                    conn.rollback()
        if row is None:
            return None
        return Recorded(row["cancel_reason"], tuple(row.get("crossed") or ()))

    # -- budgets -----------------------------------------------------------------------
    def reserve(
        self, cp: Checkpoint, visit: int, pos: int, usd: float, tokens: int = 0
    ) -> Budget | None:
        """Admit the call at pos of the step at cp (cp.cursor: its journal's) against
        each of the run's budgets, holding its worst case (usd, tokens) until its record
        settles it; None: admitted, else the budget it would pass, as it stood. One
        transaction, the budgets' rows locked first: two runs of a tree checking at once
        are checked one after the other, so neither passes the limit on the room the
        other took. Fenced like a record: StaleWrite, and no hold, if the run moved on or
        a newer epoch claimed it."""
        params = {
            "budgets": cp.budgets,
            "run_id": cp.run_id,
            "cursor": cp.cursor,
            "visit": visit,
            "pos": pos,
            "seq": cp.seq,
            "epoch": cp.epoch,
            "usd": usd,
            "tokens": tokens,
        }
        names = ("budget_lock", "budget_roll", "budget_release", "budget_reserve")
        row = self.db.each(names, params)[3]
        assert row is not None  # budget_reserve returns one row, always
        if row["fenced"]:
            raise StaleWrite(cp.run_id, cp.seq, cp.epoch)
        if row["scope"] is None:
            return None
        return _budget({**row, "soft": None})

    def budget(self, run_id: str) -> Budget | None:
        """The budget run_id was enqueued with (it and its descendants), or None."""
        row = self.db.one("budget_of", {"scope": budget_scope(run_id)})
        return _budget(row) if row is not None else None

    def raise_budget(
        self, run_id: str, usd: float | None = None, tokens: int | None = None
    ) -> list[str] | None:
        """Set the limits given of the budget run_id was enqueued with, and re-arm the
        runs of its tree that stopped over budget: their ids (the caller sends them), or
        None when run_id has no budget."""
        params = {
            "scope": budget_scope(run_id),
            "set_usd": usd is not None,
            "limit_usd": usd,
            "set_tokens": tokens is not None,
            "limit_tokens": tokens,
        }

        got = self._rearmed("budget_of", "raise_budget", params)
        return got[1] if got is not None else None

    def tenant_budget(self, tenant: str) -> Budget | None:
        """The tenant's budget as it stands in this period (rolled first if a new UTC day
        or month began since its last check), or None."""
        scope = tenant_scope(tenant)
        row = self.db.each(("budget_roll", "budget_of"), {"budgets": [scope], "scope": scope})[1]
        return _budget(row) if row is not None else None

    def set_tenant_budget(
        self,
        tenant: str,
        usd: float | None = None,
        tokens: int | None = None,
        per: str | None = None,
        soft: float | None = None,
    ) -> list[str] | None:
        """Create or change the tenant's budget (the limits given; per: None keeps the
        period, 'day' for a new one), and re-arm its runs stopped over budget: their ids
        (the caller sends them), or None when there is none and no limit was given."""
        params = {
            "scope": tenant_scope(tenant),
            "tenant": tenant,
            "set_usd": usd is not None,
            "limit_usd": usd,
            "set_tokens": tokens is not None,
            "limit_tokens": tokens,
            "period": per,
            "soft": soft,
        }

        got = self._rearmed("set_tenant_budget", "rearm_tenant_budget", params)
        return got[1] if got is not None else None

    def delete_tenant_budget(self, tenant: str) -> tuple[Budget, list[str]] | None:
        """Delete the tenant's budget, and re-arm its runs stopped over budget: the budget
        as it stood and their ids (the caller sends them), or None when it had none."""
        params = {"scope": tenant_scope(tenant), "tenant": tenant}
        got = self._rearmed("delete_tenant_budget", "rearm_tenant_budget", params)
        return (_budget(got[0]), got[1]) if got is not None else None

    def _rearmed(
        self, budget: str, rearm: str, params: dict[str, Any]
    ) -> tuple[dict[str, Any], list[str]] | None:
        """In one transaction: the budget statement (no row: no such budget, None), then
        the re-arm of the runs it stopped: its row and their ids."""

        def attempt() -> tuple[dict[str, Any], list[str]] | None:
            with self.db.connection() as conn, conn.transaction():
                row = conn.execute(QUERIES[budget], params).fetchone()
                if row is None:
                    return None
                return row, [r["run_id"] for r in conn.execute(QUERIES[rearm], params)]

        return self.db.retry(attempt)

    # -- queries for the CLI, the reaper and the sweep -------------------------------
    def list_runs(self, which: RunFilter | None = None) -> list[Run]:
        """Runs newest first, created in [since, until); after: the last run id of the
        previous page (None: the first 50 of all)."""
        query, params = list_query(which or RunFilter())
        return [Run.from_row(r) for r in self.db.all(query, params)]

    def live_cursors(self) -> list[dict[str, Any]]:
        """Where runs that may still go on stand: {workflow, cursor, runs} (live_cursors)."""
        return self.db.all("live_cursors")

    def counts(self, tenant: str | None = None) -> dict[str, dict[str, Any]]:
        """Runs per status ({status: {"n": ...}}), exact, from a few rows however many
        runs there are. A reader that summed a long tail of deltas folds one batch of them:
        without a reaper (no beat) they grow by about five rows per run. With a tenant:
        its runs', counted on its rows."""
        if tenant is not None:
            return {
                r["status"]: r for r in self.db.all("count_by_status_of_tenant", {"tenant": tenant})
            }
        rows = self.db.all("count_by_status")
        if rows and rows[0]["unfolded"] > FOLD_AT:
            self.db.one("fold_counts", {"batch": FOLD_BATCH})
        return {row["status"]: row for row in rows}

    def fold_counts(self, batch: int = FOLD_BATCH) -> int:
        """Fold the status deltas into the totals (the reaper's job), batch rows per
        transaction; returns how many rows were folded."""
        total = 0
        while True:
            row = self.db.one("fold_counts", {"batch": batch})
            n = int(row["n"]) if row else 0
            total += n
            if n < batch:
                return total

    def routes(self, run_ids: list[str]) -> dict[str, str]:
        """The pinned runs among run_ids, each with the version it is pinned to."""
        if not run_ids:
            return {}
        return {r["run_id"]: r["version"] for r in self.db.all("routes", {"run_ids": run_ids})}

    def pinned_runs(self) -> dict[str, tuple[int, int]]:
        """Pinned runs under way per version: (runs, of which waiting)."""
        return {
            r["version"]: (int(r["runs"]), int(r["waiting"]))
            for r in self.db.all("pinned_runs", {})
        }

    def stalled(self, pending_after: float, running_after: float) -> list[dict[str, Any]]:
        """Reaper candidates: {run_id, status, epoch, updated_at} (see the query)."""
        return self.db.all(
            "stalled", {"pending_after": pending_after, "running_after": running_after}
        )

    def unclaimed(self, older_than: float, limit: int = 10_000) -> list[dict[str, Any]]:
        """Pending runs no worker has taken, sent over older_than seconds ago, oldest
        first: {run_id, epoch, updated_at}."""
        return self.db.all("unclaimed", {"older_than": older_than, "limit": limit})

    def wake(
        self, batch: int = WAKE_BATCH, before_commit: Callable[[list[str]], None] | None = None
    ) -> list[str]:
        """Up to batch waiting runs whose time came (a sleep's end, a wait's timeout),
        moved out of waiting and committed: the caller sends each once. Two wakers at
        once never both get a run (see the query). before_commit: a test's fault point."""

        def attempt() -> list[str]:
            with self.db.connection() as conn, conn.transaction():
                ids = [r["run_id"] for r in conn.execute(QUERIES["wake"], {"batch": batch})]
                if before_commit is not None and ids:
                    before_commit(ids)
            return ids

        return self.db.retry(attempt)

    def roll_budgets(self, batch: int = WAKE_BATCH) -> list[str]:
        """Tenant budgets whose UTC day or month is over rolled (up to batch), and up to
        batch runs stopped over a tenant's budget before its period began re-armed and
        committed: the caller sends each once (see the query)."""
        return [r["run_id"] for r in self.db.all("roll_tenant_budgets", {"batch": batch})]

    def unchanged(self, rows: list[dict[str, Any]]) -> set[str]:
        """The run ids among rows (as stalled or unclaimed listed them) whose epoch and
        updated_at are still the same: no worker claimed, saved or ended them since."""
        if not rows:
            return set()
        found = self.db.all(
            "unchanged",
            {
                "run_ids": [r["run_id"] for r in rows],
                "epochs": [r["epoch"] for r in rows],
                "updated": [r["updated_at"] for r in rows],
            },
        )
        return {r["run_id"] for r in found}

    def sweep(
        self,
        older_than: float,
        batch: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Delete terminal runs older than older_than seconds, batch runs per transaction;
        returns how many went (progress, if given, hears the running total). Then the
        history's and the journal's months none of whose runs is left go whole, and the
        months ahead are made."""
        total = 0
        while True:
            row = self.db.one("sweep", {"older_than": older_than, "batch": batch})
            n = int(row["n"]) if row else 0
            total += n
            if progress is not None and n:
                progress(total)
            if n < batch:
                break
        self.db.one("partitions")
        return total


def error_text(status: RunStatus, error: str) -> Payload | Clear:
    """A stop's or a retry's error as stored: sealed, as every error text may hold what a
    step, a user or a model said; but a stop over budget's, cairn's own words naming the
    budget (Context._hold), which the wake pass reads (roll_tenant_budgets)."""
    return Clear(error) if status == RunStatus.BUDGET_EXCEEDED else Payload(error)


def _budget(row: dict[str, Any]) -> Budget:
    return Budget(
        scope=row["scope"],
        limit_usd=row["limit_usd"],
        soft=row["soft"],
        spent_usd=row["spent_usd"],
        reserved_usd=row["reserved_usd"],
        limit_tokens=row["limit_tokens"],
        spent_tokens=row["spent_tokens"],
        reserved_tokens=row["reserved_tokens"],
        period=row.get("period"),
        period_start=row.get("period_start"),
    )
