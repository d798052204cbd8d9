"""Every error cairn raises, in one hierarchy, so callers can catch a family.

CairnError
├── Interrupted         this delivery of the run ends; the run does not (never fails it)
│   ├── Transient       retry later (StoreUnavailable, ModelUnavailable; raise it from a step)
│   ├── Deferred        another live worker holds the run's lease: try again later
│   ├── RetryLater      a step failed and its Retry policy runs it again after a delay
│   └── HandOff         give the run back to the queue (worker stopping, signal already in)
└── the rest            permanent: the run (or the call) fails with the message
                        (JournalDiverged, CallFailed, MultipleEffects, ...; and
                        CallInterrupted, which a step catches to read a steer message)

StepStopped (a BaseException, as KeyboardInterrupt is: a step's `except Exception` around
its calls does not swallow it and go on making effects)
├── Superseded          another worker has the run: stop at once (LeaseLost, StaleWrite)
└── Cancelled           the run was cancelled: no further effect

The loop lets every Interrupted, and Superseded, through to the run task, which handles
each kind; a new kind of Interrupted is still handled (retried with backoff, as
Transient) before anyone writes its branch.
"""

from __future__ import annotations


class CairnError(Exception):
    """Root of cairn's errors."""


class Interrupted(CairnError):
    """This delivery stops here and the run goes on later, or on another worker."""


class Transient(Interrupted):
    """An outside service failed in a way a later attempt may not: retry this step later.

    Raise it from a step for "not now" (a 503, a rate limit): the run is retried, not failed.
    """


class StoreUnavailable(Transient):
    """Postgres or Redis could not be reached (after retries); nothing was written."""


class ModelUnavailable(Transient):
    """The model API kept answering 429/5xx/overloaded, or could not be reached."""


class StepStopped(BaseException):
    """The step must stop here, whatever its own code catches: this worker lost the run, or
    the run was cancelled. Not an Exception, so a step that wraps its calls in `except
    Exception` (to retry them, to log and go on) cannot keep running after it."""


class Superseded(StepStopped):
    """Another worker owns the run now: touch nothing more, it will finish the run. The
    delivery ends; the run does not (the run task lets it go)."""

    run_id: str


class Deferred(Interrupted):
    """Another live worker holds the run's lease: try again later, never concurrently."""

    def __init__(self, run_id: str, holder: str | None) -> None:
        super().__init__(f"run {run_id} is held by {holder}")
        self.run_id, self.holder = run_id, holder


class RetryLater(Interrupted):
    """A step failed in a way its Retry policy retries; the attempt is recorded, and the
    run is to be delivered again in `delay` seconds (one retry chain per run)."""

    def __init__(self, run_id: str, delay: float) -> None:
        super().__init__(f"run {run_id}: retry in {delay:g}s")
        self.run_id, self.delay = run_id, delay


class Misrouted(Interrupted):
    """The run is pinned to another code version (versions="pin"): send it to that
    version's queue, its state untouched."""

    def __init__(self, run_id: str, version: str, here: str | None) -> None:
        super().__init__(f"run {run_id} is pinned to version {version}, not this {here}")
        self.run_id, self.version = run_id, version


class HandOff(Interrupted):
    """Give the run back to the queue: the worker is shutting down (the step in hand is
    saved), or the signal a new wait waits for had already come."""


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


class UnknownBudget(InvalidInput):
    """A tenant with no budget: read, or changed without a limit to create it with (an
    InvalidInput to the Client's callers; a 404 over HTTP, where the budget is the
    resource)."""


class Forbidden(InvalidInput):
    """An admin's operation asked for by a tenant (cairn.client.tenancy): a Client with a
    tenant, or a tenant's token (a 403 over HTTP)."""


class RunIdConflict(CairnError):
    """A run with this id exists with another workflow or another input."""


class RunNotStopped(CairnError):
    """Client.rewind of a run that is not stopped (pending, running, waiting, queued)."""


class RunEnded(CairnError):
    """Client.steer of a run that has ended (done, failed, cancelled, over budget): no
    step would read the message."""


class UnknownApproval(CairnError):
    """No approval with that id exists."""


class AlreadyDecided(CairnError):
    """Client.decide of an approval someone (or a standing rule) decided already: a
    request is decided once."""


class ApprovalGone(CairnError):
    """Client.decide of an approval its run no longer waits on (its wait timed out, or
    the run was cancelled): no step would read the decision."""


class WindowTooLarge(CairnError):
    """The model window is still over the size limit after compaction."""


class Cancelled(StepStopped):
    """The run was cancelled: it performs no further effect (the run stops as cancelled)."""


class BudgetExceeded(CairnError):
    """The next model call could take the run past its cost cap: the run stops first."""


class MultipleEffects(CairnError):
    """A step asked for a second keyed effect: one externally visible effect per step."""


class JournalDiverged(CairnError):
    """A replayed step made its journaled calls in another order than the journal holds."""


class CallInterrupted(CairnError):
    """A call made with interruptible=True was cut by a steer message sent with
    interrupt=True (Client.steer): its result is discarded, and the journal records the
    cut, so a replay raises this again at the same place without calling. Catch it and
    read the message with ctx.messages()."""

    def __init__(self, run_id: str, name: str, pos: int) -> None:
        super().__init__(run_id, name, pos)  # its args: what the journal rebuilds it from
        self.run_id, self.name, self.pos = run_id, name, pos

    def __str__(self) -> str:
        return (
            f"run {self.run_id}: call {self.pos} ({self.name!r}) was interrupted by a steer "
            "message; read it with ctx.messages()"
        )


class CallFailed(CairnError):
    """A journaled call's recorded permanent error, replayed where its own exception class
    could not be rebuilt (type_name says which it was)."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name


class OutcomeUnknown(CairnError):
    """An at-most-once effect was started (its intent is recorded) and its outcome is not:
    it is never run again, and the run stops as unknown until someone resolves it."""

    def __init__(self, run_id: str, key: str) -> None:
        super().__init__(
            f"run {run_id}: the at-most-once effect {key} was started and its outcome is "
            "unknown (its worker stopped between the intent and the done mark); find out "
            f"whether it happened, then `cairn runs resolve {run_id} --done` (with --result JSON) "
            f"or `--not-done` (it runs again), or POST /runs/{run_id}/resolve"
        )
        self.run_id, self.key = run_id, key


class WaitTimedOut(CairnError, TimeoutError):
    """Client.wait gave up: the run had not stopped or parked within the timeout."""


class EventRefused(CairnError):
    """ctx.emit was refused: an unknown or reserved kind, data that is not JSON or is
    over CAIRN_MAX_EVENT_BYTES, or a run past CAIRN_MAX_EVENTS. The step fails with it
    (a retry would be refused again)."""
