"""Fleet-wide model rate limits: real Redis, the real Messages-API stand-in through the
real anthropic SDK. Several real processes together: tests/fleet/test_ratelimit.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
import redis as redis_lib

import cairn
from cairn.core.errors import RetryLater
from cairn.core.settings import Settings
from cairn.steps.model import ModelClient, RateLimited
from cairn.store import Leases, PgStore, ratelimit
from cairn.store.ratelimit import Limit, RateLimiter
from cairn.testing.standins import ModelServer
from cairn.workers import loop
from tests.helpers.holds import Racer

flow = cairn.workflow("ratelimit_ask")


@flow.step()
def ask(ctx: cairn.Context) -> cairn.StepResult:
    ctx.model(messages=[{"role": "user", "content": "hi"}], max_tokens=16)
    return cairn.StepResult(cursor="done")


ASK = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}


@pytest.fixture
def r(redis_url: str) -> Iterator[redis_lib.Redis]:
    client = redis_lib.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def clients() -> Iterator[Any]:
    """make(url, limiter, events, wait_max=10): a ModelClient telling events what it saw."""
    made: list[ModelClient] = []

    def make(url: str, limiter: RateLimiter, events: list[Any], wait_max: float = 10.0) -> Any:
        seen = lambda *event: events.append(event)
        made.append(ModelClient(base_url=url, limiter=limiter, wait_max=wait_max, observe=seen))
        return made[-1]

    yield make
    for client in made:
        client.close()


def test_the_providers_headers_make_the_whole_fleet_back_off(
    model: ModelServer, r: redis_lib.Redis, clients: Any
) -> None:
    # The limiter knows no limit; the provider does (20/min, a request back every 3 s):
    # its headers and its 429's retry-after are all the fleet has to go by.
    model.rpm = model.burst = 20
    model.control(reset=True)
    events: list[Any] = []
    one, two = (clients(model.url, RateLimiter(r), events) for _ in range(2))  # two workers
    # Another app on the same key spends the quota, out of the fleet's sight.
    other = anthropic.Anthropic(api_key="local-stand-in", base_url=model.url, max_retries=0)
    while True:
        raw = other.messages.with_raw_response.create(model="claude-haiku-4-5", **ASK)
        assert raw.headers["anthropic-ratelimit-requests-limit"] == "20"
        if raw.headers["anthropic-ratelimit-requests-remaining"] == "0":
            break
    two.create(**ASK)  # answered 429 + retry-after: recorded in Redis, waited out, answered
    assert model.stats()["rate_limited"] == 1
    assert [e[0] for e in events] == ["429", "wait"]
    started = time.monotonic()
    one.create(**ASK)  # its answer said 0 remaining: the other worker waits, no 429 of its own
    assert time.monotonic() - started > 2.0
    assert model.stats()["rate_limited"] == 1
    other.close()


def test_tokens_per_minute_are_booked_then_settled(
    model: ModelServer, r: redis_lib.Redis, clients: Any
) -> None:
    tpm = 6000
    limiter = RateLimiter(r, limits={"claude-haiku-4-5": Limit(tpm=tpm)})
    events: list[Any] = []
    client = clients(model.url, limiter, events, wait_max=0.0)  # never wait: count what passes
    ask = {"messages": [{"role": "user", "content": "x" * 6000}], "max_tokens": 16}
    booked = client._tokens({**ask, "model": "claude-haiku-4-5"})
    message, _ = client.create(**ask)
    used = message.usage.input_tokens + message.usage.output_tokens
    assert used < booked  # the estimate is over: the rest is given back after the call
    passed = 1
    with pytest.raises(RateLimited) as over:
        while passed < 10:
            client.create(**ask)
            passed += 1
    # Each call books `booked` and keeps `used`: only settling lets this many through.
    assert passed == 1 + (tpm - booked) // used > tpm // booked
    assert over.value.wait > 0 and ("deferred", "claude-haiku-4-5", 1) in events
    client.wait_max = over.value.wait + 2  # now it may wait: it does, then is answered
    started = time.monotonic()
    client.create(**ask)
    assert time.monotonic() - started >= over.value.wait - 0.5
    assert model.stats()["requests"] == passed + 1


def test_a_step_over_the_limit_is_retried_later_and_the_run_finishes(
    settings: Settings,
    store: PgStore,
    leases: Leases,
    model: ModelServer,
    r: redis_lib.Redis,
    clients: Any,
) -> None:
    # 20/min: a call every 3 s. The second run's call would wait past CAIRN_RATE_WAIT_MAX,
    # so its step is retried later (the worker is free meanwhile), not failed.
    limiter = RateLimiter(r, Limit(rpm=20))
    events: list[Any] = []
    client = clients(model.url, limiter, events, wait_max=1.5)
    deps = loop.Deps(settings=settings, store=store, leases=leases, model=client)
    for run_id in ("first", "second"):
        store.create_run(run_id, "ratelimit_ask", {})
    assert loop.run("first", deps) == cairn.RunStatus.DONE
    with pytest.raises(RetryLater) as later:
        loop.run("second", deps)
    cp = store.load("second")
    assert cp is not None and cp.status == cairn.RunStatus.RUNNING and cp.attempts == 1
    assert "over the fleet's rate limit" in (cp.error or "")
    time.sleep(later.value.delay)  # the task's countdown: 2 s, the step's Retry policy
    assert loop.run("second", deps) == cairn.RunStatus.DONE
    assert [e[0] for e in events] == ["deferred", "wait"]
    assert model.stats()["requests"] == 2


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"CAIRN_MODEL_RPM": "-5"}, "CAIRN_MODEL_RPM=-5"),
        ({"CAIRN_MODEL_TPM": "1.5"}, "CAIRN_MODEL_TPM='1.5' is not a whole number"),
        ({"CAIRN_RATE_LIMITS": '{"claude-x": {"rpm": 5'}, "CAIRN_RATE_LIMITS is not JSON"),
        ({"CAIRN_RATE_LIMITS": '{"claude-x": {}}'}, "CAIRN_RATE_LIMITS['claude-x']={}"),
        ({"CAIRN_RATE_LIMITS": '{"claude-x": {"rpn": 5}}'}, 'want {"rpm": N, "tpm": N}'),
        ({"CAIRN_RATE_LIMITS": '{"claude-x": {"tpm": -1}}'}, "['claude-x'].tpm=-1"),
        ({"CAIRN_RATE_WAIT_MAX": "-1"}, "CAIRN_RATE_WAIT_MAX=-1"),
    ],
)
def test_bad_limits_are_a_clear_error_at_start(env: dict[str, str], says: str) -> None:
    with pytest.raises(SystemExit) as exc:
        Settings.from_env(env)
    assert says in str(exc.value)
    assert Settings.from_env({"CAIRN_RATE_LIMITS": '{"claude-x": {"rpm": 5}}'}).rate_limits


def test_a_bucket_with_no_limit_found_clear_is_not_asked_again_for_a_moment(
    r: redis_lib.Redis,
) -> None:
    # No limit of its own: the bucket's only state is a back-off another worker sets. A
    # worker that found it clear books without Redis for CLEAR_FOR, and then asks again.
    one, two = RateLimiter(r), RateLimiter(r)
    who = "k" + str(time.time_ns())
    assert one.take("openai", "gpt-x", who, 10, 5.0) == (True, 0.0)
    asked = []
    r_call = one._script
    one._script = lambda **kw: asked.append(kw) or r_call(**kw)  # type: ignore[method-assign]
    two.back_off("openai", "gpt-x", who, 3.0)
    assert one.take("openai", "gpt-x", who, 10, 5.0) == (True, 0.0) and asked == []
    time.sleep(ratelimit.CLEAR_FOR)
    booked, wait = one.take("openai", "gpt-x", who, 10, 5.0)
    assert booked and 2.0 < wait <= 3.0 and len(asked) == 1
    # Still backing off: not taken for clear, so the next call asks (and waits) too.
    assert one.take("openai", "gpt-x", who, 10, 5.0)[1] > 2.0 and len(asked) == 2
    # A limited bucket is asked every time.
    limited = RateLimiter(r, Limit(rpm=600))
    assert limited.take("openai", "gpt-y", who, 10, 5.0) == (True, 0.0)
    assert limited.take("openai", "gpt-y", who, 10, 5.0)[1] > 0.05


def test_a_tenants_calls_count_in_its_own_bucket_too(r: redis_lib.Redis) -> None:
    """CAIRN_TENANT_MODEL_RPM: each tenant's own requests a minute per model, on top of the
    fleet's (here none): one tenant at its limit waits, another tenant and a run of no
    tenant do not."""
    limiter = RateLimiter.from_settings(Settings.from_env().with_options(tenant_model_rpm=2), r)
    take = lambda tenant: limiter.take("anthropic", "claude-haiku-4-5", "k", 0, 0.0, tenant)
    assert take("acme") == (True, 0.0)
    refused, wait = take("acme")  # two a minute: the next in ~30 s, past 0, refused
    assert refused is False and 20 < wait <= 30
    assert take("globex") == (True, 0.0)
    assert all(take(None) == (True, 0.0) for _ in range(5))


def test_a_steps_model_calls_are_booked_for_its_runs_tenant(
    settings: Settings,
    store: PgStore,
    leases: Leases,
    model: ModelServer,
    r: redis_lib.Redis,
    clients: Any,
) -> None:
    limiter = RateLimiter(r, tenant=Limit(rpm=1))
    events: list[Any] = []
    client = clients(model.url, limiter, events, wait_max=0.5)
    deps = loop.Deps(settings=settings, store=store, leases=leases, model=client)
    for run_id, tenant in (("acme-1", "acme"), ("acme-2", "acme"), ("globex-1", "globex")):
        store.create_run(run_id, "ratelimit_ask", {}, tenant=tenant)
    assert loop.run("acme-1", deps) == cairn.RunStatus.DONE
    with pytest.raises(RetryLater):  # acme's one call a minute is spent
        loop.run("acme-2", deps)
    assert loop.run("globex-1", deps) == cairn.RunStatus.DONE  # globex's is its own
    assert [e[0] for e in events] == ["deferred"]


@pytest.mark.parametrize("model_name", ["claude-haiku-4-5", "gpt-4o-mini"])
def test_a_request_late_on_its_slot_is_booked_where_it_goes_out_not_before(
    r: redis_lib.Redis, model_name: str
) -> None:
    """120/min against a provider that allows 120/min with a burst of 2 (its per-second
    enforcement). Four calls each take until the same moment to reach the wire after they
    are asked (an httpx request hook where the SDK's own first-call work sits: imports,
    building its API resources). Booked before that work, their slots (0, 0.5, 1, 1.5 s)
    have all passed by then and the four go out together: two 429s. Booked in the
    transport as each goes out, they leave 0.5 s apart and none is refused."""
    with ModelServer(rpm=120, burst=2) as provider:
        client = ModelClient(
            base_url=provider.url,
            openai_base_url=provider.openai_url,
            default_model=model_name,
            limiter=RateLimiter(r, Limit(rpm=120)),
        )
        sdk = client.providers["openai" if model_name.startswith("gpt") else "anthropic"].client
        meet = time.monotonic() + 2.0  # after the fourth slot (1.5 s) and its thread's start

        def busy(request: Any) -> None:
            time.sleep(max(0.0, meet - time.monotonic()))

        sdk._client.event_hooks = {"request": [busy], "response": []}
        try:
            calls = [Racer(lambda: client.create(**ASK)) for _ in range(4)]
            for call in calls:
                call.outcome(timeout=30)
            stats = provider.stats()
        finally:
            client.close()
    assert stats["rate_limited"] == 0, stats
    assert stats["requests"] == 4, stats
