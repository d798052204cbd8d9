"""Tests for the loopback stand-ins: real servers, real httpx, real anthropic SDK, no mocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest

from cairn.testing.standins import MailServer, ModelServer

ROOT = Path(__file__).resolve().parent.parent


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
    assert model.stats() == {"requests": 3, "failures": 2}
    assert http.get(f"{model.url}/_stats").json() == {"requests": 3, "failures": 2}


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
    assert model.stats() == {"requests": 2, "failures": 1}


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
        assert model.stats() == {"requests": 7, "failures": 2}


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


def test_sdk_connection_error_when_down() -> None:
    model = ModelServer().start()
    url = model.url
    model.stop()
    with (
        anthropic.Anthropic(api_key="local", base_url=url, max_retries=0) as c,
        pytest.raises(anthropic.APIConnectionError),
    ):
        _ask(c, "hi")


# -- CLI ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args", [["mail", "--delay-ms", "0"], ["model", "--fail-every", "2", "--fail-status", "529"]]
)
def test_cli_prints_url_and_serves(args: list[str]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "cairn.testing.standins", *args, "--port", "0", "--quiet"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        if args[0] == "mail":
            assert httpx.get(f"{url}/v1/stats", timeout=5).json()["attempts"] == 0
        else:
            with anthropic.Anthropic(api_key="local", base_url=url, max_retries=0) as c:
                assert _ask(c, "REPLY: one").content[0].text == "one"
                with pytest.raises(anthropic.OverloadedError):
                    _ask(c, "hi")
    finally:
        proc.terminate()  # SIGTERM: the CLI must exit cleanly on it
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
