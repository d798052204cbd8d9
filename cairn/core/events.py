"""Run events as values: what a step and cairn emit while a run goes on, and their JSON
in a run's stream. Every layer may read these: the worker's outbox writes them
(cairn.workers.outbox), the clients read them (cairn.client.events), the server passes
them on (cairn.web.hub); the stream itself is cairn.store.events.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from typing import Any

from cairn.core import sealing
from cairn.core.errors import EventRefused

KIND = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
# cairn's own kinds: a step's ctx.emit may not use them.
RESERVED = frozenset(
    {
        "step_started",  # a delivery's first step attempt began (then step_saved's "next")
        "token",  # a text delta of a streamed model call: {call, text}
        "model_restart",  # a streamed call was retried: drop its tokens so far ({call})
        "message",  # a model call's whole answer, once journaled: {call, text, tool_calls}
        "call",  # a journaled ctx.call's outcome: {call, name, result | error}
        "budget_soft",  # a call's cost crossed a budget's soft limit: {scope, spent_usd, ...}
        "step_saved",  # the attempt's checkpoint committed: its events stand
        "retry",  # the attempt failed and will be retried: drop its events
        "attempt_abandoned",  # an attempt was cut (a killed worker): drop its events
        "wait",  # the run waits for a signal or a timeout, holding no worker
        "resumed",  # the run goes on after a wait, or after a lost worker
        "run_ended",  # the run stopped: {status, error, cost_usd}; the last event
        "dropped",  # events of the run were lost before Redis: {reason, count}
        "gap",  # the stream could not give everything asked for; the durable record follows
    }
)
# Written after a fenced Postgres write succeeded: they need no fence of their own.
_AFTER_COMMIT = frozenset(
    {
        "message",
        "call",
        "budget_soft",
        "step_saved",
        "retry",
        "wait",
        "resumed",
        "run_ended",
        "dropped",
    }
)
# An attempt's last event is one of these when it ended on purpose: after any other, the
# next attempt's worker marks it abandoned.
ENDS_ATTEMPT = frozenset(
    {"step_saved", "retry", "run_ended", "wait", "attempt_abandoned", "resumed", "dropped"}
)
BEFORE_ALL = "0-0"  # a stream position before every entry: a run's start
_KIND_AT = '{"kind":"'
# One encoder, made once: json.dumps with options builds a new one every call (half the cost).
_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


@dataclasses.dataclass(frozen=True)
class Event:
    """One run event. id: monotonic in the run (the SSE id; pass it back as `after`).
    cursor, visit, attempt: the step attempt that emitted it (attempt is the attempt's
    lease epoch: a later attempt of the same step visit has a larger one). durable:
    rebuilt from Postgres after a gap, not read from the live stream."""

    id: str
    kind: str
    data: Any = None
    cursor: str | None = None
    visit: int | None = None
    attempt: int | None = None
    seq: int | None = None
    ts: float = 0.0
    durable: bool = False
    # The JSON the stream holds, when read from it: a server can pass it on as it is.
    raw: str | None = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def parse(cls, entry_id: str, blob: str) -> Event:
        # A sealed event's data opened (CAIRN_PAYLOAD_KEYS); it is passed on re-encoded
        # (json()), never as the sealed text.
        sealed = sealing.is_sealed(blob)
        e = sealing.open_text(blob) if sealed else json.loads(blob)
        return cls(
            entry_id,
            e["kind"],
            e.get("data"),
            e.get("cursor"),
            e.get("visit"),
            e.get("attempt"),
            e.get("seq"),
            e.get("ts", 0.0),
            raw=None if sealed else blob,
        )

    @classmethod
    def unparsed(cls, entry_id: str, blob: str) -> Event:
        """Its id, kind and raw JSON only: what a server needs to pass it on."""
        if blob.startswith(_KIND_AT) and not sealing.is_sealed(blob):  # kind first
            end = blob.find('"', len(_KIND_AT))
            return cls(entry_id, blob[len(_KIND_AT) : end], raw=blob)
        return cls.parse(entry_id, blob)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "data": self.data,
            "cursor": self.cursor,
            "visit": self.visit,
            "attempt": self.attempt,
            "seq": self.seq,
            "ts": self.ts,
            "durable": self.durable,
        }

    def json(self) -> str:
        """to_json() as JSON text: from the stream's own when there is one (no re-encode)."""
        if self.raw is not None and self.raw.startswith("{"):
            return f'{{"id":"{self.id}","durable":false,{self.raw[1:]}'
        return _JSON.encode(self.to_json())


def encode(
    kind: str,
    data: Any,
    *,
    cursor: str | None = None,
    visit: int | None = None,
    attempt: int | None = None,
    seq: int | None = None,
    ts: float | None = None,
    origin: bool = False,
) -> str:
    """An event as the stream keeps it, with its emit flag (see emit.lua). origin: the
    first event of a delivery of a run that has saved nothing yet; a stream whose first
    entry is one holds the run from its beginning (store.events.is_origin)."""
    event = {
        "kind": kind,
        "data": sealing.dump(data) if data is not None else None,
        "cursor": cursor,
        "visit": visit,
        "attempt": attempt,
        "seq": seq,
        "ts": time.time() if ts is None else ts,
    }
    if origin:
        event["origin"] = True  # last: is_origin looks at the end of the text
    flag = "s" if kind in _AFTER_COMMIT else "g" if kind in RESERVED and kind != "token" else "f"
    return flag + _JSON.encode(event)


def check(kind: str, data: Any, max_bytes: int) -> str:
    """A ctx.emit's data as JSON, or EventRefused saying why not."""
    if not isinstance(kind, str) or not KIND.fullmatch(kind):
        raise EventRefused(f"event kind {kind!r}: use lower-case letters, digits, _ . - (max 64)")
    if kind in RESERVED:
        raise EventRefused(f"event kind {kind!r} is cairn's own; pick another name")
    try:
        raw = _JSON.encode(data)
    except (TypeError, ValueError) as exc:
        raise EventRefused(f"event {kind!r}: data is not JSON ({exc})") from exc
    if len(raw) > max_bytes:
        raise EventRefused(
            f"event {kind!r} is {len(raw):,} bytes, over CAIRN_MAX_EVENT_BYTES={max_bytes:,}: "
            "emit a smaller event (a reference to the data, not the data)"
        )
    return raw


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id ("<ms>-<n>") as a tuple that sorts as the stream does."""
    ms, _, n = entry_id.partition("-")
    return int(ms), int(n or 0)


def message_data(message: dict[str, Any]) -> dict[str, Any]:
    """A journaled model answer's text and tool calls (what a chat UI shows), whichever API
    gave it: an Anthropic Message, an OpenAI ChatCompletion (its first choice) or Response."""
    if message.get("object") == "chat.completion":
        choices = message.get("choices") or [{}]
        said = choices[0].get("message") or {}
        return {
            "text": said.get("content") or "",
            "tool_calls": [
                {"id": c.get("id"), "name": f.get("name"), "input": _arguments(f)}
                for c in said.get("tool_calls") or []
                for f in [c.get("function") or {}]
            ],
        }
    if message.get("object") == "response":
        output = message.get("output") or []
        return {
            "text": "".join(
                part.get("text", "")
                for item in output
                if item.get("type") == "message"
                for part in item.get("content") or []
                if part.get("type") == "output_text"
            ),
            "tool_calls": [
                {"id": i.get("call_id"), "name": i.get("name"), "input": _arguments(i)}
                for i in output
                if i.get("type") == "function_call"
            ],
        }
    content = message.get("content") or []
    return {
        "text": "".join(b.get("text", "") for b in content if b.get("type") == "text"),
        "tool_calls": [
            {"id": b.get("id"), "name": b.get("name"), "input": b.get("input")}
            for b in content
            if b.get("type") == "tool_use"
        ],
    }


def _arguments(call: dict[str, Any]) -> Any:
    """An OpenAI tool call's arguments (a JSON string) as the value they spell, as
    Anthropic's tool_use gives its input; as sent when they are not JSON."""
    raw = call.get("arguments")
    try:
        return json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return raw
