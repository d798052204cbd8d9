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


def sent(run_id: str) -> str:
    """A resume message was sent for the run and no worker has taken it yet: set NX by
    the reaper and by a resend after a lost pool process, deleted by the next acquire.
    While it lives the reaper sends no other, so a queue that backs up under many
    crashes is not flooded with duplicates (each one a slot spent, and a longer wait
    for the rest). Its TTL bounds the wait for a message that was lost after all."""
    return f"{PREFIX}:sent:{run_id}"
