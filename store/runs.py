"""What a caller reads of a run: its position, result and error, without the window."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from cairn.status import RunStatus


@dataclasses.dataclass(frozen=True, kw_only=True)
class Wait:
    """A run parked until a signal of `event` arrives (or `timeout` seconds pass, and then
    it goes on at `on_timeout`). Stored with the checkpoint: no worker holds the run."""

    event: str
    timeout: float | None = None
    on_timeout: str | None = None


@dataclasses.dataclass(frozen=True)
class Spawned:
    """The children a save creates (StepResult.spawn, resolved by the loop): each one's
    (run id, workflow, input), how many must stop before the parent goes on, and their
    depth under their first ancestor."""

    children: tuple[tuple[str, str, dict[str, Any]], ...]
    need: int
    depth: int
    traceparent: str | None = None  # the spawning step's span: the children's traces go on


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
        return out


@dataclasses.dataclass(frozen=True)
class StreamInfo:
    """A run's live event stream: its oldest and newest ids, and whether older entries
    were trimmed away (MAXLEN)."""

    first: str
    last: str
    trimmed: bool
    origin: bool = False  # its first entry is the run's first event (is_origin)
