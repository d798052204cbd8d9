"""cairn: durable multi-step LLM agent runs on a Celery fleet.

    import cairn

    flow = cairn.workflow("greet")

    @flow.step()
    def hello(ctx: cairn.Context) -> cairn.StepResult:
        return cairn.StepResult(cursor="done", state={"greeted": ctx.input["name"]})

    with cairn.Client() as client:           # CAIRN_DATABASE_URL / CAIRN_BROKER_URL
        run_id = client.enqueue("greet", {"name": "Ada"})

`cairn.__all__` is what a workflow author or a web app calls or catches; the errors of
cairn's own control flow (a delivery deferred, retried, handed off) stay in
cairn.core.errors. Names are loaded on first use, so `import cairn` stays cheap for a web app: it imports
neither Celery's worker, the anthropic SDK, prometheus_client, typer nor rich.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cairn.core.errors import (
    AlreadyDecided,
    ApprovalGone,
    BudgetExceeded,
    CairnError,
    CallFailed,
    CallInterrupted,
    Cancelled,
    EventRefused,
    Forbidden,
    InvalidInput,
    JournalDiverged,
    LeaseLost,
    ModelUnavailable,
    MultipleEffects,
    OutcomeUnknown,
    RunEnded,
    RunIdConflict,
    RunNotStopped,
    StepStopped,
    StoreUnavailable,
    Transient,
    UnknownApproval,
    UnknownRun,
    UnknownWorkflow,
    WaitTimedOut,
)
from cairn.core.lazy import loader

# pyproject.toml holds the version; this reads the installed package's metadata when first
# asked (importlib.metadata at import would cost every `import cairn` some 50 ms).
__version__: str

# name -> module that defines it, imported when the name is first read
_LAZY = {
    "workflow": "cairn.steps.registry",
    "Workflow": "cairn.steps.registry",
    "StepResult": "cairn.steps.registry",
    "Retry": "cairn.steps.registry",
    "Child": "cairn.steps.registry",
    "DONE": "cairn.steps.registry",
    "Context": "cairn.steps.context",
    "text_of": "cairn.steps.model",
    "ModelClient": "cairn.steps.model",
    "set_price": "cairn.steps.model",
    "cost_of": "cairn.steps.model",
    "Event": "cairn.core.events",
    "current": "cairn.steps.context",
    "Client": "cairn.client",
    "AsyncClient": "cairn.client",
    "Run": "cairn.core.records",
    "StepRecord": "cairn.core.records",
    "CallRecord": "cairn.core.records",
    "Approval": "cairn.core.records",
    "Decision": "cairn.core.records",
    "Rule": "cairn.core.records",
    "RunStatus": "cairn.core.status",
    "Settings": "cairn.core.settings",
    "Middleware": "cairn.workers.middleware",
    "Schedule": "cairn.store.schedules",
    "ScheduleConflict": "cairn.workers.schedules",
    "UnknownSchedule": "cairn.workers.schedules",
}

if TYPE_CHECKING:
    from cairn.client import AsyncClient, Client
    from cairn.core.events import Event
    from cairn.core.records import Approval, CallRecord, Decision, Rule, Run, StepRecord
    from cairn.core.settings import Settings
    from cairn.core.status import RunStatus
    from cairn.steps.context import Context, current
    from cairn.steps.model import ModelClient, cost_of, set_price, text_of
    from cairn.steps.registry import DONE, Child, Retry, StepResult, Workflow, workflow
    from cairn.store.schedules import Schedule
    from cairn.workers.middleware import Middleware
    from cairn.workers.schedules import ScheduleConflict, UnknownSchedule


_load = loader("cairn", _LAZY, globals())


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        globals()[name] = found = version("cairn")
        return found
    return _load(name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, "__version__"})


__all__ = [
    "DONE",
    "AlreadyDecided",
    "Approval",
    "ApprovalGone",
    "AsyncClient",
    "BudgetExceeded",
    "CairnError",
    "CallFailed",
    "CallInterrupted",
    "CallRecord",
    "Cancelled",
    "Child",
    "Client",
    "Context",
    "Decision",
    "Event",
    "EventRefused",
    "Forbidden",
    "InvalidInput",
    "JournalDiverged",
    "LeaseLost",
    "Middleware",
    "ModelClient",
    "ModelUnavailable",
    "MultipleEffects",
    "OutcomeUnknown",
    "Retry",
    "Rule",
    "Run",
    "RunEnded",
    "RunIdConflict",
    "RunNotStopped",
    "RunStatus",
    "Schedule",
    "ScheduleConflict",
    "Settings",
    "StepRecord",
    "StepResult",
    "StepStopped",
    "StoreUnavailable",
    "Transient",
    "UnknownApproval",
    "UnknownRun",
    "UnknownSchedule",
    "UnknownWorkflow",
    "WaitTimedOut",
    "Workflow",
    "cost_of",
    "current",
    "set_price",
    "text_of",
    "workflow",
]
