"""What the API's requests and responses look like: the bodies it takes (each a strict
pydantic model, so /openapi.json states every rule it checks) and the schema fragments
the routes' parameters share.

The error shape is cairn.web.errors'; the rest of the document, cairn.web.openapi's.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from cairn.core.inputs import LIMIT_MAX, MAX_PRIORITY, MIN_PRIORITY, RUN_ID_MAX
from cairn.core.status import CANCEL_REASON

# A run id's characters (cairn.core.inputs.RUN_ID), anchored as JSON Schema wants. The
# server checks them itself, for an error that says the rule in words.
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+=/-]*$"
RUN_ID_SCHEMA: dict[str, Any] = {"pattern": RUN_ID_PATTERN, "maxLength": RUN_ID_MAX}
# A tenant's name (cairn.core.inputs.TENANT), as RUN_ID_SCHEMA.
TENANT_SCHEMA: dict[str, Any] = {"pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]*$", "maxLength": 100}
# An event id (cairn.client.events.EVENT_ID): a stream entry's, one told from Postgres
# after it (~k, ~end), or 0 for the run's start (what many SSE clients send).
EVENT_ID_SCHEMA: dict[str, Any] = {
    "pattern": r"^(0|\d{1,20}-\d{1,20}(~(\d{1,9}|end))?)$",
    "examples": ["1733312345678-0", "1733312345678-0~2", "0"],
}
# A signal's event: what check_event refuses (NUL, cairn's own names), as a pattern.
EVENT_NAME_PATTERN = r"^(?!cairn\.)[^\x00]+$"
# One Server-Sent Event of GET /runs/{run_id}/events (OpenAPI 3.1: `schema` is one event),
# named ServerSentEvent in the document (cairn.web.openapi).
SSE_EVENT: dict[str, Any] = {
    "title": "ServerSentEvent",
    "type": "object",
    "required": ["data"],
    "properties": {
        "event": {
            "type": "string",
            "description": "cairn's own kinds by name (run_ended, gap, ...); a step's own "
            "events come unnamed, their kind in data.",
        },
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {"$ref": "#/components/schemas/Event"},
            "description": "The event as JSON: id, kind, data, cursor, visit, attempt, seq, "
            "ts, durable.",
        },
        "id": {"type": "string", "description": "Resume after it: Last-Event-ID or ?after=."},
        "retry": {"type": "integer"},
    },
}

# The largest whole number every JSON parser reads exactly (a double's 53 bits): a bound
# for counts and seqs that a fuzzer's 2**63 + 1 cannot round past.
WHOLE_MAX = 2**53
# A string without NUL, which no Postgres text can hold.
NO_NUL = r"^[^\x00]*$"


def _whole(value: Any) -> Any:
    # JSON Schema's integer: 3 and 3.0 (strict int would refuse 3.0), never "3" nor true.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


WHOLE = BeforeValidator(_whole)  # after the int's own Field, for them to reach the schema
_ISO = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]")


def _iso(value: Any) -> Any:
    # pydantic would take 0.5 as a Unix time: a date-time is a string that looks like one.
    if isinstance(value, dt.datetime):
        return value
    if isinstance(value, str) and _ISO.match(value):
        return dt.datetime.fromisoformat(value)  # ValueError: pydantic's 422
    raise ValueError("a date-time is an RFC 3339 string, e.g. 2026-12-04T19:45:00Z")


def _utc(when: dt.datetime) -> dt.datetime:
    # A time sent without a zone is UTC: the server's zone is not the caller's.
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


Timestamp = Annotated[
    dt.datetime,
    BeforeValidator(_iso),
    AfterValidator(_utc),
    Field(description="RFC 3339, e.g. 2026-12-04T19:45:00Z (without an offset: UTC)."),
]


class NewRun(BaseModel):
    """A run to start: the workflow's name and its input (a JSON object)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    # The examples are the operation's (openapi.request_examples): one this server takes.
    workflow: str = Field(min_length=1, max_length=200, pattern=NO_NUL)
    input: dict[str, Any] = Field(default_factory=dict)
    run_id: str | None = Field(
        default=None,
        description="Your id for the run; the same id again is the same run. With an "
        "Idempotency-Key header too, the two must be equal.",
        json_schema_extra=RUN_ID_SCHEMA,
    )
    max_cost_usd: float | None = Field(default=None, ge=0, description="Model cost cap.")
    concurrency_key: str | None = Field(
        default=None,
        description="At most concurrency_limit runs of the workflow with this key at a time; "
        "the others wait as queued.",
        examples=["user:42"],
        json_schema_extra=RUN_ID_SCHEMA,
    )
    concurrency_limit: Annotated[int, Field(ge=1, le=LIMIT_MAX), WHOLE] | None = Field(
        default=None, description="Runs per key at a time (default: the workflow's, or 1)."
    )
    priority: Annotated[int, Field(ge=MIN_PRIORITY, le=MAX_PRIORITY), WHOLE] | None = Field(
        default=None, description="Higher starts first (default: the workflow's, or 0)."
    )
    debounce_key: str | None = Field(
        default=None,
        description="The runs of the workflow with this key collapse into one: each POST "
        "returns the run not started yet, which starts with the latest input once no POST "
        "came for `debounce` seconds. No run_id (nor Idempotency-Key) with it.",
        examples=["conv-42"],
        json_schema_extra=RUN_ID_SCHEMA,
    )
    debounce: float | None = Field(
        default=None, gt=0, description="The quiet period, in seconds (with debounce_key)."
    )
    max_wait: float | None = Field(
        default=None,
        gt=0,
        description="The latest start, in seconds after the first POST (at least debounce; "
        "default: no bound).",
    )
    budget_usd: float | None = Field(
        default=None,
        gt=0,
        description="A budget over the run and every run it spawns: a model call that could "
        "pass it stops its run as budget_exceeded first. Not with a debounce.",
    )
    budget_tokens: Annotated[int, Field(ge=1, le=WHOLE_MAX), WHOLE] | None = Field(
        default=None,
        description="The same budget in model tokens (prompt and output), alone or beside "
        "budget_usd.",
    )
    budget_soft: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="With a budget: the fraction of each limit whose crossing is a "
        "budget_soft event.",
    )


class RaiseBudget(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    usd: float | None = Field(default=None, gt=0, description="The new limit, in dollars.")
    tokens: Annotated[int, Field(ge=1, le=WHOLE_MAX), WHOLE] | None = Field(
        default=None, description="The new limit, in model tokens."
    )


class TenantBudget(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    usd: float | None = Field(default=None, gt=0, description="The limit, in dollars.")
    tokens: Annotated[int, Field(ge=1, le=WHOLE_MAX), WHOLE] | None = Field(
        default=None, description="The limit, in model tokens."
    )
    per: Literal["day", "month"] | None = Field(
        default=None, description="What spent counts per, in UTC [kept; day for a new budget]."
    )
    soft: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="The fraction of each limit whose crossing is a budget_soft event [kept].",
    )


class Fork(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    at_seq: Annotated[int, Field(ge=1, le=WHOLE_MAX), WHOLE] = Field(
        description="The seq of the saved step to go on from."
    )
    new_run_id: str | None = Field(
        default=None, description="The new run's id [a new one].", json_schema_extra=RUN_ID_SCHEMA
    )
    input_patch: dict[str, Any] | None = Field(
        default=None, description="Merged into the run's input (top-level keys)."
    )


class Rewind(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    to_seq: Annotated[int, Field(ge=1, le=WHOLE_MAX), WHOLE] = Field(
        description="The seq of the saved step to go back to."
    )


class Replay(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    workflow: str = Field(
        min_length=1, max_length=200, pattern=NO_NUL, description="Whose stopped runs to replay."
    )
    since: Timestamp = Field(
        description="Runs that stopped at or after this time (RFC 3339; no offset: UTC)."
    )
    until: Timestamp | None = Field(
        default=None, description="And before this time [the replay's start]."
    )
    status: list[Literal["failed", "incompatible"]] = Field(
        default=["failed"], min_length=1, description="Which stopped runs."
    )
    limit: Annotated[int, Field(ge=1, le=WHOLE_MAX), WHOLE] | None = Field(
        default=None, description="At most this many [all]."
    )
    dry_run: bool = Field(default=False, description="Only list them: nothing written.")


class Cancel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    reason: str = Field(default=CANCEL_REASON, max_length=500, pattern=NO_NUL)


class Resolve(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    done: bool = Field(description="Whether the effect whose outcome was unknown happened.")
    result: Any = Field(default=None, description="With done: the effect's result.")


class NewSignal(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    payload: Any = None
    signal_id: str | None = Field(
        default=None,
        description="The same id twice is one signal.",
        json_schema_extra=RUN_ID_SCHEMA,
    )


class NewSteer(BaseModel):
    """A message for a running agent, read by its step at its next ctx.messages()."""

    model_config = ConfigDict(extra="forbid", strict=True)
    message: Any = Field(
        description="JSON: a string, or an object such as a chat message.",
        examples=["Also check the invoice date."],
    )
    interrupt: bool = Field(
        default=False,
        description="Also cut the run's call in flight, if it was made interruptible: its "
        "answer is discarded and the step reads the message at once.",
    )


class NewDecision(BaseModel):
    """A decision on an approval: approve, deny, or edit (approve with edited args)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    decision: Literal["approve", "deny", "edit"]
    args: dict[str, Any] | None = Field(
        default=None, description="An edit's arguments for the tool (only with edit)."
    )
    note: str | None = Field(default=None, max_length=2000, pattern=NO_NUL)


class NewSchedule(BaseModel):
    """A workflow started on a clock: a cron expression (UTC) or every N seconds."""

    model_config = ConfigDict(extra="forbid", strict=True)
    # The whole request's example is the operation's (openapi.request_examples).
    name: str = Field(min_length=1, max_length=100, pattern=NO_NUL, examples=["nightly"])
    workflow: str = Field(min_length=1, max_length=200, pattern=NO_NUL)
    input: dict[str, Any] = Field(default_factory=dict)
    cron: str | None = Field(default=None, max_length=200, pattern=NO_NUL, examples=["0 3 * * *"])
    every: Annotated[int, Field(ge=1, lt=2**31), WHOLE] | None = Field(
        default=None, description="Seconds between ticks (or cron)."
    )
    catch_up: Literal["latest", "all", "skip"] = "latest"
    replace: bool = Field(default=False, description="Overwrite a schedule of that name.")


class Health(BaseModel):
    ok: bool
    problems: list[str] = Field(description="What does not answer: Postgres, the broker.")
