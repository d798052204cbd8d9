"""The Anthropic Messages API as ModelServer speaks it (``POST /v1/messages``): enough for
the real ``anthropic`` SDK (``anthropic.Anthropic(api_key="local", base_url=server.url)``)
to work, with deterministic replies (cairn.testing.standins.replies), streaming, the
server's rate limit and injected failures (cairn.testing.standins.model).

Answers
-------
A ``message`` whose content is one text block (the reply), or one ``tool_use`` block when
the first user message's ``TOOLS:`` line says so (stop_reason ``tool_use``, id
``toolu_local_<turn>``).  Usage: ``input_tokens`` a quarter of the characters of the
system prompt and messages as JSON, ``output_tokens`` a quarter of the reply's; a
``CACHED: n`` line moves n of the input to ``cache_read_input_tokens`` (the API counts
cache reads apart from ``input_tokens``).  Every answer carries ``request-id``.

Streaming (``"stream": true``, i.e. ``client.messages.stream(...)``)
-------------------------------------------------------------------
Answered as the API does: ``text/event-stream`` with ``message_start`` (empty content,
the input usage), a ``ping``, then per content block ``content_block_start``, its deltas
and ``content_block_stop``, then ``message_delta`` (stop_reason, output usage) and
``message_stop``.  Text goes out as word-sized ``text_delta`` tokens, whitespace leading
(``"Hello"``, ``" world"``); a tool_use block as ``input_json_delta`` pieces of its
input's JSON.  The message the SDK assembles equals the non-streaming answer to the same
body but for its id.  The body is chunked (the connection stays reusable) and each event
is flushed as written.  Failure injection and ``delay_ms`` act before the first event,
so an injected failure is the same JSON error answer as for ``create``.

* ``cut_after=k`` breaks off the next streamed answer after its first k deltas
  (message_start always goes out): the connection is dropped without the closing chunk,
  which the SDK's reader raises as ``httpx2.RemoteProtocolError`` (2.16) or
  ``anthropic.APIConnectionError`` (2.17).  With ``cut_status=529`` (or another
  injectable status) the answer instead ends with an ``error`` event of that status's
  type, as the API reports overload mid-answer; the SDK raises it as a plain
  ``anthropic.APIStatusError`` with ``status_code == 200`` and ``type == "overloaded_error"``.

Rate limit
----------
With ``rpm`` set every answer carries ``anthropic-ratelimit-requests-limit``,
``-remaining`` and ``-reset`` (RFC 3339, when the bucket is full again), and with ``tpm``
the same three for ``-tokens-``; a refused request is answered 429 with the API's
``rate_limit_error`` body and ``retry-after`` (whole seconds until it would pass).

How the real SDK (anthropic 2.16, 2.17) reacts to the injected failures
----------------------------------------------------------------------
Checked against ``anthropic/_error_classes.py`` and ``tests/unit/test_standins.py``:

* 429 -> ``anthropic.RateLimitError`` (``APIStatusError`` subclass, *not* a server error).
* 529 -> ``anthropic.OverloadedError``, a subclass of ``anthropic.InternalServerError``.
* 500 -> ``anthropic.InternalServerError`` (the fallback for any 5xx without its own class;
  503 -> ``ServiceUnavailableError``, also an ``InternalServerError`` subclass).
* 400 -> ``anthropic.BadRequestError``.
* Nothing listening -> ``anthropic.APIConnectionError``; timeout -> ``anthropic.APITimeoutError``
  (subclass of ``APIConnectionError``).

All status errors are ``anthropic.APIStatusError`` with ``exc.status_code``,
``exc.request_id`` (our ``request-id`` header), ``exc.type`` (``error.type`` from the body,
e.g. ``"rate_limit_error"``) and ``exc.response``.  Read retry-after with
``exc.response.headers.get("retry-after")`` (a string, here ``"0"``).  Note that
``exc.response`` is an ``httpx2.Response`` -- the SDK vendors its own ``httpx2`` package --
so don't ``isinstance``-check it against ``httpx.Response``.

Retry behaviour: the SDK retries 408/409/429/5xx itself (``max_retries`` default 2, backoff
0.5 s doubling to 8 s with jitter; a ``retry-after`` <= 0 is ignored in favour of that
backoff).  cairn does its own retrying, so build clients with ``max_retries=0`` in tests.
"""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

from cairn.testing.standins.api import _Api, _Event, _Limit, _Problem, _prompt_chars, _sse
from cairn.testing.standins.replies import _next_tool_call, _tokens, _usage, reply_for

# Anthropic's documented error types, keyed by HTTP status.
_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def _anthropic_error(status: int, message: str) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": message},
    }


def _text_of(content: Any) -> str:
    """Text of a message's content: a string, or the text blocks of a block list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            b["text"]
            for b in content
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        )
    return ""


def _first_user_text(data: dict[str, Any]) -> str:
    """Text of the first user message: where a test's directives (TOOLS:, TOKEN_MS:) go."""
    first = next((m for m in data["messages"] if m.get("role") == "user"), None)
    return _text_of(first["content"]) if first else ""


def _next_tool_use(data: dict[str, Any]) -> dict[str, Any] | None:
    """The tool_use block to answer with (replies._next_tool_call); turns done = assistant
    messages with a tool_use block."""
    schemas: dict[str, dict[str, Any]] = {
        t["name"]: t.get("input_schema") or {}
        for t in data.get("tools") or []
        if isinstance(t, dict) and isinstance(t.get("name"), str)
    }
    done = sum(
        1
        for msg in data["messages"]
        if msg.get("role") == "assistant"
        and isinstance(msg.get("content"), list)
        and any(isinstance(b, dict) and b.get("type") == "tool_use" for b in msg["content"])
    )
    call = _next_tool_call(_first_user_text(data), schemas, done)
    if call is None:
        return None
    name, args = call
    return {"type": "tool_use", "id": f"toolu_local_{done}", "name": name, "input": args}


def _rfc3339(seconds_from_now: float) -> str:
    when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds_from_now)
    return when.isoformat().replace("+00:00", "Z")


class MessagesApi(_Api):
    """``POST /v1/messages`` (see the module docstring)."""

    name = "messages"
    path = "/v1/messages"
    request_id_header = "request-id"

    def error(self, status: int, message: str, *, param: str | None = None) -> dict[str, Any]:
        return _anthropic_error(status, message)

    def limit_headers(self, limit: _Limit) -> dict[str, str]:
        headers: dict[str, str] = {}
        for kind, per_minute, left, full_s in limit.buckets():
            headers[f"anthropic-ratelimit-{kind}-limit"] = str(per_minute)
            headers[f"anthropic-ratelimit-{kind}-remaining"] = str(int(left))
            headers[f"anthropic-ratelimit-{kind}-reset"] = _rfc3339(full_s)
        return headers

    def rate_limited(self, limit: _Limit) -> tuple[dict[str, Any], dict[str, str]]:
        if limit.refused == "tokens":
            why = f"This request would exceed the rate limit of {limit.tokens} tokens per minute."
        else:
            why = (
                f"This request would exceed the rate limit of {limit.requests} requests per minute."
            )
        return _anthropic_error(429, why), {"retry-after": str(math.ceil(limit.retry_after_s))}

    def check(self, data: dict[str, Any] | None) -> _Problem | None:
        if data is None:
            return None, "request body must be a JSON object"
        model = data.get("model")
        if not isinstance(model, str) or not model:
            return "model", "model: field required"
        max_tokens = data.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            return "max_tokens", "max_tokens: must be a positive integer"
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            return "messages", "messages: must be a non-empty list"
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
                return "messages", f"messages.{i}.role: must be 'user' or 'assistant'"
            if not isinstance(msg.get("content"), (str, list)):
                return "messages", f"messages.{i}.content: must be a string or a list of blocks"
        if not isinstance(data.get("stream", False), bool):
            return "stream", "stream: must be a boolean"
        return None

    def directives(self, data: dict[str, Any]) -> str:
        return _first_user_text(data)

    def prompt_tokens(self, data: dict[str, Any]) -> int:
        return max(
            1, _prompt_chars({"system": data.get("system"), "messages": data.get("messages")}) // 4
        )

    def answer(self, data: dict[str, Any], no: int) -> dict[str, Any]:
        tool_use = _next_tool_use(data)
        last_user = next((m for m in reversed(data["messages"]) if m.get("role") == "user"), None)
        reply = reply_for(_text_of(last_user["content"]) if last_user else "")
        prompt = json.dumps({"system": data.get("system"), "messages": data["messages"]})
        usage = _usage(prompt, reply, _first_user_text(data))
        return {
            "id": f"msg_local_{no}",
            "type": "message",
            "role": "assistant",
            "model": data["model"],
            "content": [tool_use] if tool_use else [{"type": "text", "text": reply}],
            "stop_reason": "tool_use" if tool_use else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": usage.input - usage.cached,
                "output_tokens": usage.output,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": usage.cached,
            },
        }

    def events(self, answer: dict[str, Any], data: dict[str, Any]) -> list[_Event]:
        usage = answer["usage"]
        # The API reports the input usage at the start, the output usage in message_delta.
        start = {
            **answer,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**usage, "output_tokens": 1},
        }
        events = [
            _Event(
                _sse({"type": "message_start", "message": start}, "message_start"), opening=True
            ),
            _Event(_sse({"type": "ping"}, "ping")),
        ]
        for index, block in enumerate(answer["content"]):
            if block["type"] == "tool_use":
                opened = {**block, "input": {}}
                # The API opens a tool's input with an empty piece too.
                pieces = ["", *_tokens(json.dumps(block["input"]))]
                deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces]
            else:
                opened = {**block, "text": ""}
                deltas = [{"type": "text_delta", "text": t} for t in _tokens(block["text"])]
            start_block = {"type": "content_block_start", "index": index, "content_block": opened}
            events.append(_Event(_sse(start_block, "content_block_start")))
            events += [
                _Event(
                    _sse(
                        {"type": "content_block_delta", "index": index, "delta": d},
                        "content_block_delta",
                    ),
                    delta=True,
                    text=d["type"] == "text_delta",
                )
                for d in deltas
            ]
            stop_block = {"type": "content_block_stop", "index": index}
            events.append(_Event(_sse(stop_block, "content_block_stop")))
        stop = {"stop_reason": answer["stop_reason"], "stop_sequence": answer["stop_sequence"]}
        message_delta = {"type": "message_delta", "delta": stop, "usage": usage}
        events.append(_Event(_sse(message_delta, "message_delta")))
        events.append(_Event(_sse({"type": "message_stop"}, "message_stop"), closing=True))
        return events

    def cut_event(self, status: int, message: str, at: int) -> bytes:
        return _sse(_anthropic_error(status, message), "error")
