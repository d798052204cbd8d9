"""The store contract: what the loop, Context, the reaper, the Client and the web API call
on a checkpoint store and on the leases (LangGraph's BaseCheckpointSaver, in small).

`PgStore` and the Redis `Leases` implement it, and so do their in-memory twins in
`cairn.testing` (`MemoryStore`, `MemoryLeases`); tests/test_store_contract.py runs one
suite against both, so the twins cannot drift from the real thing. The loop, Context and
the reaper are typed against these protocols, never against a backend.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from cairn.core.records import Attempt, Call, Checkpoint, Run, Saved, Spawned, Wait
    from cairn.core.status import RunStatus
    from cairn.store.lease import LeaseToken
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


class CheckpointStore(Protocol):
    """Runs and their checkpoints; every write that changes a run is fenced by its epoch."""

    # -- the loop and Context ---------------------------------------------------------
    def load(self, run_id: str) -> Checkpoint | None:
        """The run's checkpoint with its live window, or None: no such run."""

    def claim(self, run_id: str, epoch: int) -> Checkpoint | None:
        """Fence the run at epoch and return it; None if it stopped or its epoch is not older."""

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

    def cancel_reason(self, run_id: str) -> str | None:
        """Why the run was cancelled, or None."""

    def was_done(self, key: str) -> tuple[bool, Any]:
        """Whether the ledger holds key, and the effect's recorded result."""

    def mark_done(self, cp: Checkpoint, key: str, result: Any) -> bool:
        """Record in the ledger that the effect of key ran, for the step at cp, fenced
        like a save; the first mark stays. False if fenced."""

    def journal(self, run_id: str, cursor: str, visit: int) -> list[Call]:
        """The calls recorded for the step's visit, in order."""

    def record_call(self, cp: Checkpoint, visit: int, call: Call, tx: StepTx | None = None) -> bool:
        """Journal call for the step at cp, fenced like a save; False if fenced. tx: the
        call's own transaction (ctx.db inside it), committed with the record."""

    def record_intent(self, cp: Checkpoint, key: str) -> tuple[str, Any]:
        """An at-most-once effect's intent, fenced: written, open, done (with result) or
        fenced."""

    def transaction(self) -> StepTx:
        """A step's own connection (ctx.db), committed by save() with the checkpoint."""

    def outage(self, exc: BaseException) -> Exception | None:
        """The Transient error for a store error raised inside a step, else None."""

    # -- the Client and the web API -----------------------------------------------------
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
    ) -> bool:
        """Insert a run at seq 0; False if it existed (a failed one is re-armed). With a
        concurrency key: admitted if one of the key's slots is free, else queued."""

    def admitted(self, workflow: str, key: str) -> list[tuple[str, int]]:
        """The key's runs admitted and not sent yet, each (run id, priority), marked sent:
        the caller sends them (each run is returned to one caller)."""

    def get(self, run_id: str) -> Run | None:
        """The run without its window."""

    def children(self, run_id: str, seq: int | None = None, limit: int = 10_000) -> list[Run]:
        """The run's children (of the spawn saved at seq, or all), in their spawn's order."""

    def gathered(self, run_id: str) -> bool:
        """Whether the run waits for a spawn that has gathered: its signal is unconsumed."""

    def signal(
        self, run_id: str, event: str, payload: Any, signal_id: str, traceparent: str | None = None
    ) -> tuple[RunStatus, bool] | None:
        """Store a signal: (the run's status, whether it was new), or None: no such run."""

    def cancel(self, run_id: str, reason: str) -> RunStatus | None:
        """Ask the run to stop; its status now, or None."""

    def history(self, run_id: str) -> list[dict[str, Any]]:
        """The run's step attempts, oldest first."""

    def calls(self, run_id: str, limit: int = 500) -> list[dict[str, Any]]:
        """The run's journaled calls, oldest first."""

    def list_runs(
        self,
        status: RunStatus | None = None,
        limit: int = 50,
        *,
        workflow: str | None = None,
        after: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
    ) -> list[Run]:
        """Runs newest first, a keyset page at a time."""

    def counts(self) -> dict[str, dict[str, Any]]:
        """Runs per status."""

    # -- the reaper and the sweep -------------------------------------------------------
    def stalled(self, pending_after: float, running_after: float) -> list[dict[str, Any]]:
        """Runs that look abandoned: {run_id, status, epoch, updated_at}."""

    def unclaimed(self, older_than: float, limit: int = 10_000) -> list[dict[str, Any]]:
        """Pending runs no worker has taken, oldest first."""

    def unchanged(self, rows: list[dict[str, Any]]) -> set[str]:
        """The run ids among rows with the same epoch and updated_at as listed."""

    def fold_counts(self, batch: int = ...) -> int:
        """Fold the status deltas into the totals; rows folded."""

    def sweep(
        self,
        older_than: float,
        batch: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Delete terminal runs older than older_than seconds; how many went."""


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
