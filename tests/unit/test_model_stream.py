"""ModelClient.stream: the real SDK streaming from the Messages API stand-in, no mocks."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx2
import pytest
from anthropic.types import Message

from cairn.core.errors import ModelUnavailable
from cairn.steps.model import ModelClient, cost_of, text_of
from cairn.testing.standins import ModelServer

ASK = [{"role": "user", "content": "REPLY: The quick brown fox jumps over the dog."}]


@pytest.fixture
def client(model: ModelServer) -> Iterator[ModelClient]:
    c = ModelClient(base_url=model.url, give_up_after=10.0)
    yield c
    c.close()


class Screen:
    """What a consumer of the stream shows: text appended per delta, dropped on restart."""

    def __init__(self) -> None:
        self.text = ""
        self.calls: list[str | None] = []  # the deltas in order, None for a restart

    def on_text(self, delta: str) -> None:
        self.text += delta
        self.calls.append(delta)

    def on_restart(self) -> None:
        self.text = ""
        self.calls.append(None)


def test_stream_text_and_cost_match_create(client: ModelClient) -> None:
    screen = Screen()
    message, cost = client.stream(screen.on_text, screen.on_restart, messages=ASK)
    assert type(message) is Message  # not the stream's ParsedMessage
    assert len(screen.calls) > 1 and None not in screen.calls
    assert screen.text == text_of(message) == "The quick brown fox jumps over the dog."
    assert cost == cost_of(message.model, message.usage) > 0
    created, created_cost = client.create(messages=ASK)
    assert cost == created_cost
    assert message.content == created.content and message.usage == created.usage
    assert message.stop_reason == created.stop_reason == "end_turn"
    assert message.model == client.default_model
    # It journals and comes back as create()'s message does.
    assert ModelClient.decode(ModelClient.encode(message)) == message


def test_stream_tool_use_has_no_text(client: ModelClient) -> None:
    tools = [
        {
            "name": "lookup",
            "description": "Look a city up.",
            "input_schema": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ]
    prompt = [{"role": "user", "content": "TOOLS: lookup\nweather?"}]
    screen = Screen()
    message, _ = client.stream(screen.on_text, messages=prompt, tools=tools)
    assert screen.calls == []
    assert message.stop_reason == "tool_use"
    assert message.content == client.create(messages=prompt, tools=tools)[0].content


def test_stream_retries_an_injected_overload(model: ModelServer, client: ModelClient) -> None:
    model.control(fail_next=1, status=529)
    screen = Screen()
    message, _ = client.stream(screen.on_text, screen.on_restart, messages=ASK)
    # The failure came before any delta, so there was nothing to take back.
    assert None not in screen.calls
    assert screen.text == text_of(message)
    assert model.stats() == {"requests": 2, "failures": 1, "streamed": 2}


def test_stream_restarts_after_a_dropped_connection(
    model: ModelServer, client: ModelClient
) -> None:
    model.control(cut_after=3)
    screen = Screen()
    message, cost = client.stream(screen.on_text, screen.on_restart, messages=ASK)
    assert screen.calls[:4] == ["The", " quick", " brown", None]
    assert screen.calls.count(None) == 1
    assert screen.text == text_of(message) == "The quick brown fox jumps over the dog."
    assert cost == cost_of(message.model, message.usage)
    assert model.stats() == {"requests": 2, "failures": 1, "streamed": 2}


def test_stream_retries_an_overload_reported_mid_stream(
    model: ModelServer, client: ModelClient
) -> None:
    model.control(cut_after=2, cut_status=529)
    screen = Screen()
    message, _ = client.stream(screen.on_text, screen.on_restart, messages=ASK)
    assert screen.calls[:3] == ["The", " quick", None]
    assert screen.text == text_of(message)
    assert model.stats()["requests"] == 2


def test_stream_restart_without_on_restart(model: ModelServer, client: ModelClient) -> None:
    model.control(cut_after=1)
    deltas: list[str] = []
    message, _ = client.stream(deltas.append, messages=ASK)
    assert deltas[0] == "The" and "".join(deltas[1:]) == text_of(message)


class Stop(Exception):
    """The caller's own reason to stop, e.g. its run was taken over."""


@pytest.mark.parametrize(
    "error",
    [
        Stop("taken over"),
        # Even an error the retry policy would retry, had the API raised it.
        anthropic.APIConnectionError(request=httpx2.Request("POST", "http://x")),
    ],
)
def test_on_text_exception_propagates_unretried(
    model: ModelServer, client: ModelClient, error: Exception
) -> None:
    seen: list[str] = []

    def on_text(delta: str) -> None:
        seen.append(delta)
        if len(seen) == 2:
            raise error

    with pytest.raises(type(error)) as info:
        client.stream(on_text, messages=ASK)
    assert info.value is error
    assert seen == ["The", " quick"]
    assert model.stats()["requests"] == 1


def test_on_restart_exception_propagates(model: ModelServer, client: ModelClient) -> None:
    model.control(cut_after=1)

    def on_restart() -> None:
        raise Stop("no restarts here")

    with pytest.raises(Stop):
        client.stream(lambda _: None, on_restart, messages=ASK)
    assert model.stats()["requests"] == 2


def test_stream_gives_up_as_model_unavailable(model: ModelServer) -> None:
    model.control(fail_every=1, fail_status=429)  # retry-after 0: retried at once
    c = ModelClient(base_url=model.url, give_up_after=1.0)
    try:
        with pytest.raises(ModelUnavailable) as info:
            c.stream(lambda _: None, messages=ASK)
    finally:
        c.close()
    assert isinstance(info.value.__cause__, anthropic.RateLimitError)
    assert model.stats()["requests"] > 1


def test_stream_stalled_mid_answer_is_a_timeout(model: ModelServer) -> None:
    # Tokens slower than the read timeout: the stream breaks after the headers came.
    model.control(token_ms=500)
    c = ModelClient(base_url=model.url, give_up_after=0.3, timeout=0.2)
    screen = Screen()
    try:
        with pytest.raises(ModelUnavailable) as info:
            c.stream(screen.on_text, screen.on_restart, messages=ASK)
    finally:
        c.close()
    assert isinstance(info.value.__cause__, anthropic.APITimeoutError)
    assert screen.calls[0] == "The"
