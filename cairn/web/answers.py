"""What the API answers: a pydantic model for every 2xx body, each a named schema of the
OpenAPI document. The routes declare them as their response_model, so FastAPI validates
each answer against the model the document was made from: a field the code adds, drops
or retypes fails the route (and tests/fleet/test_openapi.py), never the document alone.

The models describe the JSON the records' to_json() give (cairn.core.records, the
schedules'), unchanged: times as the ISO 8601 text those give, not re-encoded. A run
event (GET /runs/{run_id}/events) is not validated here, it is passed on as the stream
holds it; Event and the kinds' data models document it for generated clients.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, WithJsonSchema

from cairn.core.status import RunStatus

# A time as to_json() writes it (datetime.isoformat()), kept as that text.
DateTime = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]
JSONObject = dict[str, Any]


class Answer(BaseModel):
    # forbid: a field the server sends that the model lacks is a failure, not a secret.
    model_config = ConfigDict(extra="forbid")


class Run(Answer):
    """One run: where it stands, its input, its state (the result once done), its cost."""

    run_id: str
    workflow: str
    status: RunStatus
    cursor: str = Field(description='The step that comes next ("" before the first).')
    seq: int = Field(description="Bumps on every save.")
    cost_usd: float
    resumes: int = Field(description="How often another worker took the run over.")
    error: str | None
    created_at: DateTime
    updated_at: DateTime
    input: JSONObject | None
    state: JSONObject | None = Field(description="The run's results; its result once done.")
    parent_id: str | None = Field(description="A child run's parent (StepResult.spawn).")
    concurrency_key: str | None
    priority: int
    traceparent: str | None = Field(description="W3C trace context of the enqueuing span.")
    forked_from: str | None = Field(description="A fork's origin run.")
    forked_at: int | None = Field(description="And the origin's seq it went on from.")
    wakes_at: DateTime | None = Field(
        default=None,
        description="A waiting run's wake time (its sleep's end, its wait's timeout); "
        "absent otherwise.",
    )
    started_version: str | None = Field(
        default=None,
        description="The code version (CAIRN_CODE_VERSION) of the worker that started it; "
        "null before one did.",
    )
    tenant: str | None = Field(
        default=None,
        description="The tenant it is for (the token that started it, or its parent's or "
        "origin's); null: none.",
    )
    cancelled_by: str | None = Field(
        default=None,
        description="Who asked it to stop: 'token <id>' (a `cairn tokens` token), 'admin' "
        "(CAIRN_API_TOKEN), the name a Client or the CLI gave; absent: nobody did (a "
        "parent's cancel names who on the parent), or a list's row.",
    )


class RunPage(Answer):
    """A page of runs, newest first."""

    runs: list[Run]
    next_cursor: str | None = Field(description="Pass as cursor for the next page; null: the last.")


class Children(Answer):
    run_id: str
    children: list[Run]


class Forks(Answer):
    run_id: str
    forks: list[Run]


class Step(Answer):
    """One step attempt that ended: where it ran, how it ended, when, on which worker."""

    seq: int
    cursor: str
    visit: int
    outcome: str = Field(description="saved, retry, or how it stopped the run (failed, ...).")
    started_at: DateTime
    ended_at: DateTime
    worker: str | None
    epoch: int = Field(description="The lease epoch the attempt ran under.")
    cost_usd: float
    effect_key: str | None
    error: str | None
    next_cursor: str | None = Field(description="Where a saved step went on.")
    code_version: str | None = Field(
        default=None, description="The code version of the worker that wrote the row."
    )
    seconds: float


class Steps(Answer):
    run_id: str
    steps: list[Step]


class CallError(Answer):
    """The permanent error a journaled call raised: its class (type, module), its args
    and its message."""

    type: str
    module: str
    args: list[Any]
    message: str


class Call(Answer):
    """One journaled call (a model request, a ctx.call): its outcome and its cost."""

    cursor: str
    visit: int
    pos: int = Field(description="Its place in the step visit.")
    name: str = Field(description='"model" for a model request, else the call\'s name.')
    result: Any = Field(description="What it returned (null if it raised).")
    error: CallError | None
    cost_usd: float
    created_at: DateTime | None


class Calls(Answer):
    run_id: str
    calls: list[Call]


class Replayed(Answer):
    workflow: str
    dry_run: bool
    replayed: int = Field(description="How many were re-armed (0 for a dry run).")
    runs: list[Run]


class Signalled(Answer):
    stored: bool = Field(description="false: a signal with this signal_id was there already.")
    run: Run


class Steered(Answer):
    """A steer message stored: its number in the run (1, 2, ...), delivered in that order."""

    n: int = Field(ge=1)


class Budget(Answer):
    """A budget over a run and its descendants, or over a tenant's runs per UTC day or
    month: its limit, what their journaled calls cost, and the worst case of their calls
    in flight."""

    scope: str = Field(description="run:<id> of the run it was enqueued with, or tenant:<name>.")
    limit_usd: float | None = Field(description="null: no limit in dollars.")
    soft: float | None = Field(description="The soft limit, a fraction of each limit.")
    spent_usd: float
    reserved_usd: float
    limit_tokens: int | None = Field(description="null: no limit in tokens.")
    spent_tokens: int
    reserved_tokens: int
    period: Literal["day", "month"] | None = Field(
        description="A tenant's: spent counts per UTC day or month; null for a tree's."
    )
    period_start: DateTime | None = Field(description="When the period spent counts began.")


class Decision(Answer):
    """An approval's decision, as its audit row keeps it."""

    decision: Literal["approve", "deny", "edit"]
    payload: JSONObject = Field(
        description="The signal its run got: decision, args (an edit's), note, approval_id, "
        "by (a rule's: rule_id)."
    )
    decided_by: str = Field(
        description="Who: 'token <id>' (a `cairn tokens` token), 'admin' (CAIRN_API_TOKEN), "
        "the name a Client or the CLI gave, or 'rule N'."
    )
    decided_at: DateTime
    rule_id: int | None = Field(description="The standing rule that decided it, if one did.")
    decided_token: str | None = Field(
        description="The id of the `cairn tokens` token it was decided with (null: "
        "CAIRN_API_TOKEN, a Client or the CLI, or a rule)."
    )
    decided_tenant: str | None = Field(
        description="The tenant the decider acted for (null: an admin, or a rule)."
    )


class Approval(Answer):
    """A run waiting on a person: what it asks (request: tool, args, prompt, ...)."""

    approval_id: int
    run_id: str
    workflow: str
    event: str = Field(description="The wait's event name: the decision is sent as it.")
    tool: str | None
    request: JSONObject
    created_at: DateTime
    waiting: bool = Field(description="Undecided, its run parked on it.")
    decision: Decision | None


class ApprovalPage(Answer):
    """A page of the approvals still waiting, newest (or oldest) first."""

    approvals: list[Approval]
    next_cursor: int | None = Field(description="Pass as cursor for the next page; null: the last.")


class Counts(RootModel[dict[RunStatus, int]]):
    """How many runs are in each status (a status with none: absent)."""


class Schedule(Answer):
    """A workflow started on a clock."""

    name: str
    workflow: str
    input: JSONObject
    cron: str | None
    every: int | None = Field(description="Seconds between ticks (or cron).")
    catch_up: Literal["latest", "all", "skip"]
    paused: bool
    next_at: DateTime
    last_fired_at: DateTime | None
    created_at: DateTime | None


class Schedules(Answer):
    schedules: list[Schedule]


class EventsToken(Answer):
    """A token that reads one run's events and nothing else, for a browser's EventSource
    (which sends no Authorization header)."""

    run_id: str
    token: str = Field(description='Pass as ?token= ("": the server runs without a token).')
    url: str = Field(
        description="The events' path with the token, for new EventSource(url).",
        examples=["/runs/order-77/events?token=5f0c..."],
    )


# -- run events (GET /runs/{run_id}/events), for the document ------------------------------


class Event(BaseModel):
    """One run event, the JSON of an SSE event's data."""

    id: str = Field(description="Resume after it: Last-Event-ID or ?after=.")
    kind: str = Field(description="cairn's own kinds (EventKind) or a step's ctx.emit kind.")
    data: Any = Field(description="The kind's data: see the *Data schemas.")
    cursor: str | None = None
    visit: int | None = None
    attempt: int | None = Field(
        default=None, description="The attempt's lease epoch: a later attempt's is larger."
    )
    seq: int | None = None
    ts: float = Field(description="Unix time it was emitted.")
    durable: bool = Field(description="Rebuilt from Postgres after a gap, not the live stream.")


EventKind = Literal[
    "step_started",
    "token",
    "model_restart",
    "message",
    "call",
    "budget_soft",
    "step_saved",
    "retry",
    "attempt_abandoned",
    "wait",
    "resumed",
    "run_ended",
    "dropped",
    "gap",
]


class EventData(BaseModel):
    # An event told late (by the worker that took over) says so.
    model_config = ConfigDict(extra="allow")
    late: bool | None = None


class TokenData(EventData):
    """token: a text delta of a streamed model call."""

    call: int
    text: str


class ModelRestartData(EventData):
    """model_restart: the streamed call was retried: drop its tokens so far."""

    call: int


class ToolCall(BaseModel):
    id: str | None
    name: str | None
    input: Any


class MessageData(EventData):
    """message: a model call's whole answer, once journaled."""

    call: int
    text: str
    tool_calls: list[ToolCall]
    cost_usd: float | None = None
    replayed: bool | None = None


class CallData(EventData):
    """call: a journaled ctx.call's outcome (result, or error)."""

    call: int
    name: str
    result: Any = None
    error: str | None = None


class BudgetSoftData(EventData):
    """budget_soft: this call's cost took a budget past its soft limit (once)."""

    scope: str


class StepSavedData(EventData):
    """step_saved: the attempt's checkpoint committed: its events stand."""

    next: str | None = None
    status: RunStatus | None = None


class RetryData(EventData):
    """retry: the attempt failed and will be retried: drop its events."""

    error: str | None = None
    attempt: int | None = None
    delay: float | None = None


class AttemptAbandonedData(EventData):
    """attempt_abandoned: the attempt was cut (a killed worker): drop its events."""

    cursor: str | None
    visit: int | None
    attempt: int


class WaitData(EventData):
    """wait: the run waits for a signal (event) or a timeout, holding no worker."""

    event: str | None = None


class ResumedData(EventData):
    """resumed: the run goes on after a wait, or after a lost worker."""

    reason: str | None = None


class RunEndedData(EventData):
    """run_ended: the run stopped; the last event."""

    status: RunStatus
    error: str | None
    cost_usd: float


class DroppedData(EventData):
    """dropped: events of the run were lost before Redis."""

    reason: str
    count: int | None = None


class GapData(EventData):
    """gap: the stream could not give all that was asked; the durable record follows."""

    reason: str


# Each kind's data model, for the document (cairn.web.openapi adds them).
EVENT_DATA: tuple[type[BaseModel], ...] = (
    TokenData,
    ModelRestartData,
    MessageData,
    CallData,
    BudgetSoftData,
    StepSavedData,
    RetryData,
    AttemptAbandonedData,
    WaitData,
    ResumedData,
    RunEndedData,
    DroppedData,
    GapData,
)
