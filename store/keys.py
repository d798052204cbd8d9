"""Every Redis key cairn uses, and why its TTL is what it is."""

from __future__ import annotations

PREFIX = "cairn"


def lease(run_id: str) -> str:
    """Owner token "<owner>|<epoch>"; TTL = lease TTL, renewed by the heartbeat."""
    return f"{PREFIX}:lease:{run_id}"


def epoch(run_id: str) -> str:
    """Fencing counter, INCR per acquisition; no TTL (it must only grow). Redis losing it
    is survived: acquire takes the stored checkpoint's epoch as a floor."""
    return f"{PREFIX}:epoch:{run_id}"


def reaped(run_id: str) -> str:
    """Set NX when the reaper re-enqueues a run, so a backed-up queue gets one extra
    message per run per reap window, not one per reaper tick."""
    return f"{PREFIX}:reaped:{run_id}"
