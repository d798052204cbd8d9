"""Every error cairn raises, in one hierarchy, so callers can catch a family.

CairnError
├── Transient           retry later; never fails the run (StoreUnavailable, ModelUnavailable)
├── Superseded          another worker has the run: stop at once (LeaseLost, StaleWrite)
└── the rest            permanent: the run (or the call) fails with the message
"""

from __future__ import annotations


class CairnError(Exception):
    """Root of cairn's errors."""


class Transient(CairnError):
    """An outside service failed in a way a later attempt may not: retry this step later.

    Raise it from a step for "not now" (a 503, a rate limit): the run is retried, not failed.
    """


class StoreUnavailable(Transient):
    """Postgres or Redis could not be reached (after retries); nothing was written."""


class ModelUnavailable(Transient):
    """The model API kept answering 429/5xx/overloaded, or could not be reached."""


class Superseded(CairnError):
    """Another worker owns the run now: touch nothing more, it will finish the run."""

    run_id: str


class StoreError(CairnError):
    """Postgres refused a statement for a reason a retry would not change."""


class StaleWrite(Superseded):
    """A save did not apply: a newer seq or a newer lease epoch owns the run."""

    def __init__(self, run_id: str, seq: int, epoch: int) -> None:
        super().__init__(
            f"run {run_id}: save of seq {seq} at epoch {epoch} was rejected; "
            "another worker owns this run"
        )
        self.run_id, self.seq, self.epoch = run_id, seq, epoch


class LeaseLost(Superseded):
    """This worker's lease on the run expired or was taken by another worker."""

    def __init__(self, run_id: str, detail: str) -> None:
        super().__init__(f"run {run_id}: lease lost ({detail})")
        self.run_id = run_id


class IncompatibleCheckpoint(CairnError):
    """The stored checkpoint was written in a payload version this code cannot read."""

    def __init__(self, run_id: str, found: int, expected: int) -> None:
        super().__init__(
            f"run {run_id}: checkpoint payload version {found}, this code reads {expected}; "
            "refusing to resume (deploy a version that reads it, or migrate the row)"
        )
        self.found, self.expected = found, expected


class CorruptCheckpoint(CairnError):
    """The stored checkpoint does not have the shape cairn writes."""


class UnknownRun(CairnError):
    """No run with that id exists."""


class UnknownWorkflow(CairnError):
    """No workflow is registered under that name."""


class InvalidInput(CairnError):
    """The run's input (or run id) was refused: the message says what to change."""


class RunIdConflict(CairnError):
    """A run with this id exists with another workflow or another input."""


class WindowTooLarge(CairnError):
    """The model window is still over the size limit after compaction."""


class Cancelled(CairnError):
    """The run was cancelled: it performs no further effect."""


class BudgetExceeded(CairnError):
    """The next model call could take the run past its cost cap: the run stops first."""


class MultipleEffects(CairnError):
    """A step asked for a second keyed effect: one externally visible effect per step."""
