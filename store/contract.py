"""The store contract: what the loop, Context, the reaper, the Client and the web API call
on a checkpoint store and on the leases (LangGraph's BaseCheckpointSaver, in small), split
by audience:

- RunStore: the loop's and Context's, per delivery and per step, each write fenced;
- AdminStore: the operator's (Client, the web API, the CLI): create, read, cancel, signal,
  fork, rewind, replay, resolve, wait;
- Maintenance: the reaper's and the sweep's;
- Schedules: the schedules table (Client.add_schedule, the firer);
- CheckpointStore: all of the first three, what a backend is.

`PgStore` and the Redis `Leases` implement it, and so do their in-memory twins in
`cairn.testing` (`MemoryStore`, `MemoryLeases`, `MemorySchedules`);
tests/contract/test_store_contract.py runs one suite against both, so the twins cannot drift from
the real thing. The loop, Context, the reaper and the Client are typed against these
protocols, never against a backend.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from cairn.core.cuts import Cut
    from cairn.core.records import (
        Approval,
        ApprovalFilter,
        Attempt,
        Budget,
        Call,
        Checkpoint,
        Recorded,
        Rule,
        Run,
        RunFilter,
        Saved,
        Spawned,
        Wait,
    )
    from cairn.core.status import RunStatus
    from cairn.store.lease import LeaseToken
    from cairn.store.schedules import Schedule
    from cairn.store.tx import Connection


class StepTx(Protocol):
    """A step's own database transaction (ctx.db), committed by the save of its step."""

    @property
    def connection(self) -> Connection:
        """The connection, in a transaction, taken on first use."""

    @property
    def open(self) -> Connection | None:
        """The connection if the step used it, else None (the save then needs none)."""

    def close(self) -> None:
        """Roll back what was not committed and give the connection back."""


class RunStore(Protocol):
    """The loop's and Context's store: a delivery's claim, a step's guarded save, its
    journal and ledger; every write fenced by the run's epoch."""

    def load(self, run_id: str) -> Checkpoint | None:
        """The run's checkpoint with its live window, or None: no such run."""

    def claim(
        self,
        run_id: str,
        epoch: int,
        code_version: str | None = None,
        pinned: Collection[str] = (),
    ) -> Checkpoint | None:
        """Fence the run at epoch and return it; None if it stopped, its epoch is not
        older, or it is pinned to a version other than code_version. A run's first claim
        records code_version (the worker's) as the one that started it, and pins it when
        its workflow is among `pinned` (the worker's workflows with versions="pin")."""

    def save(
        self,
        cp: Checkpoint,
        previous: Checkpoint,
        tx: StepTx | None = None,
        attempt: Attempt | None = None,
        wait: Wait | None = None,
        spawn: Spawned | None = None,
    ) -> Saved:
        """Write cp if its seq and epoch are newer, else raise StaleWrite; the children of
        spawn are created with it, exactly when it is written."""

    def end_attempt(
        self,
        cp: Checkpoint,
        status: RunStatus,
        error: str,
        attempt: Attempt | None = None,
        retry_in: float | None = None,
    ) -> int | None:
        """Record an attempt that did not save; the failed attempts, or None if fenced."""

    def mark_failed(self, cp: Checkpoint, error: str, attempt: Attempt | None = None) -> bool:
        """Fail the run with error, its checkpoint data untouched."""

    def mark_unreadable(self, run_id: str, status: RunStatus, error: str) -> bool:
        """Status and error for a row this code cannot parse."""

    def unclaim(self, run_id: str, epoch: int, hold: float) -> None:
        """The claim at epoch, by a worker that gives the run back for a cause of its own
        (it lacks the key a payload is sealed under), counts no delivery toward poison;
        the reaper leaves the run alone for hold seconds (its worker sends it again)."""

    def cancel_reason(self, run_id: str) -> str | None:
        """Why the run was cancelled, or None."""

    def was_done(self, key: str) -> tuple[bool, Any]:
        """Whether the ledger holds key, and the effect's recorded result."""

    def mark_done(self, cp: Checkpoint, key: str, result: Any) -> bool:
        """Record in the ledger that the effect of key ran, for the step at cp, fenced
        like a save; the first mark stays. False if fenced."""

    def journal(self, run_id: str, cursor: str, visit: int) -> list[Call]:
        """The calls recorded for the step's visit, in order."""

    def record_call(
        self, cp: Checkpoint, visit: int, call: Call, tx: StepTx | None = None
    ) -> Recorded | None:
        """Journal call for the step at cp, fenced like a save; None if fenced, else the
        run's cancel reason as the record read it. tx: the call's own transaction (ctx.db
        inside it), committed with the record. A run with budgets (cp.budgets) settles
        the call's hold and adds its cost to each in the same transaction."""

    def reserve(
        self, cp: Checkpoint, visit: int, pos: int, usd: float, tokens: int = 0
    ) -> Budget | None:
        """Admit the call at pos of the step at cp (cp.cursor: its journal's) against each
        of cp.budgets, holding its worst case (usd, tokens) until record_call settles it
        with the call's cost and tokens (a call
        already holding, from an attempt killed in it, is admitted again): None, or the
        budget it would pass. Atomic: two runs of a tree cannot both take the last room.
        Fenced like record_call: StaleWrite, holding nothing, if the run's seq moved on or
        a newer epoch claimed it."""

    def steers(self, run_id: str, numbers: list[int]) -> list[tuple[int, Any]]:
        """The run's steer messages of these numbers (a replayed read), in order."""

    def interrupts(self, run_id: str) -> AbstractContextManager[Cut | None]:
        """While a call that may be interrupted runs: its Cut, fired when a steer message
        with interrupt=True for the run is stored (None: this store cannot hear one now;
        the call then runs uninterrupted)."""

    def steers_pending(self, run_id: str) -> list[tuple[int, Any]]:
        """The run's steer messages that no journal record of it delivered (ctx.messages()
        records what it read), oldest first: (n, message) each."""

    def record_intent(self, cp: Checkpoint, key: str) -> tuple[str, Any]:
        """An at-most-once effect's intent, fenced: written, open, done (with result) or
        fenced."""

    def transaction(self) -> StepTx:
        """A step's own connection (ctx.db), committed by save() with the checkpoint."""

    def outage(self, exc: BaseException) -> Exception | None:
        """The Transient error for a store error raised inside a step, else None."""

    def held(self) -> AbstractContextManager[None]:
        """Within it, this thread's store calls may share one connection (a delivery's,
        in a process that runs one at a time); nothing else about them changes."""


class AdminStore(Protocol):
    """The operator's store (the Client, the web API, the CLI): runs created, read,
    cancelled, signalled, forked, rewound, replayed, resolved and waited for."""

    def create_run(
        self,
        run_id: str,
        workflow: str,
        input: dict[str, Any],
        cursor: str = "",
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
        """Insert a run at seq 0, for tenant if given; False if it existed (a failed one is
        re-armed). With a concurrency key: admitted if one of the key's slots is free, else
        queued. With budget_usd or budget_tokens: a budget over the run and all its
        descendants (budget_soft: the fraction of each limit that is its soft limit).
        RunIdConflict: run_id names a run of another workflow, input or tenant."""

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
        """The (workflow, key)'s run not started yet, made (as run_id) or given this input
        and a start `debounce` seconds from now, at most max_wait after its first enqueue:
        (its run id, created). It waits at seq 0 until wake() sends it."""

    def admitted(self, workflow: str, key: str) -> list[tuple[str, int]]:
        """The key's runs admitted and not sent yet, each (run id, priority), marked sent:
        the caller sends them (each run is returned to one caller)."""

    def gathered(self, run_id: str) -> bool:
        """Whether the run waits for a spawn that has gathered: its signal is unconsumed."""

    # -- reading ----------------------------------------------------------------------
    def get(self, run_id: str) -> Run | None:
        """The run without its window."""

    def load_row(self, run_id: str) -> dict[str, Any] | None:
        """The run's checkpoint as stored (load's columns, the window and forked_from
        with them), unparsed: a reader that must not refuse a row this code cannot load."""

    def list_runs(self, which: RunFilter | None = None) -> list[Run]:
        """Runs newest first, a keyset page at a time (None: the first 50); which.tenant:
        that tenant's only."""

    def counts(self, tenant: str | None = None) -> dict[str, dict[str, Any]]:
        """Runs per status ({status: {"n": ...}}), the statuses that have runs (a
        tenant's runs only, with one)."""

    def history(self, run_id: str) -> list[dict[str, Any]]:
        """The run's step attempts, oldest first."""

    def calls(self, run_id: str, limit: int = 500) -> list[dict[str, Any]]:
        """The run's journaled calls, oldest first."""

    def children(self, run_id: str, seq: int | None = None, limit: int = 10_000) -> list[Run]:
        """The run's children (of the spawn saved at seq, or all), in their spawn's order;
        each of its parent's tenant."""

    def forks(self, run_id: str) -> list[Run]:
        """The runs forked from run_id, oldest first."""

    def open_intents(self, run_id: str) -> list[dict[str, Any]]:
        """The run's at-most-once effects whose outcome is unknown: {key, epoch, ...}."""

    def live_cursors(self) -> list[dict[str, Any]]:
        """Where runs that may still go on stand: {workflow, cursor, runs}, by workflow
        and cursor (a deploy must have these steps)."""

    def clock(self) -> dt.datetime:
        """The store's time now: what updated_at is compared with."""

    def ping(self) -> None:
        """Raise StoreUnavailable unless the store answers."""

    def wait(self, run_id: str, timeout: float | None = None, poll: float = 2.0) -> Run:
        """The run once it is stopped or waiting (cairn.status.SETTLED), looking again at
        least every poll seconds. Raises UnknownRun, or WaitTimedOut after timeout
        seconds (None: no limit)."""

    async def wait_async(self, run_id: str, timeout: float | None = None, poll: float = 2.0) -> Run:
        """wait() for asyncio, holding no thread while it waits."""

    # -- changing ---------------------------------------------------------------------
    def cancel(self, run_id: str, reason: str) -> RunStatus | None:
        """Ask the run to stop; its status now, or None."""

    def signal(
        self, run_id: str, event: str, payload: Any, signal_id: str, traceparent: str | None = None
    ) -> tuple[RunStatus, bool] | None:
        """Store a signal: (the run's status, whether it was new), or None: no such run."""

    def steer(
        self, run_id: str, message: Any, interrupt: bool = False
    ) -> tuple[RunStatus, int | None] | None:
        """Store a steer message as the run's next: (the run's status, its number in the
        run, None when the run has ended and nothing was stored), or None: no such run.
        interrupt: once stored, fire the run's interrupts (the calls in flight watching
        it, in any process)."""

    def fork(
        self,
        origin: str,
        at: int,
        run_id: str,
        patch: dict[str, Any] | None = None,
        traceparent: str | None = None,
    ) -> bool:
        """Create run_id, pending, from the checkpoint origin saved at seq `at` (its input
        patched, its cost at 0, its tenant kept); False if run_id existed (unchanged). Raises UnknownRun, or
        InvalidInput when origin saved no checkpoint at that seq."""

    def rewind(self, run_id: str, at: int) -> int:
        """Move the stopped run back to the checkpoint it saved at seq `at`, in place, at a
        new seq and with visits past every visit it made; its new seq. Raises UnknownRun,
        InvalidInput (no checkpoint at that seq) or RunNotStopped."""

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
        """Re-arm up to limit of the workflow's runs that stopped in one of the statuses
        in [since, until) at their cursor, oldest first; each as it stopped (dry_run: only
        which). The caller sends them."""

    def resolve(self, run_id: str, done: bool, result: Any = None) -> tuple[bool, list[str]]:
        """Settle the run's unknown effects (done, with result; or not: they run again),
        and re-arm it if it stopped as unknown: (re-armed, the keys settled)."""

    def budget(self, run_id: str) -> Budget | None:
        """The budget run_id was enqueued with (over it and its descendants), or None."""

    def raise_budget(
        self, run_id: str, usd: float | None = None, tokens: int | None = None
    ) -> list[str] | None:
        """Set that budget's limits given and re-arm the runs of its tree that stopped over
        budget: their ids, for the caller to send; None when run_id has no budget."""

    def tenant_budget(self, tenant: str) -> Budget | None:
        """The tenant's budget ('tenant:<name>') as it stands in this UTC day or month (a
        later period's first read or check starts its spend again), or None."""

    def set_tenant_budget(
        self,
        tenant: str,
        usd: float | None = None,
        tokens: int | None = None,
        per: str | None = None,
        soft: float | None = None,
    ) -> list[str] | None:
        """Create or change the tenant's budget: the limits given (None: kept), per 'day'
        or 'month' (None: kept; 'day' for a new one), soft (None: kept). Every run of the
        tenant spends against it from its next claim. Re-arms the tenant's runs stopped
        over budget: their ids, for the caller to send; None when the tenant has no budget
        and no limit was given."""

    def delete_tenant_budget(self, tenant: str) -> tuple[Budget, list[str]] | None:
        """Delete the tenant's budget: its runs no longer spend against it (those in flight
        from their next check), and its runs stopped over budget are re-armed. The budget
        as it stood and their ids, for the caller to send; None when it had none."""

    def schedule_store(self) -> Schedules:
        """The schedules kept beside these runs (a fired tick's runs are created here)."""

    def approval_store(self) -> Approvals:
        """The approvals of these runs (a save that waits with a request writes one)."""


class Maintenance(Protocol):
    """The reaper's and the sweep's: runs that look abandoned, and old ones to delete."""

    def stalled(self, pending_after: float, running_after: float) -> list[dict[str, Any]]:
        """Runs that look abandoned: {run_id, status, epoch, updated_at}."""

    def unclaimed(self, older_than: float, limit: int = 10_000) -> list[dict[str, Any]]:
        """Pending runs no worker has taken, oldest first."""

    def unchanged(self, rows: list[dict[str, Any]]) -> set[str]:
        """The run ids among rows with the same epoch and updated_at as listed."""

    def wake(
        self, batch: int = ..., before_commit: Callable[[list[str]], None] | None = None
    ) -> list[str]:
        """Waiting runs whose time came, moved out of waiting (to pending), up to batch:
        each returned to one caller once, to send."""

    def roll_budgets(self, batch: int = ...) -> list[str]:
        """Tenant budgets whose period is over started again, and the runs stopped over a
        tenant's budget in an earlier period re-armed (up to batch): each returned to one
        caller once, to send."""

    def fold_counts(self, batch: int = ...) -> int:
        """Fold the status deltas into the totals; rows folded."""

    def routes(self, run_ids: list[str]) -> dict[str, str]:
        """The pinned runs among run_ids, each with the version it is pinned to."""

    def pinned_runs(self) -> dict[str, tuple[int, int]]:
        """Pinned runs under way per version: (runs, of which waiting)."""

    def sweep(
        self,
        older_than: float,
        batch: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Delete terminal runs older than older_than seconds; how many went."""


class CheckpointStore(RunStore, AdminStore, Maintenance, Protocol):
    """A whole backend: what PgStore and MemoryStore are, and what a worker's loop, its
    reaper and a Client are given."""


class Approvals(Protocol):
    """The approvals inbox: what the runs waiting on a person ask (written by the save
    that parks each), decided once, each decision with its audit row; and the standing
    rules that decide a request as its run saves the wait."""

    def list_approvals(self, which: ApprovalFilter) -> list[Approval]:
        """A page of the undecided approvals whose run still waits on them (which.tenant:
        of that tenant's runs only)."""

    def get(self, approval_id: int, tenant: str | None = None) -> Approval | None:
        """The approval with its decision, or None (tenant: another tenant's is None)."""

    def decide(
        self,
        approval_id: int,
        decision: str,
        payload: dict[str, Any],
        decided_by: str,
        traceparent: str | None = None,
        tenant: str | None = None,
    ) -> str:
        """Decide it and send its run the signal (payload) with the audit row, at once;
        the run's id. Raises UnknownApproval (another tenant's too), AlreadyDecided or
        ApprovalGone."""

    def add_rule(
        self, workflow: str, tool: str, created_by: str, tenant: str | None = None
    ) -> tuple[Rule, bool]:
        """A standing rule (the same workflow, tool and tenant twice is one; tenant: for
        that tenant's runs only); whether it is new."""

    def rules(self, tenant: str | None = None) -> list[Rule]:
        """Every standing rule (tenant: its own), oldest first."""

    def remove_rule(self, rule_id: int, tenant: str | None = None) -> bool:
        """Delete it (tenant: only its own); False if there was none."""


class Schedules(Protocol):
    """The schedules table: what Client.add_schedule and its kin change, and what the
    firer reads and fires (store/sql/schedules.sql)."""

    def add(self, schedule: Schedule, *, replace: bool = False) -> Schedule | None:
        """Insert (or with replace, overwrite) the schedule; None if the name was taken."""

    def get(self, name: str) -> Schedule | None:
        """The schedule of that name, or None."""

    def list_schedules(self) -> list[Schedule]:
        """Every schedule, by name."""

    def pause(self, name: str) -> Schedule | None:
        """Stop firing it; None: no such schedule."""

    def resume(self, current: Schedule, next_at: dt.datetime) -> Schedule | None:
        """Unpause at next_at; None if it was not paused (or was replaced meanwhile)."""

    def remove(self, name: str) -> bool:
        """Delete it; False if there was none."""

    def due(self, now: dt.datetime, limit: int) -> list[Schedule]:
        """The active schedules whose next tick has come, oldest first."""

    def fire(
        self,
        schedule: Schedule,
        next_at: dt.datetime,
        runs: Sequence[tuple[str, dt.datetime]],
        *,
        before_commit: Callable[[], None] | None = None,
    ) -> list[str] | None:
        """Move next_at from the tick the schedule was read at, and create the runs
        ((run_id, tick) pairs), at once; the run ids created, or None if next_at had moved
        (another firer fired it; or it was paused, replaced or removed)."""


class HeldLease(Protocol):
    """A lease this worker holds on one run."""

    run_id: str
    epoch: int
    token: LeaseToken

    def start_heartbeat(self) -> HeldLease:
        """Have the process's heartbeat renew it."""

    def ensure(self, fresh: bool = False) -> None:
        """Raise LeaseLost unless this worker provably still holds it."""

    def renew(self) -> None:
        """Extend it now; raise LeaseLost if another owner holds it or it expired."""

    def release(self, ended: bool = False) -> None:
        """Let go of the run (ended: its epoch counter goes too)."""


class LeaseManager(Protocol):
    """Per-run leases with fencing epochs, shared by the fleet."""

    def acquire(self, run_id: str, ttl: float, floor: int = 0) -> HeldLease | None:
        """The run's lease with an epoch above floor, or None while another holds it."""

    def holder(self, run_id: str) -> LeaseToken | None:
        """Who holds the run's lease."""

    def break_dead(self, run_id: str, token: LeaseToken) -> bool:
        """Delete a dead owner's lease, only if it is still token."""

    def unheld(self, run_ids: list[str]) -> list[str]:
        """The run ids whose lease is gone."""

    def lost_deliveries(self, older_than: float, limit: int = ...) -> list[str]:
        """Runs a delivery took over older_than seconds ago and never let go of."""

    def mark_sent(self, run_id: str, window: float) -> bool:
        """False while an earlier message for the run is out and untaken."""
