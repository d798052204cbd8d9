"""The model stand-in's OpenAI side (Chat Completions, Responses) through the real `openai`
SDK: answers, streams, tool calls, usage, injected failures, the rate limit, cuts, counts,
and `cairn standin model` serving both SDKs. Real servers, no mocks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from cairn.testing.standins import ModelServer
from cairn.testing.standins.openai import _go_duration

ROOT = Path(__file__).resolve().parents[2]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
CHAT_TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "lookup", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "notify", "parameters": {"type": "object"}}},
]
RESPONSES_TOOLS: list[Any] = [
    {"type": "function", "name": "lookup", "parameters": WEATHER, "strict": False},
    {"type": "function", "name": "notify", "parameters": {"type": "object"}, "strict": False},
]


# `model` (a fresh server per test) comes from conftest.py.
@pytest.fixture
def client(model: ModelServer) -> Iterator[openai.OpenAI]:
    # max_retries=0: cairn owns retrying, and the tests must see every failure.
    with openai.OpenAI(api_key="local", base_url=model.openai_url, max_retries=0) as c:
        yield c


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as c:
        yield c


def _chat(client: openai.OpenAI, text: str, **kw: Any) -> Any:
    return client.chat.completions.create(
        model="gpt-local", messages=[{"role": "user", "content": text}], **kw
    )


def _chat_stream(client: openai.OpenAI, text: str, **kw: Any) -> tuple[list[str], Any]:
    """The content deltas of a streamed answer, and the completion the SDK assembled.
    (The first chunk's content is "", as the API's: the SDK makes a delta of it too.)"""
    with client.chat.completions.stream(
        model="gpt-local", messages=[{"role": "user", "content": text}], **kw
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta" and e.delta]
        return deltas, stream.get_final_completion()


def _respond(client: openai.OpenAI, text: str, **kw: Any) -> Any:
    return client.responses.create(model="gpt-local", input=text, **kw)


def _respond_stream(client: openai.OpenAI, text: str, **kw: Any) -> tuple[list[str], Any]:
    with client.responses.stream(model="gpt-local", input=text, **kw) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        return deltas, stream.get_final_response()


def _sse(resp: httpx.Response) -> list[tuple[str | None, str]]:
    """(event name, data) of an SSE body, read by hand rather than by the SDK."""
    events = []
    for block in resp.text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields.get("event"), fields["data"]))
    return events


def _without(dumped: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in dumped.items() if k not in keys}


# -- base URL -------------------------------------------------------------------------------


def test_openai_base_url_from_env(model: ModelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    assert model.openai_url == f"{model.url}/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", model.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", "local")
    with openai.OpenAI(max_retries=0) as c:
        assert _chat(c, "REPLY: from env").choices[0].message.content == "from env"


def test_base_url_without_v1_is_a_404_that_says_so(model: ModelServer) -> None:
    with (
        openai.OpenAI(api_key="local", base_url=model.url, max_retries=0) as c,
        pytest.raises(openai.NotFoundError) as info,
    ):
        _chat(c, "hi")
    assert f"{model.url}/v1" in info.value.message
    assert info.value.type == "invalid_request_error"
    assert model.stats()["requests"] == 0


# -- Chat Completions -------------------------------------------------------------------------


def test_chat_answer_shape(model: ModelServer, client: openai.OpenAI) -> None:
    completion = _chat(client, "Do a thing.\nREPLY: done it\nthanks")
    assert completion.id == "chatcmpl-local-1" and completion.object == "chat.completion"
    assert completion.model == "gpt-local" and completion._request_id == "req_local_1"
    assert abs(completion.created - time.time()) < 60
    (choice,) = completion.choices
    assert choice.index == 0 and choice.finish_reason == "stop"
    assert choice.message.role == "assistant" and choice.message.content == "done it"
    assert choice.message.tool_calls is None
    assert model.received("chat.completions")[0]["model"] == "gpt-local"


def test_chat_replies_to_the_last_user_message(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="gpt-local",
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "REPLY: first"},
            {"role": "assistant", "content": "first"},
            {"role": "user", "content": [{"type": "text", "text": "REPLY: second"}]},
        ],
    )
    assert completion.choices[0].message.content == "second"
    assert _chat(client, "VALIDATE this").choices[0].message.content == "VALID"


def test_chat_usage_with_cached_and_reasoning_tokens(client: openai.OpenAI) -> None:
    text = "CACHED: 3\nREASONING: 7\nREPLY: twelve chars"
    usage = _chat(client, text).usage
    prompt = max(1, len(json.dumps([{"role": "user", "content": text}])) // 4)
    assert usage.prompt_tokens == prompt
    assert usage.prompt_tokens_details.cached_tokens == 3
    assert usage.completion_tokens_details.reasoning_tokens == 7
    assert usage.completion_tokens == len("twelve chars") // 4 + 7
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # No directives: nothing cached, no reasoning; cached never exceeds the prompt.
    plain = _chat(client, "REPLY: a").usage
    assert plain.prompt_tokens_details.cached_tokens == 0
    assert plain.completion_tokens_details.reasoning_tokens == 0
    assert plain.completion_tokens == 1
    assert _chat(client, "CACHED: 100000").usage.prompt_tokens_details.cached_tokens < 100


def test_chat_stream_equals_create(model: ModelServer, client: openai.OpenAI) -> None:
    text = "CACHED: 2\nREASONING: 4\nREPLY: Hello big  wide world"
    deltas, streamed = _chat_stream(client, text, stream_options={"include_usage": True})
    created = _chat(client, text)
    assert deltas == ["Hello", " big", "  wide", " world"]
    assert "".join(deltas) == created.choices[0].message.content
    # As from the real API: a streamed message has no annotations, create's an empty list.
    message = _without(streamed.choices[0].message.model_dump(), "parsed", "annotations")
    assert message == _without(created.choices[0].message.model_dump(), "annotations")
    assert streamed.choices[0].finish_reason == created.choices[0].finish_reason == "stop"
    assert streamed.usage == created.usage and streamed.usage.prompt_tokens > 1
    assert _without(streamed.model_dump(), "id", "created", "choices") == _without(
        created.model_dump(), "id", "created", "choices"
    )
    assert streamed.id == "chatcmpl-local-1"
    # Usage only when asked for, as the API does.
    assert _chat_stream(client, text)[1].usage is None
    assert model.stats()["by_api"]["chat.completions"] == {
        "requests": 3,
        "failures": 0,
        "streamed": 2,
    }


def test_chat_stream_wire_format(model: ModelServer, http: httpx.Client) -> None:
    body = {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "REPLY: a b"}],
    }
    resp = http.post(f"{model.openai_url}/chat/completions", json=body)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream"
    assert resp.headers["transfer-encoding"] == "chunked"
    assert resp.headers["x-request-id"] == "req_local_1"
    events = _sse(resp)
    assert all(name is None for name, _ in events)  # bare data: lines
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert {c["id"] for c in chunks} == {"chatcmpl-local-1"}
    assert [c["choices"][0]["delta"] for c in chunks[:-1]] == [
        {"role": "assistant", "content": "", "refusal": None},
        {"content": "a"},
        {"content": " b"},
        {},
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, None, "stop"]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 1


def test_chat_tool_calls_one_a_turn_then_text(model: ModelServer, client: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "TOOLS: lookup, notify\nWeather?"}]
    calls = []
    for turn in range(2):
        completion = client.chat.completions.create(
            model="gpt-local", messages=messages, tools=CHAT_TOOLS
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.id == f"call_local_{turn}" and call.type == "function"
        calls.append((call.function.name, json.loads(call.function.arguments)))
        messages.append(choice.message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny"})
    assert calls == [("lookup", {"city": "lookup 0", "days": 0}), ("notify", {})]
    last = client.chat.completions.create(model="gpt-local", messages=messages, tools=CHAT_TOOLS)
    # After a tool's result the user said nothing new: the same "ack: " as the Messages side.
    assert last.choices[0].finish_reason == "stop"
    assert last.choices[0].message.content == "ack: "
    # Without tools offered, TOOLS: is ignored.
    assert _chat(client, "TOOLS: lookup\nREPLY: no tools").choices[0].message.content == (
        "no tools"
    )
    assert len(model.received("chat.completions")) == 4


def test_chat_stream_tool_call(
    model: ModelServer, client: openai.OpenAI, http: httpx.Client
) -> None:
    text = "TOOLS: lookup\nWeather?"
    deltas, streamed = _chat_stream(
        client, text, tools=CHAT_TOOLS, stream_options={"include_usage": True}
    )
    created = _chat(client, text, tools=CHAT_TOOLS)
    assert deltas == []
    (call,) = streamed.choices[0].message.tool_calls
    (want,) = created.choices[0].message.tool_calls
    assert (call.id, call.function.name, call.function.arguments) == (
        want.id,
        want.function.name,
        want.function.arguments,
    )
    assert streamed.choices[0].finish_reason == "tool_calls"
    assert streamed.choices[0].message.content is None
    assert streamed.usage == created.usage
    # On the wire: id and name first with empty arguments, then the JSON in pieces.
    body = {
        "model": "m",
        "stream": True,
        "tools": CHAT_TOOLS,
        "messages": [{"role": "user", "content": text}],
    }
    chunks = [
        json.loads(d)
        for _, d in _sse(http.post(f"{model.openai_url}/chat/completions", json=body))[:-1]
    ]
    head = chunks[0]["choices"][0]["delta"]["tool_calls"][0]
    assert head == {
        "id": "call_local_0",
        "type": "function",
        "index": 0,
        "function": {"name": "lookup", "arguments": ""},
    }
    pieces = [
        c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for c in chunks[1:-1]
    ]
    assert len(pieces) > 2 and json.loads("".join(pieces)) == {"city": "lookup 0", "days": 0}
    assert "usage" not in chunks[0]  # not asked for


@pytest.mark.parametrize(
    "body, param, fragment",
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "model", "model"),
        ({"model": "m", "messages": []}, "messages", "non-empty"),
        ({"model": "m", "messages": [{"role": "bot", "content": "x"}]}, "messages[0].role", "role"),
        ({"model": "m", "messages": [{"role": "user"}]}, "messages[0].content", "content"),
        (
            {"model": "m", "stream": "yes", "messages": [{"role": "user", "content": "x"}]},
            "stream",
            "boolean",
        ),
        (
            {
                "model": "m",
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "x"}],
            },
            "stream_options",
            "only allowed when 'stream' is enabled",
        ),
        ({"model": "m", "n": 2, "messages": [{"role": "user", "content": "x"}]}, "n", "n"),
        (
            {"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]},
            "max_tokens",
            "max_tokens",
        ),
        (
            {
                "model": "m",
                "tools": [{"type": "function", "function": {}}],
                "messages": [{"role": "user", "content": "x"}],
            },
            "tools[0].function.name",
            "name",
        ),
        (
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    },
                    {"role": "user", "content": "y"},
                ],
            },
            "messages",
            "did not have response messages: call_1",
        ),
        (
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "tool", "tool_call_id": "call_9", "content": "out"},
                ],
            },
            "messages[1].role",
            "role 'tool' must be a response",
        ),
    ],
)
def test_chat_rejects_bad_body(
    model: ModelServer, http: httpx.Client, body: dict[str, Any], param: str, fragment: str
) -> None:
    resp = http.post(f"{model.openai_url}/chat/completions", json=body)
    assert resp.status_code == 400
    assert resp.headers["x-request-id"].startswith("req_local_")
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert fragment in error["message"]


def test_chat_bad_body_raises_bad_request_in_sdk(model: ModelServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=[])
    assert info.value.status_code == 400 and info.value.param == "messages"
    assert info.value.type == "invalid_request_error" and info.value.code is None
    resp = httpx.post(
        f"{model.openai_url}/chat/completions",
        content=b"{oops",
        headers={"Content-Type": "application/json"},
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] is None


# -- Responses ------------------------------------------------------------------------------


def test_responses_answer_shape_and_usage(model: ModelServer, client: openai.OpenAI) -> None:
    text = "CACHED: 5\nREASONING: 3\nREPLY: all good here"
    response = _respond(client, text, instructions="Be brief.")
    assert response.id == "resp_local_1" and response.object == "response"
    assert response.status == "completed" and response.model == "gpt-local"
    assert response._request_id == "req_local_1" and response.error is None
    assert response.output_text == "all good here"
    (item,) = response.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert [c.type for c in item.content] == ["output_text"]
    usage = response.usage
    prompt = {"instructions": "Be brief.", "input": text}
    assert usage.input_tokens == len(json.dumps(prompt)) // 4
    assert usage.input_tokens_details.cached_tokens == 5
    assert usage.output_tokens_details.reasoning_tokens == 3
    assert usage.output_tokens == len("all good here") // 4 + 3
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert model.received("responses")[0]["instructions"] == "Be brief."


def test_responses_replies_to_the_last_user_item(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="gpt-local",
        input=[
            {"role": "user", "content": "REPLY: first"},
            {"role": "assistant", "content": "first"},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "REPLY: second"}],
            },
        ],
    )
    assert response.output_text == "second"


def test_responses_stream_equals_create(model: ModelServer, client: openai.OpenAI) -> None:
    text = "CACHED: 1\nREPLY: Hello big  wide world"
    deltas, streamed = _respond_stream(client, text)
    created = _respond(client, text)
    assert deltas == ["Hello", " big", "  wide", " world"]
    assert streamed.output_text == created.output_text == "Hello big  wide world"
    assert streamed.usage == created.usage
    ids = ("id", "created_at", "completed_at", "output")
    assert _without(streamed.model_dump(), *ids) == _without(created.model_dump(), *ids)
    (got,), (want,) = streamed.output, created.output
    # The stream's items are the SDK's Parsed* subclasses, with a "parsed" field more.
    parsed = {"id": True, "content": {"__all__": {"parsed"}}}
    assert got.model_dump(exclude=parsed) == want.model_dump(exclude={"id"})
    assert model.stats()["by_api"]["responses"] == {"requests": 2, "failures": 0, "streamed": 1}


def test_responses_stream_wire_format(model: ModelServer, http: httpx.Client) -> None:
    body = {"model": "m", "stream": True, "input": "REPLY: a b"}
    resp = http.post(f"{model.openai_url}/responses", json=body)
    assert resp.status_code == 200 and resp.headers["content-type"] == "text/event-stream"
    events = [(name, json.loads(data)) for name, data in _sse(resp)]
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert [name for name, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    created = events[0][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == []
    assert created["usage"] is None
    assert [d["delta"] for n, d in events if n == "response.output_text.delta"] == ["a", " b"]
    done = events[-1][1]["response"]
    assert done["status"] == "completed" and done["output"][0]["content"][0]["text"] == "a b"
    assert done["usage"]["input_tokens_details"]["cached_tokens"] == 0


def test_responses_function_calls_one_a_turn(model: ModelServer, client: openai.OpenAI) -> None:
    items: list[Any] = [{"role": "user", "content": "TOOLS: lookup, notify\nWeather?"}]
    calls = []
    for turn in range(2):
        response = client.responses.create(model="gpt-local", input=items, tools=RESPONSES_TOOLS)
        (call,) = response.output
        assert call.type == "function_call" and call.call_id == f"call_local_{turn}"
        assert response.output_text == ""
        calls.append((call.name, json.loads(call.arguments)))
        items.append(
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            }
        )
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "ok"})
    assert calls == [("lookup", {"city": "lookup 0", "days": 0}), ("notify", {})]
    last = client.responses.create(model="gpt-local", input=items, tools=RESPONSES_TOOLS)
    assert last.output_text == "ack: "
    # Streamed, the call assembles to create's but for the item id.
    text = "TOOLS: lookup\nWeather?"
    with client.responses.stream(model="gpt-local", input=text, tools=RESPONSES_TOOLS) as stream:
        pieces = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        streamed = stream.get_final_response()
    created = client.responses.create(model="gpt-local", input=text, tools=RESPONSES_TOOLS)
    assert len(pieces) > 2 and "".join(pieces) == created.output[0].arguments
    keep = ("call_id", "name", "arguments", "status", "type")
    assert [{k: getattr(o, k) for k in keep} for o in streamed.output] == [
        {k: getattr(o, k) for k in keep} for o in created.output
    ]
    assert streamed.usage == created.usage


@pytest.mark.parametrize(
    "body, param, fragment",
    [
        ({"input": "x"}, "model", "model"),
        ({"model": "m"}, "input", "input"),
        ({"model": "m", "input": []}, "input", "input"),
        (
            {"model": "m", "input": "x", "previous_response_id": "resp_1"},
            "previous_response_id",
            "whole",
        ),
        ({"model": "m", "input": "x", "max_output_tokens": 10}, "max_output_tokens", "16"),
        ({"model": "m", "input": [{"role": "bot", "content": "x"}]}, "input[0].role", "role"),
        (
            {
                "model": "m",
                "input": [{"type": "function_call_output", "call_id": "c", "output": "o"}],
            },
            "input",
            "No tool call found",
        ),
        (
            {
                "model": "m",
                "input": [
                    {"role": "user", "content": "x"},
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                ],
            },
            "input",
            "No tool output found",
        ),
        ({"model": "m", "input": [{"type": "reasoning"}]}, "input[0].type", "reasoning"),
        ({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}, "tools[0]", "function"),
    ],
)
def test_responses_rejects_bad_body(
    model: ModelServer, http: httpx.Client, body: dict[str, Any], param: str, fragment: str
) -> None:
    resp = http.post(f"{model.openai_url}/responses", json=body)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert fragment in error["message"]


# -- injected failures ---------------------------------------------------------------------


def _call(client: openai.OpenAI, api: str, stream: bool) -> None:
    """One call to api, streamed or not, read to its end."""
    if api == "chat" and stream:
        _chat_stream(client, "REPLY: x")
    elif api == "chat":
        _chat(client, "REPLY: x")
    elif stream:
        _respond_stream(client, "REPLY: x")
    else:
        _respond(client, "REPLY: x")


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize(
    "status, exc_type, error_type",
    [
        (429, openai.RateLimitError, "requests"),
        (500, openai.InternalServerError, "server_error"),
        (503, openai.InternalServerError, "server_error"),
        (529, openai.InternalServerError, "server_error"),
        (400, openai.BadRequestError, "invalid_request_error"),
        (401, openai.AuthenticationError, "invalid_request_error"),
        (403, openai.PermissionDeniedError, "invalid_request_error"),
        (404, openai.NotFoundError, "invalid_request_error"),
        (413, openai.APIStatusError, "invalid_request_error"),
    ],
)
def test_injected_failure_raises_sdk_class(
    model: ModelServer,
    client: openai.OpenAI,
    api: str,
    stream: bool,
    status: int,
    exc_type: type[openai.APIStatusError],
    error_type: str,
) -> None:
    model.control(fail_next=1, status=status)
    with pytest.raises(exc_type) as info:
        _call(client, api, stream)
    exc = info.value
    assert type(exc) is exc_type  # not a subclass: 413 has no class of its own
    assert exc.status_code == status and exc.type == error_type
    assert exc.request_id == "req_local_1"
    assert isinstance(exc.body, dict) and "injected" in exc.body["message"].lower()
    # Before the first event, even for a stream: the error is a JSON answer.
    assert exc.response.headers["content-type"] == "application/json"
    if status == 429:
        assert exc.code == "rate_limit_exceeded"
        assert exc.response.headers["retry-after"] == "0"
        assert exc.response.headers["retry-after-ms"] == "0"
        assert not isinstance(exc, openai.InternalServerError)
    else:
        assert "retry-after" not in exc.response.headers
    _call(client, api, stream)  # the next one is answered
    assert model.stats()["failures"] == 1


def test_fail_every_counts_all_apis() -> None:
    with (
        ModelServer(fail_every=2, fail_status=503) as model,
        openai.OpenAI(api_key="local", base_url=model.openai_url, max_retries=0) as c,
        anthropic.Anthropic(api_key="local", base_url=model.url, max_retries=0) as a,
    ):
        _chat(c, "hi")
        with pytest.raises(openai.InternalServerError):
            _respond(c, "hi")
        a.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(anthropic.InternalServerError):  # ServiceUnavailableError
            a.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        assert model.stats()["failures"] == 2


def test_sdk_own_retries_absorb_injected_failure(model: ModelServer) -> None:
    # With the SDK's retries on, one 429 is invisible to the caller (but counted here);
    # retry-after 0 is not a wait the SDK honours, so it backs off ~0.5 s.
    model.control(fail_next=1, status=429)
    with openai.OpenAI(api_key="local", base_url=model.openai_url, max_retries=2) as c:
        assert _chat(c, "REPLY: ok").choices[0].message.content == "ok"
    assert model.stats()["by_api"]["chat.completions"] == {
        "requests": 2,
        "failures": 1,
        "streamed": 0,
    }


def test_timeout_and_connection_errors(model: ModelServer) -> None:
    model.control(delay_ms=300)
    with (
        openai.OpenAI(
            api_key="local", base_url=model.openai_url, max_retries=0, timeout=0.05
        ) as fast,
        pytest.raises(openai.APITimeoutError) as timeout,
    ):
        _chat(fast, "hi")
    assert isinstance(timeout.value, openai.APIConnectionError)
    url = model.openai_url
    model.stop()
    with (
        openai.OpenAI(api_key="local", base_url=url, max_retries=0) as c,
        pytest.raises(openai.APIConnectionError) as down,
    ):
        _respond(c, "hi")
    assert not isinstance(down.value, openai.APITimeoutError)


# -- rate limit ------------------------------------------------------------------------------


def test_go_durations() -> None:
    assert [_go_duration(s) for s in (0, 0.0201, 0.5, 1, 1.5, 59.9999, 360, 3725.5)] == [
        "0s",
        "21ms",
        "500ms",
        "1s",
        "1.5s",
        "1m0s",
        "6m0s",
        "1h2m5.5s",
    ]


def test_rate_limit_headers_and_429(http: httpx.Client) -> None:
    with (
        ModelServer(rpm=2) as model,
        openai.OpenAI(api_key="local", base_url=model.openai_url, max_retries=0) as c,
    ):
        first = c.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        assert first.headers["x-ratelimit-limit-requests"] == "2"
        assert first.headers["x-ratelimit-remaining-requests"] == "1"
        # 1 request of 2 a minute to come back: 30 s, as a Go duration.
        assert re.fullmatch(r"(29\.\d+|30)s", first.headers["x-ratelimit-reset-requests"])
        assert "x-ratelimit-limit-tokens" not in first.headers  # no tpm
        second = c.responses.with_raw_response.create(model="m", input="hi")
        assert second.headers["x-ratelimit-remaining-requests"] == "0"
        with pytest.raises(openai.RateLimitError) as info:
            _chat(c, "hi")
        exc = info.value
        assert exc.type == "requests" and exc.code == "rate_limit_exceeded"
        assert "requests per min (RPM): Limit 2" in exc.message
        assert exc.response.headers["retry-after"] == "30"
        assert 29_000 < int(exc.response.headers["retry-after-ms"]) <= 30_000
        assert exc.response.headers["x-ratelimit-remaining-requests"] == "0"
        stats = model.stats()
        assert stats["rate_limited"] == 1 and stats["requests"] == 3
        assert stats["by_api"]["chat.completions"]["rate_limited"] == 1
        assert stats["by_api"]["responses"]["rate_limited"] == 0
        # One bucket for every API, as one account: the Messages side is refused too.
        with (
            anthropic.Anthropic(api_key="local", base_url=model.url, max_retries=0) as a,
            pytest.raises(anthropic.RateLimitError) as refused,
        ):
            a.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        assert refused.value.response.headers["anthropic-ratelimit-requests-remaining"] == "0"


def test_token_rate_limit(http: httpx.Client) -> None:
    with ModelServer(tpm=60) as model:
        url = f"{model.openai_url}/chat/completions"
        small = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        resp = http.post(url, json=small)
        tokens = len(json.dumps(small["messages"])) // 4
        assert resp.json()["usage"]["prompt_tokens"] == tokens
        assert resp.headers["x-ratelimit-limit-tokens"] == "60"
        assert resp.headers["x-ratelimit-remaining-tokens"] == str(60 - tokens)
        assert re.fullmatch(r"\d+(\.\d+)?s", resp.headers["x-ratelimit-reset-tokens"])
        assert "x-ratelimit-limit-requests" not in resp.headers  # no rpm
        big = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}]}
        refused = http.post(url, json=big)
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert error["type"] == "tokens" and error["code"] == "rate_limit_exceeded"
        assert int(refused.headers["retry-after"]) >= 1
        assert model.stats()["rate_limited"] == 1


# -- cuts ----------------------------------------------------------------------------------


def test_chat_cut_after_drops_connection(model: ModelServer, client: openai.OpenAI) -> None:
    model.control(cut_after=2)
    got: list[str] = []
    with (
        pytest.raises(openai.APIConnectionError),
        client.chat.completions.stream(
            model="m", messages=[{"role": "user", "content": "REPLY: a b c d"}]
        ) as stream,
    ):
        got.extend(e.delta for e in stream if e.type == "content.delta" and e.delta)
    assert got == ["a", " b"]
    # One stream only: the next is whole again, on the same client.
    assert _chat_stream(client, "REPLY: a b c d")[0] == ["a", " b", " c", " d"]
    assert model.stats()["by_api"]["chat.completions"]["failures"] == 1


def test_cut_after_all_deltas_still_fails(model: ModelServer, client: openai.OpenAI) -> None:
    for call in (
        lambda: _chat_stream(client, "REPLY: a b"),
        lambda: _respond_stream(client, "REPLY: a b"),
    ):
        model.control(cut_after=10)
        with pytest.raises(openai.APIConnectionError):
            call()


def test_responses_cut_after_drops_connection(model: ModelServer, client: openai.OpenAI) -> None:
    model.control(cut_after=1)
    got: list[str] = []
    with (
        pytest.raises(openai.APIConnectionError),
        client.responses.stream(model="m", input="REPLY: a b c") as stream,
    ):
        got.extend(e.delta for e in stream if e.type == "response.output_text.delta")
    assert got == ["a"]
    assert _respond_stream(client, "REPLY: a b c")[0] == ["a", " b", " c"]


@pytest.mark.parametrize(
    "status, error_type", [(500, "server_error"), (503, "server_error"), (429, "requests")]
)
def test_cut_with_error_event(
    model: ModelServer, client: openai.OpenAI, status: int, error_type: str
) -> None:
    for api in ("chat", "responses"):
        model.control(cut_after=1, cut_status=status)
        with pytest.raises(openai.APIError) as info:
            _call(client, api, stream=True)
        # The status line said 200 before the failure came: a plain APIError, no status.
        assert type(info.value) is openai.APIError
        assert info.value.type == error_type
        assert "injected" in info.value.message
        _call(client, api, stream=True)
    assert model.stats()["failures"] == 2


def test_cut_with_error_event_on_the_wire(model: ModelServer, http: httpx.Client) -> None:
    model.control(cut_after=1, cut_status=500)
    body = {"model": "m", "stream": True, "input": "REPLY: a b"}
    events = _sse(http.post(f"{model.openai_url}/responses", json=body))
    name, data = events[-1]
    assert name == "error"
    assert json.loads(data) == {
        "type": "error",
        "error": {
            "message": "Internal server error (injected by stand-in).",
            "type": "server_error",
            "param": None,
            "code": None,
        },
        "sequence_number": len(events) - 1,
    }
    model.control(cut_after=0, cut_status=500)
    messages = [{"role": "user", "content": "REPLY: a b"}]
    body = {"model": "m", "stream": True, "messages": messages}
    events = _sse(http.post(f"{model.openai_url}/chat/completions", json=body))
    assert len(events) == 2  # the role chunk always goes out, then the error
    assert json.loads(events[1][1])["error"]["type"] == "server_error"


def test_token_ms_paces_chat_and_responses(model: ModelServer, client: openai.OpenAI) -> None:
    def timed(stream_of: Any) -> float:
        started = time.monotonic()
        stream_of()
        return time.monotonic() - started

    text = "TOKEN_MS: 40\nREPLY: one two three four five"
    assert timed(lambda: _chat_stream(client, text)) >= 0.15  # 4 pauses of 40 ms
    assert timed(lambda: _respond_stream(client, text)) >= 0.15
    model.control(token_ms=40)
    assert timed(lambda: _chat_stream(client, "REPLY: one two three four five")) >= 0.15


def test_async_client_streams(model: ModelServer) -> None:
    async def main() -> tuple[str, str, str]:
        async with openai.AsyncOpenAI(
            api_key="local", base_url=model.openai_url, max_retries=0
        ) as c:
            messages: Any = [{"role": "user", "content": "REPLY: async chat"}]
            async with c.chat.completions.stream(model="m", messages=messages) as chat:
                completion = await chat.get_final_completion()
            async with c.responses.stream(model="m", input="REPLY: async resp") as resp:
                response = await resp.get_final_response()
            created = await c.chat.completions.create(model="m", messages=messages)
            return (
                completion.choices[0].message.content or "",
                response.output_text,
                created.choices[0].message.content or "",
            )

    assert asyncio.run(main()) == ("async chat", "async resp", "async chat")


# -- counts --------------------------------------------------------------------------------


def test_stats_per_api(model: ModelServer, client: openai.OpenAI, http: httpx.Client) -> None:
    with anthropic.Anthropic(api_key="local", base_url=model.url, max_retries=0) as a:
        a.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        # Only the Messages API asked: the stats read as they always have.
        assert model.stats() == {"requests": 1, "failures": 0, "streamed": 0}
        _chat(client, "hi")
        _chat_stream(client, "hi")
        model.control(fail_next=1, status=500)
        with pytest.raises(openai.InternalServerError):
            _respond_stream(client, "hi")
        _respond(client, "hi")
    stats = model.stats()
    assert stats == {
        "requests": 5,
        "failures": 1,
        "streamed": 2,
        "by_api": {
            "messages": {"requests": 1, "failures": 0, "streamed": 0},
            "chat.completions": {"requests": 2, "failures": 0, "streamed": 1},
            "responses": {"requests": 2, "failures": 1, "streamed": 1},
        },
    }
    assert http.get(f"{model.url}/_stats").json() == stats
    assert [len(model.received(api)) for api in ("messages", "chat.completions", "responses")] == [
        1,
        2,
        2,
    ]
    assert len(model.received()) == 5
    model.control(reset=True)
    assert model.stats() == {"requests": 0, "failures": 0, "streamed": 0}


def test_unknown_routes_answer_in_the_apis_shape(model: ModelServer, http: httpx.Client) -> None:
    resp = http.get(f"{model.openai_url}/responses/resp_local_1")
    assert resp.status_code == 404 and "x-request-id" in resp.headers
    assert resp.json()["error"]["type"] == "invalid_request_error"
    resp = http.get(f"{model.url}/v1/nope")
    assert resp.status_code == 404 and resp.json()["type"] == "error"


# -- CLI -----------------------------------------------------------------------------------


@contextlib.contextmanager
def _cairn_standin(*args: str, stderr: list[str]) -> Iterator[str]:
    """`cairn standin model ARGS` in its own process: its URL while it runs; then
    SIGTERM, on which it must exit cleanly (its stderr into ``stderr``)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cairn.cli", "standin", "model", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.send_signal(signal.SIGTERM)
        stderr.append(proc.communicate(timeout=10)[1])
    assert proc.returncode == 0, stderr


def test_cli_prints_url_and_serves_both() -> None:
    stderr: list[str] = []
    with _cairn_standin("--port", "0", stderr=stderr) as url:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
        with (
            openai.OpenAI(api_key="local", base_url=f"{url}/v1", max_retries=0) as c,
            anthropic.Anthropic(api_key="local", base_url=url, max_retries=0) as a,
        ):
            assert _chat(c, "REPLY: chat").choices[0].message.content == "chat"
            assert _respond_stream(c, "REPLY: responses")[1].output_text == "responses"
            msg = a.messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "REPLY: msg"}]
            )
            assert msg.content[0].text == "msg"  # type: ignore[union-attr]
        stats = httpx.get(f"{url}/_stats", timeout=5).json()
        assert stats["by_api"]["messages"]["requests"] == 1
        assert stats["by_api"]["responses"]["streamed"] == 1
    # For a person reading along: where each SDK's base URL points.
    assert f"OPENAI_BASE_URL={url}/v1" in stderr[0]
    assert f"ANTHROPIC_BASE_URL={url}" in stderr[0]
