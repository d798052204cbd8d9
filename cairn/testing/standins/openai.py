"""OpenAI's Chat Completions and Responses APIs as ModelServer speaks them, enough for the
real ``openai`` SDK (3.x) to work with no key and no network::

    client = openai.OpenAI(api_key="local", base_url=server.openai_url)  # server.url + "/v1"
    # or OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=local

The SDK's base URL ends in ``/v1`` (its default is ``https://api.openai.com/v1``) and it
joins ``chat/completions`` or ``responses`` to it; a base URL without ``/v1`` gets a 404
that says so.  Replies, tool calls, usage, the rate limit, injected failures, pacing and
cuts are the server's (cairn.testing.standins.model, replies); this module is the wire.

``POST /v1/chat/completions``
-----------------------------
* Body: ``model``, ``messages`` (roles system, developer, user, assistant, tool; an
  assistant's ``tool_calls`` must be answered by ``tool`` messages right after it, as the
  API checks), optional ``tools`` (``{"type": "function", "function": {...}}``),
  ``stream``, ``stream_options`` (only with ``stream``), ``max_tokens`` /
  ``max_completion_tokens``, ``n`` (1 only).  Anything else is accepted and ignored.
* Answer: ``chat.completion`` with one choice: the reply to the last message if it is the
  user's (``""`` after a tool's result, as the Messages side answers a tool_result turn),
  ``finish_reason`` ``"stop"``; or, while the first user message's ``TOOLS:`` line has
  tools left, one tool call (``call_local_<turn>``, arguments filling the schema's
  required properties) with ``content: null`` and ``finish_reason`` ``"tool_calls"``.
* Usage: ``prompt_tokens`` a quarter of the characters of the messages as JSON,
  ``completion_tokens`` a quarter of the reply's (or of the tool's name and arguments);
  ``prompt_tokens_details.cached_tokens`` is a ``CACHED: n`` line's n (at most the
  prompt), ``completion_tokens_details.reasoning_tokens`` a ``REASONING: n`` line's n,
  added to ``completion_tokens`` as the API counts them.
* Streaming (``stream: true``; ``client.chat.completions.stream(...)``): bare ``data:``
  events of ``chat.completion.chunk``: the first carries ``role`` (and a tool call's id
  and name with empty arguments), then word-sized ``delta.content`` pieces (or pieces of
  the arguments' JSON in ``delta.tool_calls``), a chunk with ``finish_reason``, with
  ``stream_options: {"include_usage": true}`` a last chunk with ``choices: []`` and the
  usage (``usage: null`` on the others), then ``data: [DONE]``.  The SDK assembles the
  same message as the non-streaming answer but for ``id`` and ``created``.

``POST /v1/responses`` is cairn.testing.standins.responses.

Both APIs
---------
* Every answer carries ``x-request-id`` (``req_local_<n>``); JSON answers are
  ``application/json``, streams ``text/event-stream`` (chunked).
* Errors are OpenAI's body, ``{"error": {"message", "type", "param", "code"}}``: a bad
  body is a 400 ``invalid_request_error`` naming the ``param``; an injected or
  rate-limited 429 is type ``requests`` (or ``tokens``), code ``rate_limit_exceeded``;
  5xx is ``server_error``.  An injected 429 carries ``retry-after: 0`` and
  ``retry-after-ms: 0``; one refused by the rate limit the real wait in both.
* With ``rpm`` set every answer carries ``x-ratelimit-limit-requests``,
  ``x-ratelimit-remaining-requests`` and ``x-ratelimit-reset-requests`` (until the
  bucket is full again, as a Go duration: ``"20ms"``, ``"1s"``, ``"1.5s"``, ``"6m0s"``),
  and with ``tpm`` the same three for ``-tokens``.
* ``cut_after=k``: the stream is dropped after k deltas (text or argument pieces), before
  the chunk with ``finish_reason`` / ``response.completed`` at the latest.  With
  ``cut_status`` it ends instead with an error event: for Chat Completions
  ``data: {"error": {...}}``, for Responses ``event: error`` with
  ``{"type": "error", "error": {...}, "sequence_number": n}``.

How the real SDK (openai 3.63) raises each failure
--------------------------------------------------
Checked against ``openai/_client.py`` (``_make_status_error``), ``_base_client.py``,
``_streaming.py`` and ``tests/integration/test_standins_openai.py``:

* 400 -> ``openai.BadRequestError``; 401 ``AuthenticationError``; 403
  ``PermissionDeniedError``; 404 ``NotFoundError``; 409 ``ConflictError``; 422
  ``UnprocessableEntityError``.
* 429 -> ``openai.RateLimitError`` (not a server error).
* Any status >= 500 (500, 503, and the Messages API's 529 if injected into an OpenAI
  call) -> ``openai.InternalServerError``; OpenAI has no overloaded class.
* Other statuses -> plain ``openai.APIStatusError``.  All of these are
  ``APIStatusError`` with ``exc.status_code``, ``exc.request_id`` (our ``x-request-id``),
  ``exc.response`` (an ``httpx2.Response``: read ``exc.response.headers["retry-after"]``),
  ``exc.body`` (the inner ``error`` object) and ``exc.type`` / ``exc.code`` /
  ``exc.param`` / ``exc.message`` from it.
* Nothing listening -> ``openai.APIConnectionError``; a timeout -> ``openai.APITimeoutError``
  (a subclass of ``APIConnectionError``).
* A stream cut by a dropped connection -> ``openai.APIConnectionError`` from the stream's
  iterator (the SDK wraps the transport's ``httpx2.RemoteProtocolError``).  A cut with an
  error event -> plain ``openai.APIError`` (no ``status_code``: the status line said 200)
  with ``exc.type``/``exc.code`` from the event, for both APIs: the SDK raises any
  streamed event whose data has a top-level ``error`` key.

Retry behaviour: the SDK retries 408/409/429/5xx and connection errors itself
(``max_retries`` default 2; an ``x-should-retry`` header overrides the status), waiting
``retry-after-ms``, else ``retry-after`` (seconds, or an HTTP date) when 0 < wait <= 120 s,
else backoff 0.5 s doubling to 8 s less up to 25 % jitter; a retry-after above 120 s means
no retry at all.  So the injected ``retry-after: 0`` falls back to the backoff.  cairn does
its own retrying: build clients with ``max_retries=0`` in tests.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from cairn.testing.standins.api import _Api, _Event, _Limit, _Problem, _prompt_chars, _sse
from cairn.testing.standins.replies import _next_tool_call, _tokens, _usage, reply_for

# OpenAI's error (type, code) by status.  The API spells a rate limit's type after the
# bucket that ran dry; "requests" for an injected one.
_ERRORS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", None),
    404: ("invalid_request_error", None),
    413: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
}


def _openai_error(
    status: int, message: str, *, param: str | None = None, kind: str | None = None
) -> dict[str, Any]:
    default = ("server_error", None) if status >= 500 else ("invalid_request_error", None)
    type_, code = _ERRORS.get(status, default)
    return {"error": {"message": message, "type": kind or type_, "param": param, "code": code}}


def _go_duration(seconds: float) -> str:
    """A duration as Go prints one, as OpenAI's reset headers do: 20ms, 1s, 1.5s, 6m0s."""
    ms = math.ceil(seconds * 1000)
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if hours or minutes else "") + secs


def _text_of(content: Any) -> str:
    """Text of a message's content: a string, or the text parts of a part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p["text"]
            for p in content
            if isinstance(p, dict)
            and p.get("type") in ("text", "input_text", "output_text")
            and isinstance(p.get("text"), str)
        )
    return ""


class _OpenAiApi(_Api):
    """What both OpenAI APIs share: errors, rate-limit headers, request ids."""

    request_id_header = "x-request-id"

    def error(self, status: int, message: str, *, param: str | None = None) -> dict[str, Any]:
        return _openai_error(status, message, param=param)

    def limit_headers(self, limit: _Limit) -> dict[str, str]:
        headers: dict[str, str] = {}
        for kind, per_minute, left, full_s in limit.buckets():
            headers[f"x-ratelimit-limit-{kind}"] = str(per_minute)
            headers[f"x-ratelimit-remaining-{kind}"] = str(int(left))
            headers[f"x-ratelimit-reset-{kind}"] = _go_duration(full_s)
        return headers

    def rate_limited(self, limit: _Limit) -> tuple[dict[str, Any], dict[str, str]]:
        kind = limit.refused or "requests"
        if kind == "tokens":
            what = f"tokens per min (TPM): Limit {limit.tokens}"
        else:
            what = f"requests per min (RPM): Limit {limit.requests}"
        wait = _go_duration(limit.retry_after_s)
        why = f"Rate limit reached on {what}. Please try again in {wait}."
        headers = {
            "retry-after": str(math.ceil(limit.retry_after_s)),
            "retry-after-ms": str(math.ceil(limit.retry_after_s * 1000)),
        }
        return _openai_error(429, why, kind=kind), headers

    def injected_429_headers(self) -> dict[str, str]:
        return {"retry-after": "0", "retry-after-ms": "0"}


def _check_common(
    data: dict[str, Any], *, max_keys: tuple[str, ...], least: int
) -> _Problem | None:
    model = data.get("model")
    if not isinstance(model, str) or not model:
        return "model", "Missing required parameter: 'model'."
    if not isinstance(data.get("stream", False), bool):
        return "stream", "Invalid type for 'stream': expected a boolean."
    for key in max_keys:
        value = data.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < least
        ):
            return key, f"Invalid '{key}': expected an integer >= {least}."
    return None


# -- Chat Completions -------------------------------------------------------------------

_CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


def _check_chat_tools(tools: Any) -> _Problem | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        return "tools", "Invalid type for 'tools': expected an array."
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            return (
                f"tools[{i}]",
                "The stand-in offers tools of type 'function' with a 'function' object only.",
            )
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            return (
                f"tools[{i}].function.name",
                f"Missing required parameter: 'tools[{i}].function.name'.",
            )
    return None


_ORPHAN_TOOL = (
    "Invalid parameter: messages with role 'tool' must be a response to a preceding message "
    "with 'tool_calls'."
)


def _unanswered(pending: list[str]) -> str:
    return (
        "An assistant message with 'tool_calls' must be followed by tool messages responding to "
        "each 'tool_call_id'. The following tool_call_ids did not have response messages: "
        + ", ".join(pending)
    )


def _check_chat_messages(messages: Any) -> _Problem | None:
    if not isinstance(messages, list) or not messages:
        return "messages", "Invalid 'messages': expected a non-empty array."
    pending: list[str] = []  # tool calls of the last assistant message not yet answered
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role not in _CHAT_ROLES:
            return (
                f"messages[{i}].role",
                f"Invalid value for 'messages[{i}].role': expected one of {', '.join(_CHAT_ROLES)}.",
            )
        assert isinstance(msg, dict)
        content = msg.get("content")
        calls = msg.get("tool_calls") if role == "assistant" else None
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if call_id not in pending:
                return f"messages[{i}].role", _ORPHAN_TOOL
            pending.remove(call_id)
        elif pending:
            return "messages", _unanswered(pending)
        if not (isinstance(content, (str, list)) or (content is None and calls)):
            return (
                f"messages[{i}].content",
                f"Invalid type for 'messages[{i}].content': expected a string or an array.",
            )
        if calls is not None:
            if not isinstance(calls, list):
                return (
                    f"messages[{i}].tool_calls",
                    f"Invalid type for 'messages[{i}].tool_calls': expected an array.",
                )
            for j, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, dict) else None
                if (
                    not isinstance(call, dict)
                    or not isinstance(call.get("id"), str)
                    or not isinstance(fn, dict)
                    or not isinstance(fn.get("name"), str)
                    or not isinstance(fn.get("arguments"), str)
                ):
                    return (
                        f"messages[{i}].tool_calls[{j}]",
                        "A tool call needs an 'id' and a 'function' with 'name' and 'arguments' (a string).",
                    )
            pending = [c["id"] for c in calls]
    if pending:
        return "messages", _unanswered(pending)
    return None


class ChatCompletionsApi(_OpenAiApi):
    """``POST /v1/chat/completions`` (see the module docstring)."""

    name = "chat.completions"
    path = "/v1/chat/completions"

    def check(self, data: dict[str, Any] | None) -> _Problem | None:
        if data is None:
            return None, "We could not parse the JSON body of your request."
        problem = _check_common(data, max_keys=("max_tokens", "max_completion_tokens"), least=1)
        if problem is None:
            problem = _check_chat_messages(data.get("messages")) or _check_chat_tools(
                data.get("tools")
            )
        if problem is not None:
            return problem
        if data.get("n", 1) not in (1, None):
            return "n", "The stand-in answers with one choice: 'n' must be 1."
        options = data.get("stream_options")
        if options is not None:
            if not data.get("stream"):
                return (
                    "stream_options",
                    "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                )
            if not isinstance(options, dict) or not isinstance(
                options.get("include_usage", False), bool
            ):
                return (
                    "stream_options",
                    "Invalid 'stream_options': expected an object with a boolean 'include_usage'.",
                )
        return None

    def directives(self, data: dict[str, Any]) -> str:
        first = next((m for m in data["messages"] if m.get("role") == "user"), None)
        return _text_of(first.get("content")) if first else ""

    def prompt_tokens(self, data: dict[str, Any]) -> int:
        return max(1, _prompt_chars(data.get("messages")) // 4)

    def answer(self, data: dict[str, Any], no: int) -> dict[str, Any]:
        messages = data["messages"]
        directives = self.directives(data)
        schemas = {
            t["function"]["name"]: t["function"].get("parameters") or {}
            for t in data.get("tools") or []
        }
        done = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
        call = _next_tool_call(directives, schemas, done)
        message: dict[str, Any] = {"role": "assistant", "refusal": None, "annotations": []}
        if call is not None:
            name, args = call
            arguments = json.dumps(args)
            message["content"] = None
            message["tool_calls"] = [
                {
                    "id": f"call_local_{done}",
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            ]
            output, finish = name + arguments, "tool_calls"
        else:
            # The reply is to the user's turn; a turn that ends in a tool's result has none.
            last = next(
                (m for m in reversed(messages) if m.get("role") not in ("system", "developer")),
                None,
            )
            said = _text_of(last.get("content")) if last and last.get("role") == "user" else ""
            message["content"] = output = reply_for(said)
            finish = "stop"
        u = _usage(json.dumps(messages), output, directives)
        return {
            "id": f"chatcmpl-local-{no}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": data["model"],
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            ],
            "usage": {
                "prompt_tokens": u.input,
                "completion_tokens": u.output,
                "total_tokens": u.input + u.output,
                "prompt_tokens_details": {"cached_tokens": u.cached, "audio_tokens": 0},
                "completion_tokens_details": {
                    "reasoning_tokens": u.reasoning,
                    "audio_tokens": 0,
                    "accepted_prediction_tokens": 0,
                    "rejected_prediction_tokens": 0,
                },
            },
            "service_tier": "default",
            "system_fingerprint": "fp_local",
        }

    def events(self, answer: dict[str, Any], data: dict[str, Any]) -> list[_Event]:
        options = data.get("stream_options") or {}
        with_usage = options.get("include_usage") is True
        base = {
            k: answer[k] for k in ("id", "created", "model", "service_tier", "system_fingerprint")
        }
        base["object"] = "chat.completion.chunk"

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            body = {**base, "choices": [choice]}
            if with_usage:
                body["usage"] = None
            return _sse(body)

        choice = answer["choices"][0]
        message = choice["message"]
        events: list[_Event] = []
        if message.get("tool_calls"):
            call = message["tool_calls"][0]
            # The call's id and name come first, its arguments in pieces after.
            opened = {
                **call,
                "index": 0,
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            head = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [opened]}
            events.append(_Event(chunk(head), opening=True))
            events += [
                _Event(
                    chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}), delta=True
                )
                for p in _tokens(call["function"]["arguments"])
            ]
        else:
            events.append(
                _Event(chunk({"role": "assistant", "content": "", "refusal": None}), opening=True)
            )
            events += [
                _Event(chunk({"content": t}), delta=True, text=True)
                for t in _tokens(message["content"])
            ]
        events.append(_Event(chunk({}, choice["finish_reason"]), closing=True))
        if with_usage:
            events.append(_Event(_sse({**base, "choices": [], "usage": answer["usage"]})))
        events.append(_Event(b"data: [DONE]\n\n"))
        return events

    def cut_event(self, status: int, message: str, at: int) -> bytes:
        return _sse(_openai_error(status, message))
