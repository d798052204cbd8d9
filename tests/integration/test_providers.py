"""One model call, several providers: ctx.model through the real anthropic and openai SDKs
to the local stand-in's Messages, Chat Completions and Responses APIs, on real Postgres
and Redis, each run driven in this process. The stand-in itself:
tests/integration/test_standins_openai.py; a fleet of workers under one limit:
tests/fleet/test_ratelimit.py."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest
import redis as redis_lib
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import cairn
from cairn import otel
from cairn.client.client import Client
from cairn.core.errors import ModelUnavailable, RetryLater
from cairn.core.settings import Settings
from cairn.steps import Context, StepResult, workflow
from cairn.steps.model import PRICES, ModelClient, RateLimited, UnknownModel, cost_of, set_price
from cairn.steps.prices import Prices
from cairn.store import Leases, PgStore
from cairn.store.events import RedisEvents
from cairn.store.ratelimit import Limit, RateLimiter, account, key
from cairn.testing.standins import ModelServer
from cairn.workers import loop
from cairn.workers.middleware import Chain
from cairn.workers.outbox import Outbox

# What a call to each API names: its model and (OpenAI's Responses) its api; the prompt
# goes in as messages= or input= (_request).
APIS: dict[str, dict[str, Any]] = {
    "anthropic": {"model": "claude-haiku-4-5", "max_tokens": 64},
    "chat": {"model": "gpt-4o-mini"},
    "responses": {"model": "gpt-4o-mini", "api": "responses"},
}
PROVIDER = {"anthropic": "anthropic", "chat": "openai", "responses": "openai"}
SDK_TYPE = {"anthropic": "Message", "chat": "ChatCompletion", "responses": "Response"}
TOOLS = {
    "anthropic": {"name": "lookup", "input_schema": "schema"},
    "chat": {"type": "function", "function": {"name": "lookup", "parameters": "schema"}},
    "responses": {"type": "function", "name": "lookup", "parameters": "schema"},
}
SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
each_api = pytest.mark.parametrize("api", list(APIS))


def _request(api: str, prompt: str, **more: Any) -> dict[str, Any]:
    """ctx.model's arguments for api with prompt as the user's message."""
    said: dict[str, Any] = (
        {"input": prompt}
        if api == "responses"
        else {"messages": [{"role": "user", "content": prompt}]}
    )
    return {**APIS[api], **said, **more}


def _tools(api: str) -> list[dict[str, Any]]:
    tool = json.loads(json.dumps(TOOLS[api]).replace('"schema"', json.dumps(SCHEMA)))
    return [tool]


# -- the workflows -------------------------------------------------------------------------
# The step asks once, with ctx.input["request"] as its arguments; SEEN[run_id] gets each
# answer's SDK type, replayed or not; a run in CRASH dies once after its answer was journaled.
SEEN: dict[str, list[str]] = {}
CRASH: set[str] = set()


class Crash(BaseException):
    """The worker gone mid-step, after the call's journal row and before the step's save."""


def _after(ctx: Context, reply: Any) -> StepResult:
    SEEN.setdefault(ctx.run_id, []).append(type(reply).__name__)
    if ctx.run_id in CRASH:
        CRASH.discard(ctx.run_id)
        raise Crash
    return StepResult(cursor=cairn.DONE, state={"text": cairn.text_of(reply)})


ask_flow = workflow("providers_ask")


@ask_flow.step()
def ask(ctx: Context) -> StepResult:
    return _after(ctx, ctx.model(**ctx.input["request"]))


async_flow = workflow("providers_ask_async")


@async_flow.step("ask")
async def ask_async(ctx: Context) -> StepResult:
    return _after(ctx, await ctx.amodel(**ctx.input["request"]))


# -- fixtures ------------------------------------------------------------------------------
@pytest.fixture
def r(redis_url: str) -> Iterator[redis_lib.Redis]:
    client = redis_lib.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def clients(model: ModelServer) -> Iterator[Callable[..., ModelClient]]:
    """make(**options): a ModelClient on the stand-in's APIs, closed after the test."""
    made: list[ModelClient] = []

    def make(**options: Any) -> ModelClient:
        where = {"base_url": model.url, "openai_base_url": model.openai_url}
        made.append(ModelClient(**{"give_up_after": 5.0, **where, **options}))
        return made[-1]

    yield make
    for client in made:
        client.close()


@pytest.fixture
def deps(
    settings: Settings, store: PgStore, leases: Leases, clients: Callable[..., ModelClient]
) -> loop.Deps:
    """An in-process worker whose model client reaches both providers, with run events."""
    outbox = Outbox(RedisEvents(leases.client), settings)
    return loop.Deps(settings=settings, store=store, leases=leases, model=clients(), events=outbox)


def _start(store: PgStore, request: dict[str, Any], flow: str = "providers_ask") -> str:
    run_id = f"prov-{uuid.uuid4().hex[:10]}"
    assert store.create_run(run_id, flow, {"request": request})
    return run_id


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    """fn's result, or a test failure if it has not returned within seconds (a hang is a
    failure here, not a stuck test run)."""
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 (raised again in the test's thread)
            box["error"] = exc

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds}s"
    if "error" in box:
        raise box["error"]
    return box["result"]


# -- journaled once, replayed from the journal ---------------------------------------------
@each_api
@pytest.mark.parametrize("flow", ["providers_ask", "providers_ask_async"])
def test_an_answer_is_journaled_and_a_resumed_step_gets_it_from_the_journal(
    api: str, flow: str, deps: loop.Deps, client: Client, model: ModelServer
) -> None:
    run_id = _start(deps.store, _request(api, "REPLY: from the journal"), flow)
    CRASH.add(run_id)
    with pytest.raises(Crash):
        loop.run(run_id, deps)
    assert loop.run(run_id, deps) == cairn.RunStatus.DONE
    assert model.stats()["requests"] == 1  # the resumed step asked nothing
    assert SEEN[run_id] == [SDK_TYPE[api]] * 2  # the SDK's own type, live and replayed
    cp = deps.store.load(run_id)
    assert cp is not None and cp.state == {"text": "from the journal"}
    (call,) = deps.store.journal(run_id, "ask", 0)
    assert call.name == "model" and cairn.text_of(call.result) == "from the journal"
    assert cairn.text_of(json.loads(json.dumps(call.result))) == "from the journal"
    assert call.cost_usd > 0 and cp.cost_usd == pytest.approx(call.cost_usd)  # counted once
    said = [e for e in client.events(run_id, timeout=10) if e.kind == "message"]
    assert [(e.data["text"], "replayed" in e.data) for e in said] == [
        ("from the journal", False),
        ("from the journal", True),
    ]


@each_api
def test_tool_calls_of_every_api_read_alike_in_the_message_event(
    api: str, deps: loop.Deps, client: Client
) -> None:
    run_id = _start(deps.store, _request(api, "TOOLS: lookup", tools=_tools(api)))
    assert loop.run(run_id, deps) == cairn.RunStatus.DONE
    (said,) = [e for e in client.events(run_id, timeout=10) if e.kind == "message"]
    (call,) = said.data["tool_calls"]
    assert (call["name"], call["input"]) == ("lookup", {"q": "lookup 0"}) and call["id"]


# -- streamed ------------------------------------------------------------------------------
@each_api
def test_a_streamed_answer_of_every_api_arrives_as_token_events(
    api: str, deps: loop.Deps, client: Client, model: ModelServer
) -> None:
    words = " ".join(f"w{i}" for i in range(12))
    run_id = _start(deps.store, _request(api, f"REPLY: {words}\nTOKEN_MS: 15", stream=True))
    assert loop.run(run_id, deps) == cairn.RunStatus.DONE
    events = list(client.events(run_id, timeout=10))
    tokens = [e.data["text"] for e in events if e.kind == "token"]
    assert len(tokens) >= 6 and "".join(tokens) == words
    (said,) = [e for e in events if e.kind == "message"]
    assert said.data["text"] == words
    assert model.stats()["streamed"] == 1
    run = client.get(run_id)
    assert run is not None and run.cost_usd > 0
    assert run.cost_usd == pytest.approx(said.data["cost_usd"])


# -- what it cost ----------------------------------------------------------------------------
CACHED, REASONING = 40, 30
PRICED = f"REPLY: priced words\nCACHED: {CACHED}\nREASONING: {REASONING}\n" + "x" * 400


def _billed(api: str, usage: dict[str, Any], input: float, output: float, read: float) -> float:
    """USD an answer bills at these prices per million tokens, read from its usage as the
    provider bills it: Anthropic's input_tokens leave the cache's out, OpenAI's count
    them; both count reasoning as output. Asserts the usage has the tokens asked for."""
    if api == "anthropic":
        assert usage["cache_read_input_tokens"] == CACHED
        assert not usage.get("cache_creation_input_tokens")
        uncached, out = usage["input_tokens"], usage["output_tokens"]
    elif api == "chat":
        assert usage["prompt_tokens_details"]["cached_tokens"] == CACHED
        assert usage["completion_tokens_details"]["reasoning_tokens"] == REASONING
        uncached, out = usage["prompt_tokens"] - CACHED, usage["completion_tokens"]
    else:
        assert usage["input_tokens_details"]["cached_tokens"] == CACHED
        assert usage["output_tokens_details"]["reasoning_tokens"] == REASONING
        uncached, out = usage["input_tokens"] - CACHED, usage["output_tokens"]
    assert out > REASONING
    return (uncached * input + CACHED * read + out * output) / 1e6


def _cost_of_run(deps: loop.Deps, request: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Run one call: the run's cost and its answer's usage as journaled."""
    run_id = _start(deps.store, request)
    assert loop.run(run_id, deps) == cairn.RunStatus.DONE
    cp = deps.store.load(run_id)
    (call,) = deps.store.journal(run_id, "ask", 0)
    assert cp is not None
    return cp.cost_usd, call.result["usage"]


# USD per million: input, output, cache read (claude-haiku-4-5: reads at 0.1x input).
LIST_PRICE = {"anthropic": (1.00, 5.00, 0.10), "chat": (0.15, 0.60, 0.075)}
LIST_PRICE["responses"] = LIST_PRICE["chat"]


@each_api
def test_cached_and_reasoning_tokens_are_priced_as_each_provider_bills_them(
    api: str, deps: loop.Deps
) -> None:
    cost, usage = _cost_of_run(deps, _request(api, PRICED))
    assert cost == pytest.approx(_billed(api, usage, *LIST_PRICE[api]), rel=1e-9)


@each_api
def test_a_price_the_user_set_is_the_one_used(
    api: str, deps: loop.Deps, model: ModelServer, r: redis_lib.Redis, monkeypatch: Any
) -> None:
    # CAIRN_MODEL_PRICES, as a worker reads it: its own client's table, over the process's.
    table = {
        "gpt-4o-mini": {"input": 10.0, "output": 20.0, "cache_read": 3.0},
        "anthropic:claude-haiku-4-5": {"input": 10.0, "output": 20.0},  # reads: 0.1x
    }
    from_env = Settings.from_env({"CAIRN_MODEL_PRICES": json.dumps(table)}).model_prices
    worker = dataclasses.replace(
        deps.settings, model_prices=from_env, openai_base_url=model.openai_url
    )
    priced = ModelClient.from_settings(worker, r)
    try:
        cost, usage = _cost_of_run(dataclasses.replace(deps, model=priced), _request(api, PRICED))
    finally:
        priced.close()
    read = 1.0 if api == "anthropic" else 3.0
    assert cost == pytest.approx(_billed(api, usage, 10.0, 20.0, read), rel=1e-9)
    # The worker's setting is its own client's: the process's table is set_price's.
    cost, usage = _cost_of_run(deps, _request(api, PRICED))
    assert cost == pytest.approx(_billed(api, usage, *LIST_PRICE[api]), rel=1e-9)
    monkeypatch.setattr(PRICES, "_own", {p: dict(t) for p, t in PRICES._own.items()})
    set_price(APIS[api]["model"], input=7.0, output=9.0, cache_read=0.5)
    cost, usage = _cost_of_run(deps, _request(api, PRICED))
    assert cost == pytest.approx(_billed(api, usage, 7.0, 9.0, 0.5), rel=1e-9)


def test_an_anthropic_cache_write_for_an_hour_bills_twice_the_input() -> None:
    # The stand-in writes no cache: the SDK's own Usage, as the API reports such writes
    # (cache_creation_input_tokens counts both lifetimes').
    usage = anthropic.types.Usage(
        input_tokens=100,
        output_tokens=10,
        cache_creation_input_tokens=3000,
        cache_read_input_tokens=500,
        cache_creation={"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000},
    )
    billed = (100 * 1.00 + 1000 * 1.25 + 2000 * 2.00 + 500 * 0.10 + 10 * 5.00) / 1e6
    assert cost_of("claude-haiku-4-5", usage) == pytest.approx(billed, rel=1e-9)
    journaled = json.loads(json.dumps(usage.model_dump(mode="json")))
    assert cost_of("claude-haiku-4-5", journaled) == pytest.approx(billed, rel=1e-9)
    table = Prices(PRICES)  # a price set with its cache writes keeps the hour's ratio
    set_price("claude-haiku-4-5", input=2.0, output=5.0, cache_write=4.0, table=table)
    assert table.price("anthropic", "claude-haiku-4-5").cache_write_1h == pytest.approx(6.4)


# -- failures, mapped alike ------------------------------------------------------------------
@each_api
@pytest.mark.parametrize("status", [429, 500, 503, 529])
@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_429_and_5xx_are_retried_until_answered(
    api: str, status: int, stream: bool, clients: Any, model: ModelServer
) -> None:
    model.control(fail_next=2, status=status)  # each with retry-after 0: retried at once
    client, request = clients(), _request(api, "REPLY: at last")
    answer, _ = client.stream(lambda _: None, **request) if stream else client.create(**request)
    assert cairn.text_of(answer) == "at last"
    assert model.stats()["requests"] == 3 and model.stats()["failures"] == 2


@each_api
@pytest.mark.parametrize("status", [429, 500, 529])
def test_an_error_reported_after_a_stream_began_is_retried_alike(
    api: str, status: int, clients: Any, model: ModelServer
) -> None:
    # The headers said 200; then the API's own error event (rate limit, fault, overload):
    # a fresh request may not meet it, as it may not meet the same status before a stream.
    model.control(cut_after=2, cut_status=status)
    restarts: list[int] = []
    answer, _ = clients().stream(
        lambda _: None, lambda: restarts.append(1), **_request(api, "REPLY: a b c d e")
    )
    assert cairn.text_of(answer) == "a b c d e" and restarts == [1]
    assert model.stats()["requests"] == 2


@each_api
def test_a_retry_after_is_honoured_and_bounded(api: str, clients: Any, model: ModelServer) -> None:
    # No fleet limiter: the 429's retry-after (1 s: a bucket of one, 60 a minute) is what
    # the client waits before its next try.
    model.rpm, model.burst = 60, 1
    model.control(reset=True)
    client = clients(give_up_after=5.0)
    client.create(**_request(api, "first"))
    started = time.monotonic()
    client.create(**_request(api, "second"))
    assert time.monotonic() - started > 0.7
    assert model.stats()["rate_limited"] == 1 and model.stats()["requests"] == 3
    # A retry-after past give_up_after (6 a minute: 10 s) is given up on at once, a
    # Transient for the step's Retry policy: never a worker held for it.
    model.rpm = 6
    model.control(reset=True)
    client.create(**_request(api, "first"))
    started = time.monotonic()
    with pytest.raises(ModelUnavailable) as gave_up:
        client.create(**_request(api, "second"))
    assert time.monotonic() - started < 2.0
    assert isinstance(gave_up.value, cairn.Transient)
    assert model.stats()["requests"] == 2


@each_api
def test_a_timeout_is_transient_and_bounded(api: str, clients: Any, model: ModelServer) -> None:
    model.control(delay_ms=1500)
    client = clients(timeout=0.3, give_up_after=1.0)
    started = time.monotonic()
    with pytest.raises(ModelUnavailable) as gave_up:
        client.create(**_request(api, "slow"))
    assert time.monotonic() - started < 3.0
    sdk = anthropic if api == "anthropic" else openai
    assert isinstance(gave_up.value.__cause__, sdk.APITimeoutError)
    assert model.stats()["requests"] >= 2  # tried again before giving up


@each_api
def test_an_api_that_keeps_failing_retries_the_step_later(
    api: str, deps: loop.Deps, clients: Any, model: ModelServer
) -> None:
    model.control(fail_every=1, fail_status=503)
    run_id = _start(deps.store, _request(api, "hello"))
    deps = dataclasses.replace(deps, model=clients(give_up_after=0.5))
    with pytest.raises(RetryLater) as later:
        loop.run(run_id, deps)
    cp = deps.store.load(run_id)
    assert cp is not None and cp.status == cairn.RunStatus.RUNNING and cp.attempts == 1
    assert "ModelUnavailable: model API kept failing" in (cp.error or "")
    assert later.value.delay > 0


@each_api
@pytest.mark.parametrize(
    ("status", "error"),
    [(400, "BadRequestError"), (401, "AuthenticationError"), (403, "PermissionDeniedError")],
)
def test_a_refused_request_fails_the_run_at_once_with_the_apis_reason(
    api: str, status: int, error: str, deps: loop.Deps, model: ModelServer
) -> None:
    model.control(fail_every=1, fail_status=status)  # every try would be refused
    run_id = _start(deps.store, _request(api, "hello"))
    assert _within(10, lambda: loop.run(run_id, deps)) == cairn.RunStatus.FAILED
    cp = deps.store.load(run_id)
    assert cp is not None and cp.error is not None
    assert f"step 'ask' raised {error}" in cp.error and str(status) in cp.error
    assert "\n" not in cp.error
    assert model.stats()["requests"] == 1  # no retry, of the call or of the step


@pytest.mark.parametrize(
    ("request_", "says"),
    [
        ({"model": "llama-3-70b"}, "model 'llama-3-70b': cairn cannot tell its provider"),
        ({"model": "gpt-4o-mini", "provider": "mistral"}, "provider 'mistral': cairn speaks"),
        ({"model": "claude-haiku-4-5", "api": "responses"}, "api 'responses': anthropic has"),
        ({"model": "gpt-4o-mini", "api": "completions"}, "api 'completions': openai has"),
    ],
    ids=["model", "provider", "anthropic-api", "openai-api"],
)
def test_a_call_no_provider_can_take_fails_the_step_in_one_line(
    request_: dict[str, Any], says: str, deps: loop.Deps, model: ModelServer
) -> None:
    run_id = _start(deps.store, {**request_, "messages": [{"role": "user", "content": "hi"}]})
    assert _within(10, lambda: loop.run(run_id, deps)) == cairn.RunStatus.FAILED
    cp = deps.store.load(run_id)
    assert cp is not None and cp.error is not None
    assert "UnknownModel: " in cp.error and says in cp.error and "\n" not in cp.error
    assert model.stats()["requests"] == 0


def test_a_provider_the_worker_has_no_key_for_fails_the_step_saying_what_to_set(
    deps: loop.Deps, monkeypatch: Any
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    no_openai = ModelClient(base_url=deps.settings.anthropic_base_url, give_up_after=5.0)
    try:
        run_id = _start(deps.store, _request("chat", "hi"))
        outcome = _within(10, lambda: loop.run(run_id, dataclasses.replace(deps, model=no_openai)))
    finally:
        no_openai.close()
    assert outcome == cairn.RunStatus.FAILED
    cp = deps.store.load(run_id)
    assert cp is not None and "ModelNotConfigured: an OpenAI model call needs OPENAI_API_KEY" in (
        cp.error or ""
    )


def test_a_worker_whose_default_model_no_provider_takes_does_not_start(
    settings: Settings, r: redis_lib.Redis
) -> None:
    with pytest.raises(UnknownModel, match="model 'llama-3': cairn cannot tell its provider"):
        ModelClient.from_settings(dataclasses.replace(settings, model="llama-3"), r)


# -- the fleet's rate limits -----------------------------------------------------------------
def test_a_limit_is_per_provider_model_and_key(
    clients: Any, r: redis_lib.Redis, model: ModelServer
) -> None:
    # One a second for every bucket, and no waiting: a second call in a bucket is refused.
    limiter = RateLimiter(r, Limit(rpm=60))
    key_a, key_b = "sk-test-aaaa", "sk-test-bbbb"
    # Client a has one key for both providers: only the provider tells its buckets apart.
    a = clients(api_key=key_a, openai_api_key=key_a, limiter=limiter, wait_max=0.0)
    b = clients(openai_api_key=key_b, limiter=limiter, wait_max=0.0)
    a.create(**_request("chat", "hi"))
    b.create(**_request("chat", "hi"))  # the same model on another key: its own bucket
    # The same model name at the other provider: its own bucket too.
    a.create(**_request("chat", "hi", provider="anthropic", max_tokens=16))
    with pytest.raises(RateLimited):
        a.create(**_request("responses", "hi"))  # key a's gpt-4o-mini: the first's bucket
    assert model.stats()["requests"] == 3
    held = {k.decode() for k in r.scan_iter("cairn:ratelimit:*")}
    assert held == {
        key("openai", "gpt-4o-mini", account(key_a)),
        key("openai", "gpt-4o-mini", account(key_b)),
        key("anthropic", "gpt-4o-mini", account(key_a)),
    }
    assert not any(key_a in k or key_b in k for k in held)  # the keys themselves never


def test_a_limit_naming_its_provider_is_that_providers_alone(r: redis_lib.Redis) -> None:
    one_a_minute, often = Limit(rpm=1), Limit(rpm=600)
    limiter = RateLimiter(r, limits={"gpt-4o": one_a_minute, "openai:gpt-4o": often})
    assert limiter.bucket("openai", "gpt-4o-2024-11-20") == ("openai:gpt-4o", often)
    assert limiter.bucket("anthropic", "gpt-4o") == ("gpt-4o", one_a_minute)
    assert limiter.bucket("openai", "gpt-4.1") == ("gpt-4.1", Limit())  # the default


@each_api
def test_the_providers_limit_headers_back_the_whole_fleet_off(
    api: str, clients: Any, r: redis_lib.Redis, model: ModelServer
) -> None:
    # The limiter knows no limit; the provider does (60 a minute, a request back every
    # second): its headers and its 429's retry-after are all the fleet has to go by.
    model.rpm = model.burst = 60
    model.control(reset=True)
    events: list[Any] = []
    one, two = (
        clients(limiter=RateLimiter(r), observe=lambda *e: events.append(e)) for _ in range(2)
    )
    spend = clients()  # another app on the same key spends the quota out of the fleet's sight
    left = (
        "anthropic-ratelimit-requests-remaining"
        if api == "anthropic"
        else ("x-ratelimit-remaining-requests")
    )
    for _ in range(60):
        raw = _raw(spend, api)
        if raw.headers[left] == "0":
            break
    assert raw.headers[left] == "0"
    two.create(**_request(api, "hi"))  # a 429 and its retry-after, kept in Redis, waited out
    assert model.stats()["rate_limited"] == 1
    assert [e[0] for e in events] == ["429", "wait"]
    started = time.monotonic()
    one.create(**_request(api, "hi"))  # the last answer said none remain: it waits, no 429
    assert time.monotonic() - started > 0.5
    assert model.stats()["rate_limited"] == 1


def _raw(client: ModelClient, api: str) -> Any:
    """One request through the SDK itself, its headers and all."""
    if api == "anthropic":
        sdk: Any = client.providers["anthropic"].client  # type: ignore[attr-defined]
        return sdk.messages.with_raw_response.create(**_request(api, "spend"))
    sdk = client.providers["openai"].client  # type: ignore[attr-defined]
    body = {k: v for k, v in _request(api, "spend").items() if k != "api"}
    where = sdk.responses if api == "responses" else sdk.chat.completions
    return where.with_raw_response.create(**body)


# -- GenAI spans -----------------------------------------------------------------------------
@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.use(provider.get_tracer("test"))
    yield exporter
    otel.use(None)
    provider.shutdown()


@each_api
def test_model_spans_say_the_provider_the_model_and_the_usage(
    api: str, spans: InMemorySpanExporter, deps: loop.Deps
) -> None:
    traced = dataclasses.replace(deps, middleware=Chain([otel.Tracing()]))
    run_id = _start(deps.store, _request(api, PRICED))
    assert loop.run(run_id, traced) == cairn.RunStatus.DONE
    (chat,) = [s for s in spans.get_finished_spans() if s.name.startswith("chat ")]
    attrs = dict(chat.attributes or {})
    assert attrs["gen_ai.system"] == attrs["gen_ai.provider.name"] == PROVIDER[api]
    assert attrs["gen_ai.request.model"] == APIS[api]["model"]
    assert chat.name == f"chat {attrs['gen_ai.response.model']}"
    (call,) = deps.store.journal(run_id, "ask", 0)
    usage = call.result["usage"]
    if api == "anthropic":
        assert attrs["gen_ai.usage.input_tokens"] == usage["input_tokens"] + CACHED
        assert attrs["gen_ai.usage.output_tokens"] == usage["output_tokens"]
    else:
        prompt, out = (
            ("prompt_tokens", "completion_tokens")
            if api == "chat"
            else (
                "input_tokens",
                "output_tokens",
            )
        )
        assert attrs["gen_ai.usage.input_tokens"] == usage[prompt]
        assert attrs["gen_ai.usage.output_tokens"] == usage[out]
        assert attrs["gen_ai.usage.reasoning.output_tokens"] == REASONING
        assert attrs["openai.api.type"] == (
            "responses" if api == "responses" else "chat_completions"
        )
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == CACHED
    cp = deps.store.load(run_id)
    assert cp is not None and attrs["cairn.cost_usd"] == pytest.approx(cp.cost_usd)
