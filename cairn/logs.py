"""Structured fields for cairn's log calls (procrastinate's `_log_extra`).

Every log call about a run passes `extra=logs.at(cp, "action")` (or `logs.run(run_id,
"action")` before a checkpoint is read), so run_id, cursor, seq, epoch and an action name
are attributes of the LogRecord, not words to find with a regex. A handler or formatter
reads them; the JSON format comes with tracing. The message stays a sentence for a
terminal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cairn.store import Checkpoint

# The attributes every cairn log record carries (None where not known).
FIELDS = ("run_id", "cursor", "seq", "epoch", "action")


def at(cp: Checkpoint, action: str, **more: Any) -> dict[str, Any]:
    """extra= for a log call about the run at checkpoint cp."""
    return {
        "run_id": cp.run_id,
        "cursor": cp.cursor,
        "seq": cp.seq,
        "epoch": cp.epoch,
        "action": action,
        **more,
    }


def run(
    run_id: str | None, action: str, *, epoch: int | None = None, **more: Any
) -> dict[str, Any]:
    """extra= for a log call about a run whose checkpoint is not in hand (or no one run)."""
    return {"run_id": run_id, "cursor": None, "seq": None, "epoch": epoch, "action": action, **more}
