"""A run's status, defined once: the store, the loop, the Client, the CLI and the API all
read these names, and the database's CHECK constraint lists the same values (tested).

    queued ──a slot of its concurrency key frees──▶ pending
    pending ──claim──▶ running ──save──▶ running … ──▶ done
       ▲                  │  └──wait──▶ waiting ──signal/timeout──▶ running
       ├── re-armed ◀── failed, incompatible        cancelled, budget_exceeded
       └── resolved ◀── unknown (an at-most-once effect's outcome)
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """Where a run stands. A StrEnum: each member equals its stored string."""

    PENDING = "pending"  # enqueued, or re-armed; no worker has taken it since
    RUNNING = "running"  # a worker has it (or had it, and the reaper will send it again)
    WAITING = "waiting"  # parked until a signal or a timeout; no worker holds it
    DONE = "done"
    FAILED = "failed"  # a permanent error; enqueueing the run again re-arms it
    CANCELLED = "cancelled"
    BUDGET_EXCEEDED = "budget_exceeded"
    INCOMPATIBLE = "incompatible"  # its checkpoint is one this code cannot read
    UNKNOWN = "unknown"  # an at-most-once effect's outcome is unknown: resolve it to go on
    QUEUED = "queued"  # its concurrency key's slots are taken: it starts when one frees

    @property
    def stopped(self) -> bool:
        """No worker works on it (until it is re-armed)."""
        return self in STOPPED


# Never delivered again, and swept after the retention period.
TERMINAL: frozenset[RunStatus] = frozenset(
    {RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.BUDGET_EXCEEDED}
)
# Not worked on: the terminal states, and a checkpoint this code cannot read (until code
# that reads it is deployed and the run is enqueued again).
STOPPED: frozenset[RunStatus] = TERMINAL | {RunStatus.INCOMPATIBLE, RunStatus.UNKNOWN}
# Worked on, or waiting to be: what a cancel reaches.
ACTIVE: frozenset[RunStatus] = frozenset(RunStatus) - STOPPED
# A delivery finds nothing to do: the run stopped, or waits its turn (its key's slot
# frees: then it is sent).
IDLE: frozenset[RunStatus] = STOPPED | {RunStatus.QUEUED}
# Enqueueing the run again resumes it at its cursor.
REARMABLE: frozenset[RunStatus] = frozenset({RunStatus.FAILED, RunStatus.INCOMPATIBLE})
# What Client.wait returns at: the run stopped, or parked until a signal.
SETTLED: frozenset[RunStatus] = STOPPED | {RunStatus.WAITING}
# A cancelled run's error when whoever cancelled it gave no reason.
CANCEL_REASON = "cancel asked"
