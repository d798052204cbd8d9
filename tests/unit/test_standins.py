"""Tests for the loopback stand-ins: real servers, real httpx, real anthropic SDK, no mocks."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path

import anthropic
import httpx
import httpx2
import pytest

from cairn.testing.standins import MailServer, ModelServer

ROOT = Path(__file__).resolve().parents[2]


# `mail` and `model` (fresh servers per test) come from conftest.py.
@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as client:
        yield client


@pytest.fixture
def client(model: ModelServer) -> Iterator[anthropic.Anthropic]:
    # max_retries=0: cairn owns retrying, and the tests must see every failure.
    with anthropic.Anthropic(api_key="local", base_url=model.url, max_retries=0) as c:
        yield c


def _send(
    http: httpx.Client, mail: MailServer, ref: str = "run-1", key: str | None = None, **body: object
) -> httpx.Response:
    payload = {"to": "a@example.com", "subject": "hi", "body": "hello", "ref": ref, **body}
    headers = {"Idempotency-Key": key} if key else {}
    return http.post(f"{mail.url}/v1/send", json=payload, headers=headers)


def _ask(client: anthropic.Anthropic, text: object, **kw: object) -> anthropic.types.Message:
    return client.messages.create(
        model="claude-local", max_tokens=64, messages=[{"role": "user", "content": text}], **kw
    )


# -- lifecycle ----------------------------------------------------------------------------


def test_url_requires_start_and_restart_keeps_port() -> None:
    server = MailServer()
    with pytest.raises(RuntimeError):
        _ = server.url
    server.start()
    url = server.url
    assert url.startswith("http://127.0.0.1:")
    server.stop()
    server.stop()  # idempotent
    with httpx.Client(timeout=2) as http, pytest.raises(httpx.ConnectError):
        http.get(f"{url}/v1/stats")
    # A simulated outage: same URL afterwards, state kept.
    server.start()
    try:
        assert server.url == url
        assert httpx.get(f"{url}/v1/stats").json()["attempts"] == 0
    finally:
        server.stop()


# -- mail ---------------------------------------------------------------------------------


def test_mail_dedupes_on_idempotency_key(mail: MailServer, http: httpx.Client) -> None:
    first = _send(http, mail, key="run-1:notify")
    second = _send(http, mail, key="run-1:notify")
    assert first.status_code == second.status_code == 200
    assert first.json() == {"id": "msg_1", "deduplicated": False}
    assert second.json() == {"id": "msg_1", "deduplicated": True}
    assert mail.stats() == {
        "attempts": 2,
        "deliveries": 1,
        "deduplicated": 1,
        "duplicate_deliveries": 0,
        "by_ref": {"run-1": 1},
    }


def test_mail_without_key_counts_duplicates_per_ref(mail: MailServer, http: httpx.Client) -> None:
    for _ in range(3):
        assert _send(http, mail, ref="run-a").json()["deduplicated"] is False
    _send(http, mail, ref="run-b")
    _send(http, mail, ref="run-c", key="k-c")
    _send(http, mail, ref="run-c", key="k-c")
    stats = http.get(f"{mail.url}/v1/stats").json()
    assert stats == mail.stats()
    assert stats["attempts"] == 6
    assert stats["deliveries"] == 5
    assert stats["deduplicated"] == 1
    assert stats["by_ref"] == {"run-a": 3, "run-b": 1, "run-c": 1}
    assert stats["duplicate_deliveries"] == 2
    assert [m["id"] for m in mail.messages()] == [f"msg_{i}" for i in range(1, 6)]


def test_mail_reset(mail: MailServer, http: httpx.Client) -> None:
    _send(http, mail, key="k")
    assert http.post(f"{mail.url}/v1/reset").status_code == 200
    assert mail.stats() == {
        "attempts": 0,
        "deliveries": 0,
        "deduplicated": 0,
        "duplicate_deliveries": 0,
        "by_ref": {},
    }
    # The key is forgotten too, so the same key delivers again.
    assert _send(http, mail, key="k").json() == {"id": "msg_1", "deduplicated": False}


@pytest.mark.parametrize(
    "content", [b"{not json", b"[1, 2]", b'{"subject": "no to"}', b'{"to": ""}', b""]
)
def test_mail_rejects_malformed(mail: MailServer, http: httpx.Client, content: bytes) -> None:
    resp = http.post(
        f"{mail.url}/v1/send", content=content, headers={"Content-Type": "application/json"}
    )
    assert resp.status_code == 400
    assert "message" in resp.json()["error"]
    stats = mail.stats()
    assert stats["attempts"] == 1 and stats["deliveries"] == 0


def test_mail_unknown_route_is_404_json(mail: MailServer, http: httpx.Client) -> None:
    resp = http.get(f"{mail.url}/v1/nope")
    assert resp.status_code == 404
    assert resp.json()["error"]["type"] == "not_found"


def test_mail_concurrent_same_key_delivers_once(mail: MailServer) -> None:
    mail.delay_ms = 50  # overlap the requests
    results: list[dict[str, object]] = []

    def post() -> None:
        with httpx.Client(timeout=10) as http:
            results.append(_send(http, mail, key="same").json())

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {r["id"] for r in results} == {"msg_1"}
    assert sum(1 for r in results if not r["deduplicated"]) == 1
    assert mail.stats()["deliveries"] == 1 and mail.stats()["attempts"] == 8


def test_mail_delay_records_delivery_before_answering() -> None:
    # The crash window cairn cares about: delivered, but the sender times out / dies.
    with MailServer(delay_ms=500) as mail, httpx.Client(timeout=0.1) as http:
        with pytest.raises(httpx.ReadTimeout):
            _send(http, mail, key="k")
        assert mail.stats()["deliveries"] == 1
        mail.delay_ms = 0
        assert _send(http, mail, key="k").json()["deduplicated"] is True
        assert mail.stats()["duplicate_deliveries"] == 0


# -- model: replies -------------------------------------------------------------------------


def test_model_reply_rules(client: anthropic.Anthropic) -> None:
    def text(prompt: object) -> str:
        block = _ask(client, prompt).content[0]
        assert block.type == "text"
        return block.text

    assert text('Do a thing.\nREPLY: {"plan": [1, 2]}\nthanks') == '{"plan": [1, 2]}'
    assert text("VALIDATE this: looks fine") == "VALID"
    assert text("VALIDATE this, expected verdict INVALID") == "INVALID"
    long = "SUMMARIZE " + "x" * 500
    assert text(long) == "Summary: " + long[:300]
    assert text("hello " * 30) == "ack: " + ("hello " * 30)[:80]
    # REPLY wins over the keywords; list-of-blocks content is read too.
    blocks = [{"type": "text", "text": "VALIDATE"}, {"type": "text", "text": "REPLY: done"}]
    assert text(blocks) == "done"


def test_model_uses_last_user_message(client: anthropic.Anthropic) -> None:
    msg = client.messages.create(
        model="claude-local",
        max_tokens=64,
        system="You are terse.",
        messages=[
            {"role": "user", "content": "REPLY: first"},
            {"role": "assistant", "content": "first"},
            {"role": "user", "content": [{"type": "text", "text": "REPLY: second"}]},
        ],
    )
    assert msg.content[0].text == "second"


def test_model_response_shape_and_usage(model: ModelServer, client: anthropic.Anthropic) -> None:
    messages = [{"role": "user", "content": "REPLY: abcdefgh"}]
    msg = client.messages.create(model="claude-x", max_tokens=64, system="sys", messages=messages)  # type: ignore[arg-type]
    assert msg.id == "msg_local_1"
    assert msg.type == "message" and msg.role == "assistant" and msg.model == "claude-x"
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    assert msg._request_id == "req_local_1"
    prompt_len = len(json.dumps({"system": "sys", "messages": messages}))
    assert msg.usage.input_tokens == max(1, prompt_len // 4)
    assert msg.usage.output_tokens == 2
    assert msg.usage.cache_creation_input_tokens == 0
    assert msg.usage.cache_read_input_tokens == 0
    assert model.received()[0]["system"] == "sys"
    # Tiny replies still report at least one output token.
    assert _ask(client, "REPLY: a").usage.output_tokens == 1


def test_model_is_deterministic(client: anthropic.Anthropic) -> None:
    a = _ask(client, "SUMMARIZE the run")
    b = _ask(client, "SUMMARIZE the run")
    assert a.content[0].text == b.content[0].text
    assert a.usage == b.usage
    assert a.id != b.id


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "bot", "content": "x"}]}, "role"),
    ],
)
def test_model_rejects_bad_body(
    model: ModelServer, http: httpx.Client, body: dict[str, object], fragment: str
) -> None:
    resp = http.post(f"{model.url}/v1/messages", json=body)
    assert resp.status_code == 400
    assert resp.headers["request-id"].startswith("req_local_")
    err = resp.json()
    assert err["type"] == "error"
    assert err["error"]["type"] == "invalid_request_error"
    assert fragment in err["error"]["message"]


def test_model_bad_body_raises_bad_request_in_sdk(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="m", max_tokens=5, messages=[])
    assert info.value.type == "invalid_request_error"


def test_model_malformed_json(model: ModelServer, http: httpx.Client) -> None:
    resp = http.post(
        f"{model.url}/v1/messages", content=b"{oops", headers={"Content-Type": "application/json"}
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "invalid_request_error"


# -- model: failure injection ---------------------------------------------------------------


def test_sdk_raises_rate_limit_then_succeeds(
    model: ModelServer, http: httpx.Client, client: anthropic.Anthropic
) -> None:
    assert (
        http.post(f"{model.url}/_control", json={"fail_next": 2, "status": 429}).status_code == 200
    )
    for _ in range(2):
        with pytest.raises(anthropic.RateLimitError) as info:
            _ask(client, "hi")
        exc = info.value
        assert exc.status_code == 429
        assert exc.type == "rate_limit_error"
        assert exc.request_id is not None and exc.request_id.startswith("req_local_")
        assert exc.response.headers.get("retry-after") == "0"
        assert not isinstance(exc, anthropic.InternalServerError)
    assert _ask(client, "REPLY: ok").content[0].text == "ok"
    assert model.stats() == {"requests": 3, "failures": 2, "streamed": 0}
    assert http.get(f"{model.url}/_stats").json() == {"requests": 3, "failures": 2, "streamed": 0}


def test_sdk_raises_overloaded_then_succeeds(
    model: ModelServer, client: anthropic.Anthropic
) -> None:
    model.control(fail_next=1, status=529)
    with pytest.raises(anthropic.OverloadedError) as info:
        _ask(client, "hi")
    assert isinstance(info.value, anthropic.InternalServerError)
    assert info.value.status_code == 529 and info.value.type == "overloaded_error"
    assert "retry-after" not in info.value.response.headers
    assert _ask(client, "REPLY: ok").content[0].text == "ok"


def test_sdk_raises_internal_server_error_on_500(
    model: ModelServer, client: anthropic.Anthropic
) -> None:
    model.control(fail_next=1, status=500)
    with pytest.raises(anthropic.InternalServerError) as info:
        _ask(client, "hi")
    assert not isinstance(info.value, anthropic.OverloadedError)
    assert info.value.status_code == 500 and info.value.type == "api_error"
    assert _ask(client, "REPLY: ok").content[0].text == "ok"


def test_sdk_own_retries_absorb_injected_failure(model: ModelServer) -> None:
    # With SDK retries on, a single 429 is invisible to the caller (but counted here).
    model.control(fail_next=1, status=429)
    with anthropic.Anthropic(api_key="local", base_url=model.url, max_retries=2) as c:
        assert _ask(c, "REPLY: ok").content[0].text == "ok"
    assert model.stats() == {"requests": 2, "failures": 1, "streamed": 0}


@pytest.mark.parametrize(
    "status, exc_type", [(429, anthropic.RateLimitError), (529, anthropic.OverloadedError)]
)
def test_fail_every_nth(status: int, exc_type: type[Exception]) -> None:
    with (
        ModelServer(fail_every=3, fail_status=status) as model,
        anthropic.Anthropic(api_key="local", base_url=model.url, max_retries=0) as c,
    ):
        outcomes = []
        for _ in range(7):
            try:
                _ask(c, "hi")
                outcomes.append("ok")
            except exc_type:
                outcomes.append("fail")
        assert outcomes == ["ok", "ok", "fail", "ok", "ok", "fail", "ok"]
        assert model.stats() == {"requests": 7, "failures": 2, "streamed": 0}


def test_control_rejects_bad_input(model: ModelServer, http: httpx.Client) -> None:
    assert (
        http.post(f"{model.url}/_control", json={"fail_next": 1, "status": 418}).status_code == 400
    )
    assert http.post(f"{model.url}/_control", json={"bogus": 1}).status_code == 400
    assert http.post(f"{model.url}/_control", content=b"nope").status_code == 400
    with pytest.raises(ValueError):
        ModelServer(fail_status=200)


def test_model_delay(model: ModelServer, client: anthropic.Anthropic) -> None:
    model.control(delay_ms=200)
    started = time.monotonic()
    _ask(client, "hi")
    assert time.monotonic() - started >= 0.2
    with (
        anthropic.Anthropic(
            api_key="local", base_url=model.url, max_retries=0, timeout=0.05
        ) as fast,
        pytest.raises(anthropic.APITimeoutError),
    ):
        _ask(fast, "hi")


def test_a_request_sleeps_the_delay_set_when_it_came(
    model: ModelServer, client: anthropic.Anthropic
) -> None:
    """A test holds one request in flight and lets the next answer at once (the tests that
    cut a model request with a steer message do)."""
    model.control(delay_ms=600)
    took: list[float] = []

    def slow() -> None:
        started = time.monotonic()
        _ask(client, "the slow one")
        took.append(time.monotonic() - started)

    first = threading.Thread(target=slow)
    first.start()
    deadline = time.monotonic() + 5
    while model.stats()["requests"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    model.control(delay_ms=0)
    started = time.monotonic()
    _ask(client, "the quick one")
    assert time.monotonic() - started < 0.5
    first.join()
    assert took[0] >= 0.6


def test_sdk_connection_error_when_down() -> None:
    model = ModelServer().start()
    url = model.url
    model.stop()
    with (
        anthropic.Anthropic(api_key="local", base_url=url, max_retries=0) as c,
        pytest.raises(anthropic.APIConnectionError),
    ):
        _ask(c, "hi")


# -- model: streaming -----------------------------------------------------------------------


def _stream(
    client: anthropic.Anthropic, text: object, **kw: object
) -> tuple[list[str], anthropic.types.Message]:
    """The text deltas of a streamed answer, and the message the SDK assembled from it."""
    with client.messages.stream(
        model="claude-local", max_tokens=64, messages=[{"role": "user", "content": text}], **kw
    ) as stream:
        deltas = list(stream.text_stream)
        return deltas, stream.get_final_message()


def _blocks(message: anthropic.types.Message) -> list[dict[str, object]]:
    # The stream's blocks are the SDK's Parsed* subclasses, unequal to create's by type.
    return [b.model_dump() for b in message.content]


def _collect(client: anthropic.Anthropic, text: str, into: list[str]) -> None:
    """Stream an answer's text deltas into a list that keeps them when the stream breaks."""
    with client.messages.stream(
        model="claude-local", max_tokens=64, messages=[{"role": "user", "content": text}]
    ) as stream:
        into.extend(stream.text_stream)


def _timed_deltas(client: anthropic.Anthropic, text: str) -> list[float]:
    """When each text delta arrived, in seconds after the request was sent. (From the
    request, not from the first delta: a client the machine schedules late reads several
    deltas at once, but none of them can come before the server's pacing lets it.)"""
    started = time.monotonic()
    with client.messages.stream(
        model="claude-local", max_tokens=64, messages=[{"role": "user", "content": text}]
    ) as stream:
        return [time.monotonic() - started for _ in stream.text_stream]


def _raw_events(resp: httpx.Response) -> list[tuple[str, dict[str, object]]]:
    """(event, data) pairs of an SSE body, read by hand rather than by the SDK."""
    events = []
    for block in resp.text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def test_stream_equals_create(model: ModelServer, client: anthropic.Anthropic) -> None:
    deltas, streamed = _stream(client, "REPLY: Hello big  wide world")
    created = _ask(client, "REPLY: Hello big  wide world")
    assert deltas == ["Hello", " big", "  wide", " world"]
    assert "".join(deltas) == created.content[0].text
    assert _blocks(streamed) == _blocks(created)
    assert streamed.usage == created.usage and streamed.usage.output_tokens > 1
    assert streamed.stop_reason == created.stop_reason == "end_turn"
    assert streamed.model == "claude-local" and streamed.id == "msg_local_1"
    assert model.stats() == {"requests": 2, "failures": 0, "streamed": 1}


@pytest.mark.parametrize(
    "prompt",
    [
        "REPLY:  two  leading, trailing  ",
        "SUMMARIZE this\n\n  indented line\ttab\n",
        "REPLY: one",
        "REPLY: ",
    ],
)
def test_stream_tokens_concatenate_to_reply(client: anthropic.Anthropic, prompt: str) -> None:
    deltas, streamed = _stream(client, prompt)
    text = _ask(client, prompt).content[0].text
    assert "".join(deltas) == streamed.content[0].text == text
    assert all(d.strip() for d in deltas)  # no whitespace-only tokens
    assert len(deltas) == len(text.split())


def test_stream_wire_format(model: ModelServer, http: httpx.Client) -> None:
    body = {
        "model": "m",
        "max_tokens": 9,
        "stream": True,
        "messages": [{"role": "user", "content": "REPLY: a b"}],
    }
    resp = http.post(f"{model.url}/v1/messages", json=body)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream"
    assert resp.headers["transfer-encoding"] == "chunked"
    assert resp.headers["request-id"] == "req_local_1"
    events = _raw_events(resp)
    assert all(data["type"] == name for name, data in events)
    assert [name for name, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None  # type: ignore[index]
    assert start["usage"]["input_tokens"] > 1  # type: ignore[index]
    assert events[2][1]["content_block"] == {"type": "text", "text": ""}
    assert [e[1]["delta"] for e in events[3:5]] == [
        {"type": "text_delta", "text": "a"},
        {"type": "text_delta", "text": " b"},
    ]
    assert events[6][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}


def test_stream_rejects_non_boolean_stream(model: ModelServer, http: httpx.Client) -> None:
    body = {
        "model": "m",
        "max_tokens": 9,
        "stream": "yes",
        "messages": [{"role": "user", "content": "x"}],
    }
    resp = http.post(f"{model.url}/v1/messages", json=body)
    assert resp.status_code == 400
    assert "stream" in resp.json()["error"]["message"]


def test_stream_tool_use(
    model: ModelServer, client: anthropic.Anthropic, http: httpx.Client
) -> None:
    tools = [
        {
            "name": "lookup",
            "description": "Look a city up.",
            "input_schema": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
            },
        }
    ]
    prompt = "TOOLS: lookup\nWhat is the weather?"
    deltas, streamed = _stream(client, prompt, tools=tools)
    created = _ask(client, prompt, tools=tools)
    assert deltas == []
    assert _blocks(streamed) == _blocks(created)
    block = streamed.content[0]
    assert block.type == "tool_use" and block.name == "lookup"
    assert block.input == {"city": "lookup 0", "days": 0}
    assert streamed.stop_reason == "tool_use" and streamed.usage == created.usage
    # On the wire: the block opens with an empty input, then its JSON comes in pieces.
    body = {
        "model": "m",
        "max_tokens": 9,
        "stream": True,
        "tools": tools,
        "messages": [{"role": "user", "content": prompt}],
    }
    events = _raw_events(http.post(f"{model.url}/v1/messages", json=body))
    assert events[2][1]["content_block"]["input"] == {}  # type: ignore[index]
    pieces = [d["delta"]["partial_json"] for n, d in events if n == "content_block_delta"]  # type: ignore[index]
    assert len(pieces) > 2
    assert json.loads("".join(pieces)) == block.input


def test_stream_token_ms_paces_text(model: ModelServer, client: anthropic.Anthropic) -> None:
    model.control(token_ms=40)
    tries = [_timed_deltas(client, "REPLY: one two three four five") for _ in range(3)]
    assert all(len(a) == 5 and a[-1] >= 0.15 for a in tries)  # 4 pauses of 40 ms at least
    # The first token arrived as it was written, not with the last at the end (in one try
    # of three at least: a client the machine schedules late reads several at once).
    assert max(a[-1] - a[0] for a in tries) >= 0.1
    model.control(token_ms=0)
    assert _timed_deltas(client, "REPLY: one two three four five")[-1] < 0.15


def test_stream_token_ms_line_overrides(model: ModelServer, client: anthropic.Anthropic) -> None:
    arrived = _timed_deltas(client, "TOKEN_MS: 40\nREPLY: one two three four five")
    assert len(arrived) == 5 and arrived[-1] >= 0.15
    model.control(token_ms=1000)
    arrived = _timed_deltas(client, "TOKEN_MS: 0\nREPLY: one two three four five")
    assert arrived[-1] < 0.5


def test_stream_delay_ms_before_first_event(
    model: ModelServer, client: anthropic.Anthropic
) -> None:
    model.control(delay_ms=200)
    started = time.monotonic()
    deltas, _ = _stream(client, "REPLY: ok")
    assert deltas == ["ok"] and time.monotonic() - started >= 0.2


def test_stream_injected_overload(model: ModelServer, client: anthropic.Anthropic) -> None:
    model.control(fail_next=1, status=529)
    with pytest.raises(anthropic.OverloadedError) as info:
        _stream(client, "REPLY: never")
    assert info.value.status_code == 529 and info.value.type == "overloaded_error"
    assert info.value.response.headers["content-type"] == "application/json"
    assert _stream(client, "REPLY: ok")[0] == ["ok"]
    assert model.stats() == {"requests": 2, "failures": 1, "streamed": 2}


def test_stream_fail_every_counts_streams() -> None:
    with (
        ModelServer(fail_every=2, fail_status=429) as model,
        anthropic.Anthropic(api_key="local", base_url=model.url, max_retries=0) as c,
    ):
        _stream(c, "hi")
        with pytest.raises(anthropic.RateLimitError):
            _stream(c, "hi")
        _ask(c, "hi")
        assert model.stats() == {"requests": 3, "failures": 1, "streamed": 2}


def test_stream_keeps_connection(model: ModelServer, client: anthropic.Anthropic) -> None:
    # Two streams in a row on one SDK client, then a plain call.
    assert _stream(client, "REPLY: first one")[0] == ["first", " one"]
    assert _stream(client, "REPLY: second one")[0] == ["second", " one"]
    assert _ask(client, "REPLY: third").content[0].text == "third"
    # And on one socket: the chunked answer ends cleanly, so the server keeps it open.
    conn = HTTPConnection("127.0.0.1", model.port, timeout=5)
    try:
        socks = []
        for word in ("one", "two"):
            body = {
                "model": "m",
                "max_tokens": 9,
                "stream": True,
                "messages": [{"role": "user", "content": f"REPLY: {word}"}],
            }
            conn.request("POST", "/v1/messages", body=json.dumps(body))
            socks.append(conn.sock)
            resp = conn.getresponse()
            assert resp.status == 200 and not resp.will_close
            assert resp.read().rstrip().endswith(b'data: {"type": "message_stop"}')
        assert socks[0] is socks[1] is not None
    finally:
        conn.close()


# A body cut mid-stream: SDK 2.16 lets the transport's error through, 2.17 wraps it as
# APIConnectionError (ModelClient.stream retries either).
CUT = (httpx2.RemoteProtocolError, anthropic.APIConnectionError)


def test_stream_cut_after_drops_connection(model: ModelServer, client: anthropic.Anthropic) -> None:
    model.control(cut_after=2)
    got: list[str] = []
    with pytest.raises(CUT):
        _collect(client, "REPLY: a b c d", got)
    assert got == ["a", " b"]
    # One stream only: the next is whole again, on the same client.
    assert _stream(client, "REPLY: a b c d")[0] == ["a", " b", " c", " d"]
    assert model.stats() == {"requests": 2, "failures": 1, "streamed": 2}


def test_stream_cut_after_all_deltas_still_fails(
    model: ModelServer, client: anthropic.Anthropic
) -> None:
    model.control(cut_after=10)
    got: list[str] = []
    with pytest.raises(CUT):
        _collect(client, "REPLY: a b", got)
    assert got == ["a", " b"]


def test_stream_cut_with_error_event(model: ModelServer, client: anthropic.Anthropic) -> None:
    model.control(cut_after=1, cut_status=529)
    got: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as info:
        _collect(client, "REPLY: a b", got)
    assert got == ["a"]
    # The headers said 200 before the overload came, so the SDK can't pick a status class.
    assert info.value.status_code == 200 and info.value.type == "overloaded_error"
    assert not isinstance(info.value, anthropic.InternalServerError)
    assert _stream(client, "REPLY: a b")[0] == ["a", " b"]


def test_control_streaming_fields(model: ModelServer, http: httpx.Client) -> None:
    state = http.post(
        f"{model.url}/_control", json={"token_ms": 5, "cut_after": 3, "cut_status": 500}
    ).json()
    assert state["token_ms"] == 5 and state["cut_after"] == 3 and state["cut_status"] == 500
    assert model.token_ms == 5
    for bad in ({"cut_after": "x"}, {"cut_after": True}, {"cut_after": 1, "cut_status": 418}):
        assert http.post(f"{model.url}/_control", json=bad).status_code == 400
    state = http.post(f"{model.url}/_control", json={"reset": True}).json()
    assert state["cut_after"] is None and state["cut_status"] is None
    assert ModelServer(token_ms=7).token_ms == 7


def test_queued_failures_carry_the_retry_after_asked(
    model: ModelServer, http: httpx.Client
) -> None:
    """fail_next with retry_after: each of those failures says it, whatever its status (a
    503's Retry-After, a 429's longer than the default 0); the next ones say the default."""
    ask = {
        "model": "claude-haiku-4-5",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
    }
    state = http.post(
        f"{model.url}/_control", json={"fail_next": 2, "status": 503, "retry_after": 2.5}
    ).json()
    assert state["retry_after"] == 2.5
    for _ in range(2):
        answer = http.post(f"{model.url}/v1/messages", json=ask)
        assert answer.status_code == 503
        assert answer.headers["retry-after"] == "2.5" and answer.headers["retry-after-ms"] == "2500"
    assert http.post(f"{model.url}/v1/messages", json=ask).status_code == 200
    model.control(fail_next=1, status=429)  # without it: a 429's retry-after of 0
    assert http.post(f"{model.url}/v1/messages", json=ask).headers["retry-after"] == "0"
    for bad in ({"retry_after": -1}, {"retry_after": "soon"}, {"retry_after": True}):
        assert http.post(f"{model.url}/_control", json=bad).status_code == 400


# -- CLI ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _cli(*args: str) -> Iterator[str]:
    """`python -m cairn.testing.standins ARGS` in its own process: its URL while it runs;
    then SIGTERM, on which the CLI must exit cleanly."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cairn.testing.standins", *args, "--quiet"],
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
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err


@pytest.mark.parametrize(
    "args", [["mail", "--delay-ms", "0"], ["model", "--fail-every", "2", "--fail-status", "529"]]
)
def test_cli_prints_url_and_serves(args: list[str]) -> None:
    with _cli(*args, "--port", "0") as url:
        assert url.startswith("http://127.0.0.1:")
        if args[0] == "mail":
            assert httpx.get(f"{url}/v1/stats", timeout=5).json()["attempts"] == 0
        else:
            with anthropic.Anthropic(api_key="local", base_url=url, max_retries=0) as c:
                assert _ask(c, "REPLY: one").content[0].text == "one"
                with pytest.raises(anthropic.OverloadedError):
                    _ask(c, "hi")


def test_cli_token_ms_paces_streams() -> None:
    with (
        _cli("model", "--token-ms", "40") as url,
        anthropic.Anthropic(api_key="local", base_url=url, max_retries=0) as c,
    ):
        arrived = _timed_deltas(c, "REPLY: one two three four five")
    assert len(arrived) == 5 and arrived[-1] >= 0.15
