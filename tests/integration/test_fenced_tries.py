"""Every try of a model call is fenced: the lease is checked right before each request goes
out (cairn's transport, cairn.steps.context.fence), so a worker whose lease was lost while
it waited between two tries (a back-off after a failure, a 429's retry-after, a wait for
the fleet's rate limit) makes no further request; its step ends as a lost lease does, the
run neither failed nor retried. Enumerated over every surface that makes model requests:
ctx.model (create, stream), ctx.amodel, inside ctx.call, ctx.acall and ctx.parallel, the
OpenAI Agents SDK, LangGraph, and pydantic-ai's own SDK client (its SDK's own retries).

The lease is taken over inside the wait, at the line the model client (or the SDK) logs as
the wait begins: the moment tests/fleet/test_fenced_tries.py pauses real workers at.
Real Redis, Postgres, the real SDKs against the model stand-in.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import cairn
from cairn.core.errors import LeaseLost
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.steps.model import ModelClient
from cairn.store import Leases, PgStore, keys
from cairn.store.lease import LeaseToken
from cairn.store.ratelimit import Limit, RateLimiter
from cairn.testing.standins import ModelServer
from cairn.workers import loop
from tests.helpers import lg_flows, oa_flows, pai_flows
from tests.helpers.flows import ASK, fenced_try

TTL = 1.0  # the lease: its holder asks Redis once its last renewal is older than 0.5 s
WAIT = 1.2  # each wait below: past half the lease, so the fence cannot trust a renewal

async_flow = cairn.workflow("fenced_try_async")


@async_flow.step("ask")
async def ask_async(ctx: cairn.Context) -> cairn.StepResult:
    if ctx.input["how"] == "amodel":
        await ctx.amodel(**ASK)
    elif ctx.input["how"] == "astream":
        await ctx.amodel(stream=True, **ASK)
    else:

        async def tool() -> str:
            return cairn.text_of(await ctx.amodel(**ASK))

        await ctx.acall("tool", tool)
    return cairn.StepResult(cursor=cairn.DONE)


# (workflow, input) for each surface; each makes its first model request through it.
SURFACES: dict[str, tuple[str, dict[str, Any]]] = {
    **{how: ("fenced_try", {"how": how}) for how in ("create", "stream", "call", "parallel")},
    **{how: ("fenced_try_async", {"how": how}) for how in ("amodel", "astream", "acall")},
    "agents_sdk": ("oa_support", {"prompt": f"TOOLS: {oa_flows.PLAN}\nCharged twice?"}),
    "langgraph": ("lg_support", {"messages": [{"role": "user", "content": "TOOLS: lookup"}]}),
    "pydantic_ai": ("pai_support", {"prompt": f"TOOLS: {pai_flows.PLAN}\nHelp me."}),
}
assert lg_flows.support_flow and fenced_try  # registered: imported for their workflows


class _WaitBegins(logging.Handler):
    """Calls `then` (once) at the first log line saying a model call's next try waits:
    cairn's model client's (action model_wait), or an SDK's own retry (pydantic-ai's
    agent sends through its SDK's client, which logs "Retrying request ... in N seconds")."""

    def __init__(self, then: Callable[[], None]) -> None:
        super().__init__(logging.DEBUG)
        self.then: Callable[[], None] | None = then
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        waits = getattr(record, "action", None) == "model_wait"
        if not (waits or record.getMessage().startswith("Retrying request")):
            return
        self.seen.append(record.getMessage())
        then, self.then = self.then, None
        if then is not None:
            then()  # in the thread about to wait: the wait has not begun, the try is over


@pytest.fixture
def wait_begins() -> Iterator[Callable[[Callable[[], None]], _WaitBegins]]:
    names = ("cairn.steps.model", "anthropic._base_client", "openai._base_client")
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    handlers: list[_WaitBegins] = []

    def on(then: Callable[[], None]) -> _WaitBegins:
        handlers.append(_WaitBegins(then))
        for lg in loggers:
            lg.setLevel(logging.DEBUG)
            lg.addHandler(handlers[-1])
        return handlers[-1]

    yield on
    for lg, level in zip(loggers, levels, strict=True):
        lg.setLevel(level)
        for handler in handlers:
            lg.removeHandler(handler)


def _take_over(leases: Leases, run_id: str) -> None:
    """What a worker that found the lease expired does: it leases the run itself."""
    leases.client.delete(keys.lease(run_id))
    assert leases.acquire(run_id, 30.0, owner=LeaseToken("elsewhere", 1, "taker")) is not None


def _run_lost(run_id: str, deps: loop.Deps) -> BaseException | None:
    """loop.run(run_id) in a thread of its own (as a pool thread runs it), bounded: what it
    raised (None: it returned)."""
    box: list[BaseException | None] = []

    def go() -> None:
        try:
            loop.run(run_id, deps)
            box.append(None)
        except BaseException as exc:  # noqa: BLE001 (the outcome under test)
            box.append(exc)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    thread.join(30)
    assert box, "the run is still running after 30 s"
    return box[0]


def _deps(settings: Settings, store: PgStore, leases: Leases, model: ModelClient) -> loop.Deps:
    return loop.Deps(
        settings=dataclasses.replace(settings, lease_ttl=TTL),
        store=store,
        leases=leases,
        model=model,
    )


def _check_stopped_as_lost(store: PgStore, run_id: str, lost: BaseException | None) -> None:
    """The step ended as a lost lease ends it: nothing recorded, the run untouched."""
    assert isinstance(lost, LeaseLost), repr(lost)
    cp = store.load(run_id)
    assert cp is not None and cp.status in (RunStatus.PENDING, RunStatus.RUNNING)
    assert cp.attempts == 0 and cp.error is None  # neither failed nor retried
    assert store.journal(run_id, cp.cursor, 0) == []  # nothing journaled: no record refused


@pytest.mark.parametrize("surface", list(SURFACES))
def test_a_lease_lost_in_a_retrys_back_off_lets_no_further_request_out(
    surface: str,
    settings: Settings,
    store: PgStore,
    leases: Leases,
    model: ModelServer,
    wait_begins: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first try is answered 503 with a retry-after: the call backs off (cairn's
    policy, or for pydantic-ai's agent its SDK's own), its lease is taken over inside the
    back-off, and the next try is never sent."""
    monkeypatch.setenv("ANTHROPIC_BASE_URL", model.url)  # pydantic-ai's agent's own client
    client = ModelClient(base_url=model.url, openai_base_url=model.openai_url, give_up_after=30.0)
    deps = _deps(settings, store, leases, client)
    name, data = SURFACES[surface]
    run_id = f"fenced-{surface}-{uuid.uuid4().hex[:8]}"
    assert store.create_run(run_id, name, data)
    model.control(reset=True, fail_next=1, status=503, retry_after=WAIT)
    began = wait_begins(lambda: _take_over(leases, run_id))
    try:
        lost = _run_lost(run_id, deps)
    finally:
        client.close()
    assert began.seen, "the call never backed off"
    assert model.stats()["requests"] == 1  # the failed try; its retry was never sent
    _check_stopped_as_lost(store, run_id, lost)


@pytest.mark.parametrize("wait", ["429", "rate_limit", "back_off"])
def test_a_lease_lost_in_any_wait_between_tries_lets_no_further_request_out(
    wait: str,
    settings: Settings,
    store: PgStore,
    leases: Leases,
    model: ModelServer,
    wait_begins: Any,
) -> None:
    """A worker's client (with the fleet's limiter) waits before a try for three reasons:
    a 429's retry-after, booked fleet-wide, waited out as the next try's admission; the
    fleet's own rate limit (the step's second call waits for its slot); a back-off after
    a 503. The lease is taken over inside each: no request follows."""
    calls = 1
    limit = Limit()
    if wait == "429":
        model.control(reset=True, fail_next=1, status=429, retry_after=WAIT)
    elif wait == "rate_limit":
        model.control(reset=True)
        limit, calls = Limit(rpm=round(60 / WAIT)), 2  # a slot every WAIT seconds
    else:
        model.control(reset=True, fail_next=1, status=503, retry_after=WAIT)
    limiter = RateLimiter(leases.client, limit)
    client = ModelClient(base_url=model.url, limiter=limiter, wait_max=30.0, give_up_after=30.0)
    deps = _deps(settings, store, leases, client)
    run_id = f"fenced-{wait}-{uuid.uuid4().hex[:8]}"
    assert store.create_run(run_id, "fenced_try", {"how": "create", "calls": calls})
    began = wait_begins(lambda: _take_over(leases, run_id))
    try:
        lost = _run_lost(run_id, deps)
    finally:
        client.close()
    assert len(began.seen) == 1, began.seen
    assert model.stats()["requests"] == 1  # the 429, the first call, the 503: nothing after
    assert isinstance(lost, LeaseLost), repr(lost)
    cp = store.load(run_id)
    assert cp is not None and cp.status == RunStatus.RUNNING and cp.attempts == 0


def test_the_check_before_each_request_asks_redis_only_for_an_old_renewal(
    settings: Settings,
    store: PgStore,
    leases: Leases,
    model: ModelServer,
) -> None:
    """The fence costs no round trip while the lease was renewed within half its TTL: a
    step of 20 model calls sends Redis no more commands than the heartbeat's and the
    run's own (counted by the server itself), and each request's check takes microseconds."""
    client = ModelClient(base_url=model.url, give_up_after=5.0)
    deps = dataclasses.replace(_deps(settings, store, leases, client), settings=settings)
    model.control(reset=True)

    def commands() -> int:
        stats = leases.client.info("commandstats")
        return sum(int(v["calls"]) for v in stats.values())

    counts, took = [], []
    try:
        for calls in (1, 21):
            run_id = f"fenced-cost-{uuid.uuid4().hex[:8]}"
            assert store.create_run(run_id, "fenced_try", {"how": "create", "calls": calls})
            before, started = commands(), time.monotonic()
            assert loop.run(run_id, deps) == RunStatus.DONE
            took.append(time.monotonic() - started)
            counts.append(commands() - before - 1)  # less the INFO that read it
    finally:
        client.close()
    assert model.stats()["requests"] == 22
    # 20 requests more: no Redis command for any of them, but the heartbeat's renewals
    # (one each TTL/3) in the time they took.
    renewals = int(took[1] / (settings.lease_ttl / 3)) + 1
    assert counts[1] - counts[0] <= renewals, (counts, took)


def test_a_step_outside_any_run_is_not_fenced(model: ModelServer) -> None:
    """A ModelClient used outside a step (a script, a test) has no lease to check."""
    client = ModelClient(base_url=model.url, give_up_after=5.0)
    try:
        answer, _ = client.create(**ASK)
    finally:
        client.close()
    assert cairn.text_of(answer) == "fenced"


before_call = cairn.workflow("fenced_before_call")
TOOL_RAN: list[str] = []


@before_call.step("ask")
def ask_after_a_pause(ctx: cairn.Context) -> cairn.StepResult:
    time.sleep(WAIT)  # the lease is taken over in here, as over a SIGSTOP
    if ctx.input["how"] == "tool":
        ctx.call("tool", lambda: TOOL_RAN.append(ctx.run_id))
    else:
        ctx.model(**ASK)
    return cairn.StepResult(cursor=cairn.DONE)


@pytest.mark.parametrize("how", ["tool", "model"])
def test_a_lease_lost_before_a_journaled_call_stops_it_before_it_starts(
    how: str, settings: Settings, store: PgStore, leases: Leases, model: ModelServer
) -> None:
    """The check before each journaled call (ctx.call, ctx.model) is the only fence a
    tool without a key has: a step that lost its run while it paused before the call
    does not run the tool, nor send the request."""
    client = ModelClient(base_url=model.url, give_up_after=5.0)
    deps = _deps(settings, store, leases, client)
    model.control(reset=True)
    run_id = f"fenced-before-{how}-{uuid.uuid4().hex[:8]}"
    assert store.create_run(run_id, "fenced_before_call", {"how": how})
    taker = threading.Timer(0.2, _take_over, (leases, run_id))
    taker.start()
    try:
        lost = _run_lost(run_id, deps)
    finally:
        taker.join()
        client.close()
    assert run_id not in TOOL_RAN
    assert model.stats()["requests"] == 0
    _check_stopped_as_lost(store, run_id, lost)
