"""The records every layer passes around, with no driver behind them: a run as a caller
reads it (Run), its checkpoint as the loop carries it (Checkpoint), a journaled call, a
step attempt, a wait, a spawn, a stream's facts."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any, NamedTuple, TypedDict

from cairn.core.errors import AlreadyDecided, ApprovalGone, CairnError
from cairn.core.status import RunStatus


@dataclasses.dataclass(frozen=True, kw_only=True)
class Wait:
    """A run parked until a signal of `event` arrives (or `timeout` seconds pass, and then
    it goes on at `on_timeout`). Stored with the checkpoint: no worker holds the run.
    event None: a sleep, which only its timeout ends (StepResult(sleep=...)). request: what
    the wait asks a person (an approval: {"tool", "args", "prompt", ...}), listed across
    runs by Client.approvals() and answered by Client.decide()."""

    event: str | None
    timeout: float | None = None
    on_timeout: str | None = None
    request: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Spawned:
    """The children a save creates (StepResult.spawn, resolved by the loop): each one's
    (run id, workflow, input), how many must stop before the parent goes on, and their
    depth under their first ancestor."""

    children: tuple[tuple[str, str, dict[str, Any]], ...]
    need: int
    depth: int
    traceparent: str | None = None  # the spawning step's span: the children's traces go on


# The journal's name for ctx.messages(): its record, [{"n": .., "message": ..}, ...], is
# which steer messages that read delivered (the SQL's steers_pending reads it by name).
STEERED = "cairn.messages"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Call:
    """One journaled call inside a step (ctx.call, ctx.model): its place in the step's
    visit, its name, and its outcome: the JSON it returned, or the permanent error it
    raised ({"type", "module", "args", "message"}), and the cost it counted."""

    pos: int
    name: str
    result: Any = None
    error: dict[str, Any] | None = None
    cost_usd: float = 0.0
    # The model tokens it used (prompt and output), for the budgets it spends against:
    # settled with its record, not kept in the journal.
    tokens: int = 0


@dataclasses.dataclass(frozen=True)
class Recorded:
    """A journaled call's record, written (or found written by the same writer): and the
    run's cancel reason as the record's own statement read it, so a step learns of a
    cancel with no round trip of its own."""

    cancel_reason: str | None = None
    # The budget scopes whose soft limit this call's cost crossed (each crossed once).
    crossed: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Budget:
    """A budget's ledger (Client.budget): its scope ('run:<id>': that run and all its
    descendants; 'tenant:<name>': that tenant's runs), its hard limits (None: none of that
    kind) and soft fraction, what its journaled calls cost (spent_*) and the worst case of
    its calls in flight (reserved_*), in dollars and in model tokens. A tenant's budget
    counts per period ('day' or 'month', in UTC) from period_start; a tree's has none."""

    scope: str
    limit_usd: float | None
    soft: float | None
    spent_usd: float
    reserved_usd: float
    limit_tokens: int | None = None
    spent_tokens: int = 0
    reserved_tokens: int = 0
    period: str | None = None
    period_start: dt.datetime | None = None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["period_start"] = self.period_start.isoformat() if self.period_start else None
        return out


def budget_scope(run_id: str) -> str:
    """The scope of the budget a run was enqueued with: it and all its descendants."""
    return f"run:{run_id}"


def tenant_scope(tenant: str) -> str:
    """The scope of a tenant's budget (Client.set_tenant_budget): every run of the tenant."""
    return f"tenant:{tenant}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One step attempt that ended, as `Client.history` returns it: where it ran (seq,
    cursor, visit), how it ended (outcome: saved, retry, or how it stopped the run), when
    and on which worker at which lease epoch, what it cost, its effect key, its error, and
    where a saved step went on (next_cursor), and the code version (CAIRN_CODE_VERSION) of
    the worker that recorded it (None: a fork's or a rewind's mark, or before versions)."""

    seq: int
    cursor: str
    visit: int
    outcome: str
    started_at: dt.datetime
    ended_at: dt.datetime
    worker: str | None = None
    epoch: int = 0
    cost_usd: float = 0.0
    effect_key: str | None = None
    error: str | None = None
    next_cursor: str | None = None
    code_version: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StepRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in names})

    @property
    def seconds(self) -> float:
        return (self.ended_at - self.started_at).total_seconds()

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["started_at"], out["ended_at"] = self.started_at.isoformat(), self.ended_at.isoformat()
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class CallRecord:
    """One journaled call, as `Client.calls` returns it: the step visit it belongs to
    (cursor, visit), its place and name, its outcome (result, or the permanent error it
    raised: {"type", "module", "args", "message"}), its cost and when it was recorded."""

    cursor: str
    visit: int
    pos: int
    name: str
    result: Any = None
    error: dict[str, Any] | None = None
    cost_usd: float = 0.0
    created_at: dt.datetime | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CallRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in names})

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["created_at"] = self.created_at.isoformat() if self.created_at else None
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    """One run as `Client.get` and `Client.list` return it.

    status: a cairn.RunStatus (pending, running, waiting for a signal, done, failed,
    cancelled, budget_exceeded or incompatible). cursor: the step that comes next ("" before the first
    step has been resolved by a worker). state: the result once done. window:
    the model window, only when asked for (it can be large).
    """

    run_id: str
    workflow: str
    status: RunStatus
    cursor: str
    seq: int
    cost_usd: float
    resumes: int
    error: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    input: Mapping[str, Any] | None = None
    state: Mapping[str, Any] | None = None
    window: tuple[dict[str, Any], ...] | None = None
    parent_id: str | None = None  # a child run's parent (StepResult.spawn)
    concurrency_key: str | None = None  # at most its key's limit of such runs at a time
    priority: int = 0  # higher starts first (its key's queue, and the broker's)
    traceparent: str | None = None  # W3C trace context of the span that enqueued it
    forked_from: str | None = None  # a fork (Client.fork): the run it was forked from,
    forked_at: int | None = None  # and the seq
    # A waiting run's wake time (its sleep's end, its wait's timeout), by Client.get.
    wakes_at: dt.datetime | None = None
    # The code version (CAIRN_CODE_VERSION) of the worker that started it (None: no worker
    # has yet, or one before versions were recorded).
    started_version: str | None = None
    # The customer it is for (Client(tenant=), or the API token that enqueued it; None:
    # none). A child run and a fork keep their origin's.
    tenant: str | None = None
    # Who asked it to stop, by Client.get: "token <id>" (a `cairn tokens` token), "admin",
    # the name a Client gave (None: nobody did, or its parent's cancel stopped it).
    cancelled_by: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Run:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in row.items() if k in names}
        values["status"] = RunStatus(values["status"])
        if values.get("window") is not None:
            values["window"] = tuple(values["window"])
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (timestamps as ISO 8601)."""
        out = dataclasses.asdict(self)
        out["status"] = str(self.status)
        for key in ("created_at", "updated_at"):
            out[key] = out[key].isoformat()
        if out["window"] is None:
            del out["window"]
        if self.wakes_at is None:
            del out["wakes_at"]
        else:
            out["wakes_at"] = self.wakes_at.isoformat()
        if self.cancelled_by is None:
            del out["cancelled_by"]
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunFilter:
    """Which runs a list shows (Client.list, every store's list_runs): newest first,
    filtered by status, workflow, tenant and creation time [since, until), `limit` at a time;
    `after`: the last run id of the previous page (keyset paging)."""

    status: RunStatus | None = None
    limit: int = 50
    workflow: str | None = None
    after: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    tenant: str | None = None  # that tenant's runs only (None: every run)


@dataclasses.dataclass(frozen=True)
class StreamInfo:
    """A run's live event stream: its oldest and newest ids, and whether older entries
    were trimmed away (MAXLEN)."""

    first: str
    last: str
    trimmed: bool
    origin: bool = False  # its first entry is the run's first event (is_origin)


# Bump when the persisted shape changes; a checkpoint of another version is refused.
CHECKPOINT_VERSION = 1

# The cursor of a run that no worker has started: the workflow's first step, resolved by
# the worker, so an enqueuer needs only the workflow's name, not its code.
START = ""


class Message(TypedDict, total=False):
    """One Anthropic MessageParam, stored as given."""

    role: str
    content: Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """The smallest thing from which a run can continue."""

    run_id: str
    workflow: str
    input: dict[str, Any]
    seq: int  # bumps on every save; the guard compares it
    cursor: str  # the step that comes next; "done" ends
    state: dict[str, Any]  # accumulated results
    visits: dict[str, int]  # saved visits per cursor: half of the idempotency key
    window: tuple[Message, ...]  # exactly what the model saw
    win_start: int  # index of window[0] in window_messages
    cost_usd: float
    version: int = CHECKPOINT_VERSION
    status: RunStatus = RunStatus.PENDING
    error: str | None = None
    epoch: int = 0  # fencing epoch of the lease that wrote it
    resumes: int = 0
    updated_at: dt.datetime | None = None
    attempts: int = 0  # failed attempts of the step at cursor (a save resets it)
    deliveries: int = 0  # claims since the last save (poison detection)
    cancel_reason: str | None = None
    max_cost_usd: float | None = None  # this run's cost cap (None: the workers' default)
    # status waiting: the event awaited, and the cursor to take if the timeout comes first
    wait_event: str | None = None
    wait_timeout_cursor: str | None = None
    flow_version: int | None = None  # the workflow version that wrote the state
    parent_id: str | None = None  # a child run's parent (StepResult.spawn), never changed
    depth: int = 0  # children between it and its first ancestor
    concurrency_key: str | None = None  # holds one of its key's slots while it runs
    priority: int = 0
    traceparent: str | None = None  # the enqueuer's span (cairn.otel): deliveries go on its trace
    forked_at: int | None = None  # a fork's first seq (its origin's), never changed
    tenant: str | None = None  # the customer it is for: its model calls count in its limits
    # A pinned run (versions="pin"): the code version it goes on under, its start's; None
    # for a run any version takes. Set by its first claim, never by a save.
    pinned_to: str | None = None
    # The budget scopes it spends against (runs.budgets: 'run:<id>', its tree's), never changed
    budgets: list[str] | None = None
    # Read with the row, never written: the wait's timeout has passed; the oldest signal
    # of the awaited event not yet consumed ({"id", "payload"}).
    wait_over: bool = dataclasses.field(default=False, compare=False)
    signal: dict[str, Any] | None = dataclasses.field(default=None, compare=False)
    # Not stored: the window's compact-JSON size, carried from step to step so the size
    # check costs the new messages, not the whole window. -1: not known yet.
    window_bytes: int = dataclasses.field(default=-1, compare=False, repr=False)

    @property
    def win_end(self) -> int:
        return self.win_start + len(self.window)

    def evolve(self, **changes: Any) -> Checkpoint:
        """dataclasses.replace, for the loop's once-a-step copy: replace re-runs __init__
        over all 28 fields (twice the time); this copies the fields and sets the changed
        ones. Checkpoint has no __post_init__ to skip, and a misspelt field still fails."""
        if not changes.keys() <= _FIELDS:
            raise TypeError(f"Checkpoint has no field {sorted(changes.keys() - _FIELDS)}")
        new = object.__new__(Checkpoint)
        new.__dict__.update(self.__dict__, **changes)
        return new


_FIELDS = frozenset(f.name for f in dataclasses.fields(Checkpoint))


class Saved(NamedTuple):
    """What a save learned: a cancel asked for, a signal already there for a new wait."""

    cancel_reason: str | None
    signalled: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Attempt:
    """One step attempt as the step history records it."""

    started: float  # time.time() when the step began
    worker: str = ""  # the lease owner (host:pid:nonce)
    effect_key: str | None = None
    signal_id: str | None = None  # the signal the step received (consumed by the save)
    code_version: str | None = None  # the worker's (CAIRN_CODE_VERSION)


DECISIONS = ("approve", "deny", "edit")


def decision_in(payload: Any) -> tuple[str, dict[str, Any] | None] | None:
    """A signal's payload as Client.decide sends it: (approve | deny | edit, an edit's
    args); None for any other payload (the integrations take their own shapes too)."""
    if not isinstance(payload, dict) or "approval_id" not in payload:
        return None
    decision, args = payload.get("decision"), payload.get("args")
    if decision not in DECISIONS:
        return None
    return decision, args if isinstance(args, dict) else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decision:
    """An approval's decision, as its audit row keeps it: approve, deny or edit (approve
    with edited arguments); the signal's payload sent to the run; who decided (decided_by:
    "token <id>", "admin", the name a Client or the CLI gave, or "rule N" for a standing
    rule, then rule_id); the API token it was decided with (decided_token: None for the
    server's own token, a Client or the CLI) and the tenant it acted for (decided_tenant:
    None for an admin); when."""

    decision: str
    payload: Mapping[str, Any]
    decided_by: str
    decided_at: dt.datetime
    rule_id: int | None = None
    decided_token: str | None = None
    decided_tenant: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Approval:
    """A run waiting on a person (StepResult.wait with request=): what it asks (request:
    {"tool", "args", "prompt", ...}), the event its decision is sent as, and, once
    decided, the decision. waiting: undecided, its run parked on it (False: decided, or
    the run timed out, was cancelled)."""

    approval_id: int
    run_id: str
    workflow: str
    event: str
    tool: str | None
    request: Mapping[str, Any]
    created_at: dt.datetime
    waiting: bool = True
    decision: Decision | None = None

    def refusal(self) -> CairnError:
        """Why a decision on it is refused (both stores say it so): decided already, or
        its run no longer waits on it."""
        if self.decision is not None:
            d = self.decision
            return AlreadyDecided(
                f"approval {self.approval_id} was decided already: {d.decision} by "
                f"{d.decided_by} at {d.decided_at:%Y-%m-%d %H:%M:%S} UTC"
            )
        return ApprovalGone(
            f"run {self.run_id} no longer waits on approval {self.approval_id} (its wait "
            "timed out, or the run was cancelled or went on)"
        )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Approval:
        decision = None
        if row.get("decision") is not None:
            decision = Decision(
                decision=row["decision"],
                payload=row["payload"],
                decided_by=row["decided_by"],
                decided_at=row["decided_at"],
                rule_id=row["rule_id"],
                decided_token=row.get("decided_token"),
                decided_tenant=row.get("decided_tenant"),
            )
        return cls(
            approval_id=int(row["approval_id"]),
            run_id=row["run_id"],
            workflow=row["workflow"],
            event=row["event"],
            tool=row["tool"],
            request=row["request"],
            created_at=row["created_at"],
            waiting=bool(row.get("waiting", True)),
            decision=decision,
        )

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["created_at"] = self.created_at.isoformat()
        if self.decision is not None:
            out["decision"]["decided_at"] = self.decision.decided_at.isoformat()
        return out


@dataclasses.dataclass(frozen=True)
class ApprovalFilter:
    """Which approvals a list shows (Client.approvals): those still waiting, of a workflow
    and a wait's event name, `limit` at a time, newest first (or oldest); `after`: the
    last approval id of the previous page (keyset paging)."""

    workflow: str | None = None
    name: str | None = None
    limit: int = 50
    after: int | None = None
    oldest_first: bool = False
    tenant: str | None = None  # that tenant's runs' only (None: every run's)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rule:
    """A standing rule: a request of this workflow for this tool is approved as its run
    saves the wait, nobody asked (the audit row names the rule)."""

    rule_id: int
    workflow: str
    tool: str
    created_by: str
    created_at: dt.datetime

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "created_at": self.created_at.isoformat()}
