"""MemoryStore's rows, as the tables of store/sql/schema.sql keep them (JSON columns as
text), and the helpers that write and read them, shared by every audience's operations."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any, cast

from cairn.core.errors import StoreError
from cairn.core.records import Call
from cairn.core.status import RunStatus


def _dump(value: Any) -> str:
    # Stored as JSON text, as jsonb stores it: a caller's later edit of a dict it saved
    # (or read) cannot reach the stored copy, and what JSON cannot hold fails here too.
    return json.dumps(value)


def _status(value: str) -> RunStatus:
    try:
        return RunStatus(value)
    except ValueError:  # the CHECK constraint's refusal
        raise StoreError(f"refused: {value!r} is not a run status") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Signal:
    event: str
    payload: str  # JSON
    created_at: dt.datetime
    consumed_seq: int | None = None
    traceparent: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Snap:
    """What a step_history row keeps of the checkpoint its step saved (the snapshot
    fragment's columns): where a fork or a rewind goes on from."""

    visits: str  # JSON
    win_start: int
    win_end: int
    total_cost: float
    flow_version: int | None
    state: str | None  # JSON; None: unchanged by the step (an older row has it)


@dataclasses.dataclass(kw_only=True)
class _Row:
    """One run: its `runs` row and its `checkpoints` row (one each per run), and the rows
    of the tables keyed by run that the sweep deletes with it. JSON columns hold text."""

    run_id: str
    workflow: str
    input: str
    max_cost_usd: float | None
    created_at: dt.datetime
    cursor: str
    state: str
    version: int
    updated_at: dt.datetime
    seq: int = 0
    visits: str = "{}"
    win_start: int = 0
    win_end: int = 0
    cost_usd: float = 0.0
    status: RunStatus = RunStatus.PENDING
    error: str | None = None
    epoch: int = 0
    resumes: int = 0
    attempts: int = 0
    deliveries: int = 0
    retry_at: dt.datetime | None = None
    cancel_reason: str | None = None
    cancelled_by: str | None = None  # who asked, with the first cancel's reason
    wait_event: str | None = None
    wait_until: dt.datetime | None = None
    wait_timeout_cursor: str | None = None
    # a debounced run: the enqueues of this workflow and key collapse into it until it starts
    debounce: tuple[str, str] | None = None
    flow_version: int | None = None
    parent_id: str | None = None  # a child run: its parent, the parent's spawn, its depth
    parent_seq: int | None = None
    depth: int = 0
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    priority: int = 0
    traceparent: str | None = None
    forked_from: str | None = None  # a fork: its origin, and the seq it was forked at
    forked_at: int | None = None
    tenant: str | None = None  # the customer it is for; a child's and a fork's origin's
    budgets: list[str] | None = None  # the budget scopes it spends against
    started_version: str | None = None  # the code version of its first claim's worker
    pinned: bool = False  # goes on only under started_version (versions="pin")
    window: dict[int, str] = dataclasses.field(default_factory=dict)  # window_messages
    signals: dict[str, _Signal] = dataclasses.field(default_factory=dict)
    # step_history: each row as the history query selects it, and the checkpoint it saved
    # (a fork's or a rewind's snapshot; None for an attempt that saved nothing)
    history: list[tuple[dict[str, Any], _Snap | None]] = dataclasses.field(default_factory=list)
    # journal: (cursor, visit, pos) -> (the call with its result and error as JSON text, epoch)
    journal: dict[tuple[str, int, int], tuple[Call, int]] = dataclasses.field(default_factory=dict)
    # steer messages, the n-th at index n - 1 (as JSON text)
    steers: list[str] = dataclasses.field(default_factory=list)


def _signal_of(signal_id: str, signal: _Signal) -> dict[str, Any]:
    """The checkpoint's signal as the SQL builds it (traceparent only when stored)."""
    out = {"id": signal_id, "payload": json.loads(signal.payload)}
    if signal.traceparent is not None:
        out["traceparent"] = signal.traceparent
    return out


def _loaded(call: Call) -> Call:
    """A journaled call as read back: its result and error parsed from their JSON text."""
    return dataclasses.replace(
        call,
        result=json.loads(call.result) if call.result is not None else None,
        error=json.loads(cast(str, call.error)) if call.error is not None else None,
    )


def _unconsumed(row: _Row, event: str | None) -> list[tuple[str, _Signal]]:
    """The run's signals of event not consumed yet, oldest first (created_at, then id)."""
    found = [
        (sid, s) for sid, s in row.signals.items() if s.consumed_seq is None and s.event == event
    ]
    return sorted(found, key=lambda found: (found[1].created_at, found[0]))
