"""ModelServer: enough of the Anthropic Messages API for the real ``anthropic`` SDK
(``anthropic.Anthropic(api_key="local", base_url=server.url)``) to work, with deterministic
replies (cairn.testing.standins.replies), streaming, a rate limit and injectable
429/529/500 failures.

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

Rate limit
----------
``rpm=R`` (``--rpm R``) limits requests as the API does, with a bucket of ``burst``
requests (default R: a minute's) refilled at R a minute. Every answer then carries
``anthropic-ratelimit-requests-limit``, ``-remaining`` and ``-reset`` (RFC 3339, when the
bucket is full again); a request that finds it empty is answered 429 with the API's
``rate_limit_error`` body and ``retry-after`` (whole seconds until one request is back),
and counted in ``stats()["rate_limited"]``, so a test can assert a fleet sent it none.

* ``token_ms`` (``--token-ms``, :meth:`ModelServer.control`, ``POST /_control``) sleeps
  between text deltas, so a browser can be seen receiving tokens; a ``TOKEN_MS: n`` line
  in the first user message overrides it for that request.
* ``control(cut_after=k)`` breaks off the next streamed answer after its first k deltas
  (message_start always goes out): the connection is dropped without the closing chunk,
  which the SDK's reader raises as ``httpx2.RemoteProtocolError``.  With
  ``cut_status=529`` (or another injectable status) the answer instead ends with an
  ``error`` event of that status's type, as the API reports overload mid-answer; the SDK
  raises it as a plain ``anthropic.APIStatusError`` with ``status_code == 200`` and
  ``type == "overloaded_error"``.

How the real SDK (anthropic 2.16) reacts to the injected failures
-----------------------------------------------------------------
Checked against ``anthropic/_error_classes.py`` and ``tests/test_standins.py``:

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
``exc.response`` is an ``httpx2.Response`` -- SDK 2.16 vendors its own ``httpx2`` package --
so don't ``isinstance``-check it against ``httpx.Response``.

Retry behaviour: the SDK retries 408/409/429/5xx itself (``max_retries`` default 2, backoff
0.5 s doubling to 8 s with jitter; a ``retry-after`` <= 0 is ignored in favour of that
backoff).  cairn does its own retrying, so build clients with ``max_retries=0`` in tests.
"""

from __future__ import annotations

import datetime
import json
import math
import time
from collections.abc import Iterator
from typing import Any

from cairn.testing.standins.replies import _TOKEN_MS_LINE, _TOOLS_LINE, _tokens, reply_for
from cairn.testing.standins.server import _Cut, _EventStream, _parse_json_object, _StandIn

# Anthropic's documented error types, keyed by HTTP status.
_ANTHROPIC_ERROR_TYPES: dict[int, str] = {
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
        "error": {"type": _ANTHROPIC_ERROR_TYPES.get(status, "api_error"), "message": message},
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
    """The tool_use block to answer with, for an agent loop without a real model: the
    first user message's ``TOOLS: a, b, c`` line lists the tools to call, one a turn, in
    order (turns done = assistant messages with a tool_use block); then text again. The
    input fills each required property of the tool's schema from its name and the turn."""
    m = _TOOLS_LINE.search(_first_user_text(data))
    if m is None or not data.get("tools"):
        return None
    plan = [t.strip() for t in m.group(1).split(",") if t.strip()]
    done = sum(
        1
        for msg in data["messages"]
        if msg.get("role") == "assistant"
        and isinstance(msg.get("content"), list)
        and any(isinstance(b, dict) and b.get("type") == "tool_use" for b in msg["content"])
    )
    tools = {t.get("name"): t for t in data["tools"] if isinstance(t, dict)}
    if done >= len(plan) or plan[done] not in tools:
        return None
    name = plan[done]
    schema = tools[name].get("input_schema") or {}
    props = schema.get("properties") or {}
    fill = {"integer": done, "number": done, "boolean": True}
    args = {
        p: fill.get(props.get(p, {}).get("type"), f"{name} {done}")
        for p in schema.get("required") or []
    }
    return {"type": "tool_use", "id": f"toolu_local_{done}", "name": name, "input": args}


def _stream_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events, in the API's order, from which a client assembles ``message``."""
    usage = message["usage"]
    # The API reports the input usage at the start, the output usage in message_delta.
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1},
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(message["content"]):
        if block["type"] == "tool_use":
            opened = {**block, "input": {}}
            # The API opens a tool's input with an empty piece too.
            pieces = ["", *_tokens(json.dumps(block["input"]))]
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces]
        else:
            opened = {**block, "text": ""}
            deltas = [{"type": "text_delta", "text": t} for t in _tokens(block["text"])]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opened},
            )
        )
        events += [
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    events.append(("message_delta", {"type": "message_delta", "delta": stop, "usage": usage}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def _paced(
    events: list[tuple[str, dict[str, Any]]],
    *,
    token_ms: int,
    cut_after: int | None,
    cut_status: int | None,
) -> Iterator[bytes]:
    """``events`` on the wire, token_ms apart between text deltas.  With cut_after the
    answer breaks off after that many deltas (before message_stop at the latest, so a cut
    always fails the call): the connection dropped, or an ``error`` event of cut_status."""
    deltas = texts = 0
    for name, data in events:
        if (
            cut_after is not None
            and name != "message_start"
            and (deltas >= cut_after or name == "message_stop")
        ):
            if cut_status is None:
                raise _Cut
            yield _sse("error", _anthropic_error(cut_status, _FAIL_MESSAGES[cut_status]))
            return
        if name == "content_block_delta":
            if data["delta"]["type"] == "text_delta":
                if texts and token_ms > 0:
                    time.sleep(token_ms / 1000)
                texts += 1
            deltas += 1
        yield _sse(name, data)


def _validate_messages_body(data: dict[str, Any] | None) -> str | None:
    """An error message if the body is not a usable Messages request, else None."""
    if data is None:
        return "request body must be a JSON object"
    model = data.get("model")
    if not isinstance(model, str) or not model:
        return "model: field required"
    max_tokens = data.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens: must be a positive integer"
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: must be a non-empty list"
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: must be 'user' or 'assistant'"
        if not isinstance(msg.get("content"), (str, list)):
            return f"messages.{i}.content: must be a string or a list of blocks"
    if not isinstance(data.get("stream", False), bool):
        return "stream: must be a boolean"
    return None


class ModelServer(_StandIn):
    """Anthropic Messages API stand-in with deterministic replies and failure injection.

    ``fail_every=N`` fails requests N, 2N, 3N, ... with ``fail_status``; ``POST /_control``
    (or :meth:`control`) queues the next k failures, or a cut of the next streamed answer.
    Injected failures win over validation, like a real overloaded front end that never
    looks at the body.  ``token_ms`` paces the text deltas of streamed answers.
    """

    name = "model"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        delay_ms: int = 0,
        token_ms: int = 0,
        fail_every: int = 0,
        fail_status: int = 429,
        rpm: int = 0,
        burst: int | None = None,
        verbose: bool = False,
    ) -> None:
        super().__init__(host, port, delay_ms=delay_ms, verbose=verbose)
        _check_status(fail_status)
        if rpm < 0 or (burst is not None and burst < 1):
            raise ValueError(f"rpm must be >= 0 and burst >= 1, got rpm={rpm}, burst={burst}")
        # Plain attribute like delay_ms: read on every streamed request.
        self.token_ms = token_ms
        self.fail_every = fail_every
        self.fail_status = fail_status
        self.rpm, self.burst = rpm, burst or rpm
        self._reset_state()

    def _reset_state(self) -> None:
        self._requests = 0
        self._failures = 0
        self._rate_limited = 0
        self._bucket, self._bucket_at = float(self.burst), time.time()
        self._streamed = 0
        self._served = 0
        self._fail_next = 0
        self._fail_next_status = 429
        self._cut_after: int | None = None
        self._cut_status: int | None = None
        self._received: list[dict[str, Any]] = []

    def stats(self) -> dict[str, Any]:
        """Same dict as ``GET /_stats``: requests (streamed ones included), injected
        failures (cuts included), how many requests asked for a stream, and with ``rpm``
        set, how many were answered 429 by the rate limit (``rate_limited``)."""
        with self._lock:
            stats = {
                "requests": self._requests,
                "failures": self._failures,
                "streamed": self._streamed,
            }
            if self.rpm:
                stats["rate_limited"] = self._rate_limited
            return stats

    def received(self) -> list[dict[str, Any]]:
        """Bodies of the requests seen so far (JSON objects only), oldest first."""
        with self._lock:
            return list(self._received)

    def control(
        self,
        *,
        fail_next: int | None = None,
        status: int | None = None,
        fail_every: int | None = None,
        fail_status: int | None = None,
        delay_ms: int | None = None,
        token_ms: int | None = None,
        cut_after: int | None = None,
        cut_status: int | None = None,
        reset: bool = False,
    ) -> None:
        """Change failure injection and pacing at run time (same fields as ``POST /_control``).

        Args:
            fail_next: fail the next k requests with ``status`` (default 429).
            fail_every: fail every Nth request with ``fail_status`` (0: never).
            delay_ms: sleep before every answer.
            token_ms: sleep between the text deltas of a streamed answer.
            cut_after: break off the next streamed answer after k deltas by dropping the
                connection, or with ``cut_status`` (default none) by an ``error`` event of
                that status's type.
            reset: forget counts, received bodies and queued failures and cuts first.
        """
        for s in (status, fail_status, cut_status):
            if s is not None:
                _check_status(s)
        if cut_after is not None and (
            isinstance(cut_after, bool) or not isinstance(cut_after, int)
        ):
            raise ValueError(f"cut_after must be an integer, got {cut_after!r}")
        with self._lock:
            if reset:
                self._reset_state()
            if fail_next is not None:
                self._fail_next = max(0, int(fail_next))
                self._fail_next_status = status if status is not None else 429
            if fail_every is not None:
                self.fail_every = max(0, int(fail_every))
            if fail_status is not None:
                self.fail_status = fail_status
            if delay_ms is not None:
                self.delay_ms = max(0, int(delay_ms))
            if token_ms is not None:
                self.token_ms = max(0, int(token_ms))
            if cut_after is not None:
                self._cut_after = max(0, cut_after)
                self._cut_status = cut_status

    def _handle(
        self, method: str, path: str, headers: dict[str, str], raw: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        if method == "POST" and path == "/v1/messages":
            return self._messages(raw)
        if method == "GET" and path == "/_stats":
            return 200, self.stats(), {"request-id": "req_local_stats"}
        if method == "POST" and path == "/_control":
            return self._control(raw)
        return (
            404,
            _anthropic_error(404, f"no route {method} {path}"),
            {"request-id": "req_local_404"},
        )

    def _control(self, raw: bytes) -> tuple[int, Any, dict[str, str]]:
        data = _parse_json_object(raw)
        hdrs = {"request-id": "req_local_control"}
        if data is None:
            return 400, _anthropic_error(400, "body must be a JSON object"), hdrs
        known = {
            "fail_next",
            "status",
            "fail_every",
            "fail_status",
            "delay_ms",
            "token_ms",
            "cut_after",
            "cut_status",
            "reset",
        }
        unknown = set(data) - known
        if unknown:
            return 400, _anthropic_error(400, f"unknown control fields: {sorted(unknown)}"), hdrs
        try:
            self.control(**data)
        except (TypeError, ValueError) as exc:
            return 400, _anthropic_error(400, str(exc)), hdrs
        with self._lock:
            state = {
                "fail_next": self._fail_next,
                "status": self._fail_next_status,
                "fail_every": self.fail_every,
                "fail_status": self.fail_status,
                "delay_ms": self.delay_ms,
                "token_ms": self.token_ms,
                "cut_after": self._cut_after,
                "cut_status": self._cut_status,
            }
        return 200, state, hdrs

    def _messages(self, raw: bytes) -> tuple[int, Any, dict[str, str]]:
        data = _parse_json_object(raw)
        with self._lock:
            self._requests += 1
            n = self._requests
            if data is not None:
                self._received.append(data)
                if data.get("stream") is True:
                    self._streamed += 1
            # The limit comes first, as the API's front end answers before anything else.
            limited, headers = self._take_request() if self.rpm else (False, {})
            fail_status: int | None = None
            if limited:
                pass
            elif self._fail_next > 0:
                self._fail_next -= 1
                fail_status = self._fail_next_status
            elif self.fail_every > 0 and n % self.fail_every == 0:
                fail_status = self.fail_status
            if fail_status is not None:
                self._failures += 1
        headers["request-id"] = f"req_local_{n}"
        if limited:
            why = f"This request would exceed the rate limit of {self.rpm} requests per minute."
            return 429, _anthropic_error(429, why), headers
        self._sleep()
        if fail_status is not None:
            if fail_status == 429:
                headers["retry-after"] = "0"
            return fail_status, _anthropic_error(fail_status, _FAIL_MESSAGES[fail_status]), headers

        problem = _validate_messages_body(data)
        if problem is not None:
            return 400, _anthropic_error(400, problem), headers
        assert data is not None
        message = self._answer(data)
        if not data.get("stream"):
            return 200, message, headers
        with self._lock:
            # A cut is for the next stream actually answered, not one failed above.
            cut_after, self._cut_after = self._cut_after, None
            cut_status, self._cut_status = self._cut_status, None
            if cut_after is not None:
                self._failures += 1
            token_ms = self.token_ms
        m = _TOKEN_MS_LINE.search(_first_user_text(data))
        if m:
            token_ms = int(m.group(1))
        events = _paced(
            _stream_events(message), token_ms=token_ms, cut_after=cut_after, cut_status=cut_status
        )
        return 200, _EventStream(events), headers

    def _take_request(self) -> tuple[bool, dict[str, str]]:
        """Take a request from the bucket (under the lock): (refused, the rate headers)."""
        now, per_s = time.time(), self.rpm / 60
        self._bucket = min(self.burst, self._bucket + (now - self._bucket_at) * per_s)
        self._bucket_at = now
        refused = self._bucket < 1
        if refused:
            self._rate_limited += 1
        else:
            self._bucket -= 1
        full = datetime.datetime.fromtimestamp(
            now + (self.burst - self._bucket) / per_s, datetime.UTC
        )
        headers = {
            "anthropic-ratelimit-requests-limit": str(self.rpm),
            "anthropic-ratelimit-requests-remaining": str(int(self._bucket)),
            "anthropic-ratelimit-requests-reset": full.isoformat().replace("+00:00", "Z"),
        }
        if refused:
            headers["retry-after"] = str(math.ceil((1 - self._bucket) / per_s))
        return refused, headers

    def _answer(self, data: dict[str, Any]) -> dict[str, Any]:
        """The Message for a valid body; a stream sends the same one as events."""
        tool_use = _next_tool_use(data)
        last_user = next((m for m in reversed(data["messages"]) if m.get("role") == "user"), None)
        reply = reply_for(_text_of(last_user["content"]) if last_user else "")
        prompt = json.dumps({"system": data.get("system"), "messages": data["messages"]})
        with self._lock:
            self._served += 1
            msg_no = self._served
        return {
            "id": f"msg_local_{msg_no}",
            "type": "message",
            "role": "assistant",
            "model": data["model"],
            "content": [tool_use] if tool_use else [{"type": "text", "text": reply}],
            "stop_reason": "tool_use" if tool_use else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": max(1, len(prompt) // 4),
                "output_tokens": max(1, len(reply) // 4),
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }


_FAIL_MESSAGES: dict[int, str] = {
    400: "Injected invalid request.",
    401: "Injected authentication failure.",
    403: "Injected permission failure.",
    404: "Injected not found.",
    413: "Injected request too large.",
    429: "Number of requests has exceeded your rate limit (injected by stand-in).",
    500: "Internal server error (injected by stand-in).",
    529: "Overloaded (injected by stand-in).",
}


def _check_status(status: Any) -> None:
    if isinstance(status, bool) or not isinstance(status, int) or status not in _FAIL_MESSAGES:
        raise ValueError(f"status must be one of {sorted(_FAIL_MESSAGES)}, got {status!r}")
