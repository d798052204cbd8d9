"""pydantic-ai agents as cairn runs (cairn.pydantic_ai): every model request and tool call
a journaled call, so a run killed anywhere resumes without asking or acting again.

Two agents: one on pydantic-ai's own FunctionModel (on the in-memory twins and on Postgres
+ Redis), and tests/helpers/pai_flows.py's on pydantic-ai's Anthropic model through the
real SDK against the Messages-API stand-in, with a keyed HTTP effect and a ctx.db write (Postgres).
A killed process is played by ProcessDied raised from a middleware hook at a call boundary,
as in tests/contract/test_journal.py; real SIGKILLs and the zombie are
tests/fleet/test_pydantic_ai.py's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import cairn
from cairn.client import Client
from cairn.core import errors
from cairn.core.records import STEERED as READ
from cairn.core.records import Checkpoint
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.pydantic_ai import APPROVAL, CairnDurability, agent_workflow, stream_tokens
from cairn.testing import ManualClock, MemoryLeases, MemoryStore
from cairn.testing.standins import ModelServer
from cairn.workers import loop
from cairn.workers.middleware import Chain, Middleware
from tests.helpers import pai_flows
from tests.helpers.contract import on_both
from tests.helpers.web import login

# The Anthropic agent's stand-in: its client reads ANTHROPIC_BASE_URL at each request
# (tests/helpers/pai_flows.py), which the tests that use it set (`stand_in`).
MODEL = ModelServer().start()
SETTINGS = Settings(
    database_url="postgresql://unused.invalid/x", redis_url="redis://unused.invalid/0"
)
made: defaultdict[str, list[str]] = defaultdict(list)  # what really ran, per run


class ProcessDied(BaseException):
    """The worker's process killed: nothing after it runs or records."""


class Die(Middleware):
    """Kill the process once, at one call boundary: ("before" | "after", call pos)."""

    def __init__(self, when: str, pos: int) -> None:
        self.at: tuple[str, int] | None = (when, pos)

    def _maybe(self, when: str, pos: int) -> None:
        if self.at == (when, pos):
            self.at = None
            raise ProcessDied

    def before_call(self, cp: Checkpoint, name: str, pos: int) -> None:
        self._maybe("before", pos)

    def after_call(
        self, cp: Checkpoint, name: str, pos: int, *, exception: BaseException | None
    ) -> None:
        self._maybe("after", pos)


@pytest.fixture(params=["memory", "pg"])
def deps(request: pytest.FixtureRequest) -> loop.Deps:
    return on_both(request)


def _start(deps: loop.Deps, flow: str, prompt: str, **kw: Any) -> str:
    run_id = f"{flow}-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, flow, {"prompt": prompt}, **kw)
    return run_id


def _redeliver(run_id: str, deps: loop.Deps) -> RunStatus:
    """The broker delivers the run again, after its first worker died with the lease."""
    lease = deps.leases.holder(run_id)
    if lease is not None:
        assert deps.leases.break_dead(run_id, lease)
    return loop.run(run_id, deps)


def _killed(deps: loop.Deps, when: str, pos: int) -> loop.Deps:
    return dataclasses.replace(deps, middleware=Chain([Die(when, pos)]))


# -- an agent on pydantic-ai's FunctionModel ----------------------------------------------
def _script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """lookup, then notify, then the answer; each request counted per run."""
    prompt = messages[0].parts[-1].content  # type: ignore[union-attr]
    made[str(prompt)].append("model")
    turn = sum(1 for m in messages if m.kind == "response")
    if turn == 0:
        return ModelResponse(parts=[ToolCallPart("lookup", {"query": "fencing"})])
    if turn == 1:
        return ModelResponse(parts=[ToolCallPart("notify", {"note": "on its way"})])
    return ModelResponse(parts=[TextPart(f"answer after {turn} tools")])


helper = Agent(FunctionModel(_script), name="helper", capabilities=[CairnDurability()])


@helper.tool_plain
def lookup(query: str) -> str:
    ctx = cairn.current()
    made[ctx.input["prompt"] if ctx else "outside"].append("lookup")
    return f"page about {query}"


@helper.tool_plain
def notify(note: str) -> str:
    ctx = cairn.current()
    if ctx is None:
        return "not in a cairn run: no key"
    key = ctx.idempotency_key()  # this tool call's own key
    made[ctx.input["prompt"]].append(key)
    return key


agent_workflow("pai-helper", helper)

NAMES = [
    "helper__model.request",
    "helper__function_toolset__<agent>.call_tool:lookup",
    "helper__model.request",
    "helper__function_toolset__<agent>.call_tool:notify",
    "helper__model.request",
]


@pytest.mark.parametrize(
    ("when", "pos"), [("before", 0), ("after", 0), ("after", 1), ("before", 3), ("after", 4)]
)
def test_a_killed_agent_run_resumes_without_asking_or_acting_again(
    deps: loop.Deps, when: str, pos: int
) -> None:
    prompt = f"why fence? {uuid.uuid4().hex}"
    run_id = _start(deps, "pai-helper", prompt)
    with pytest.raises(ProcessDied):
        loop.run(run_id, _killed(deps, when, pos))
    assert _redeliver(run_id, deps) == RunStatus.DONE
    journal = deps.store.journal(run_id, "agent", 0)
    assert [c.name for c in journal] == NAMES
    key = f"cairn:{run_id}:agent:0:{NAMES[3]}:0"
    # Each request and tool made once, but the one the kill cut short after it ran.
    expected = ["model", "lookup", "model", key, "model"]  # one per journaled call, in order
    if when == "after":
        expected.insert(pos + 1, expected[pos])
    assert made[prompt] == expected
    run = deps.store.get(run_id)
    assert run is not None
    assert run.state["output"] == "answer after 2 tools"
    assert run.state["usage"]["requests"] == 3 and run.state["usage"]["tool_calls"] == 2
    # Each request's cost counted once, recorded with its call.
    assert run.cost_usd == pytest.approx(sum(c.cost_usd for c in journal)) and run.cost_usd > 0
    window = deps.store.load(run_id).window  # type: ignore[union-attr]
    assert [m["kind"] for m in window] == ["request", "response"] * 3  # the conversation


# -- parallel tool calls: one response asking for three at once -------------------------
def _fan_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Three fetches in one response (pydantic-ai runs them side by side), then the answer."""
    prompt = messages[0].parts[-1].content  # type: ignore[union-attr]
    made[str(prompt)].append("model")
    if sum(1 for m in messages if m.kind == "response") == 0:
        calls = [ToolCallPart("fetch", {"page": p}, tool_call_id=f"c-{p}") for p in "abc"]
        return ModelResponse(parts=list(calls))
    returns = [p for m in messages for p in m.parts if p.part_kind == "tool-return"]
    return ModelResponse(
        parts=[TextPart(" ".join(f"{r.tool_call_id}={r.content}" for r in returns))]
    )


fanner = Agent(FunctionModel(_fan_script), name="fanner", capabilities=[CairnDurability()])


@fanner.tool_plain
async def fetch(page: str) -> str:
    ctx = cairn.current()
    assert ctx is not None
    await asyncio.sleep({"a": 0.06, "b": 0.03, "c": 0.0}[page])  # they finish c, b, a
    made[ctx.input["prompt"]].append(page)
    return f"{page}:{ctx.idempotency_key().rsplit(':', 1)[1]}"  # its place among the fetches


agent_workflow("pai-fanner", fanner)
FETCH = "fanner__function_toolset__<agent>.call_tool:fetch"


def test_parallel_tool_calls_keep_their_places_on_replay(deps: loop.Deps) -> None:
    prompt = f"fan out {uuid.uuid4().hex}"
    run_id = _start(deps, "pai-fanner", prompt)
    with pytest.raises(ProcessDied):  # "a" (place 1) finished last: killed before its record
        loop.run(run_id, _killed(deps, "after", 1))
    assert made[prompt] == ["model", "c", "b", "a"]
    assert [c.pos for c in deps.store.journal(run_id, "agent", 0)] == [0, 2, 3]
    assert _redeliver(run_id, deps) == RunStatus.DONE
    assert made[prompt] == ["model", "c", "b", "a", "a", "model"]  # only "a" made again
    journal = deps.store.journal(run_id, "agent", 0)
    ask = "fanner__model.request"
    assert [c.name for c in journal] == [ask, FETCH, FETCH, FETCH, ask]
    # Places in the order the model asked, whatever order they finished in; each its own.
    assert [journal[i].result["result"] for i in (1, 2, 3)] == ["a:0", "b:1", "c:2"]
    run = deps.store.get(run_id)
    assert run is not None and run.state["output"] == "c-a=a:0 c-b=b:1 c-c=c:2"


def test_outside_a_cairn_step_the_capability_does_nothing() -> None:
    result = asyncio.run(helper.run("outside"))  # run_sync would leave its loop open
    assert result.output == "answer after 2 tools"
    assert made["outside"] == ["model", "lookup", "model", "model"]  # notify: no ctx, no key
    bound = CairnDurability.from_agent(helper)
    assert bound is not None and not bound.in_durable_context


def test_an_agent_without_the_capability_is_refused_at_once() -> None:
    plain = Agent(FunctionModel(_script), name="plain")
    with pytest.raises(errors.CairnError, match=r"capabilities=\[cairn.pydantic_ai"):
        agent_workflow("pai-plain", plain)


def test_a_run_over_its_budget_stops_before_the_next_request(deps: loop.Deps) -> None:
    prompt = f"budget {uuid.uuid4().hex}"
    run_id = _start(deps, "pai-helper", prompt, max_cost_usd=1e-9)
    assert loop.run(run_id, deps) == RunStatus.BUDGET_EXCEEDED
    assert made[prompt] == ["model", "lookup"]  # the first request paid, the second refused


def test_bad_input_is_refused_before_any_request(deps: loop.Deps) -> None:
    run_id = f"pai-bad-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, "pai-helper", {"question": "no prompt"})
    assert loop.run(run_id, deps) == RunStatus.FAILED
    assert "{'prompt': a non-empty string}" in (deps.store.get(run_id).error or "")  # type: ignore[union-attr]


# -- human in the loop: a tool that needs approval waits for a signal ---------------------
def _refund_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    prompt = str(messages[0].parts[-1].content)  # type: ignore[union-attr]
    made[prompt].append("model")
    if not any(m.kind == "response" for m in messages):
        return ModelResponse(parts=[ToolCallPart("refund", {"cents": 500}, tool_call_id="r1")])
    return ModelResponse(parts=[TextPart("refund handled")])


approver = Agent(
    FunctionModel(_refund_script),
    name="approver",
    output_type=[str, DeferredToolRequests],
    capabilities=[CairnDurability()],
)


@approver.tool_plain(requires_approval=True)
def refund(cents: int) -> str:
    ctx = cairn.current()
    assert ctx is not None
    made[ctx.input["prompt"]].append(f"refund {cents}")
    return f"refunded {cents}"


agent_workflow("pai-approver", approver)


def test_a_tool_that_needs_approval_waits_for_a_signal_holding_no_worker(
    deps: loop.Deps,
) -> None:
    prompt = f"refund me {uuid.uuid4().hex}"
    run_id = _start(deps, "pai-approver", prompt)
    assert loop.run(run_id, deps) == RunStatus.WAITING
    run = deps.store.get(run_id)
    assert run is not None and run.state["pending"]["approvals"][0]["tool_call_id"] == "r1"
    assert made[prompt] == ["model"]
    # A malformed answer loses nothing: the run waits on, saying why.
    deps.store.signal(run_id, APPROVAL, {"approve": "yes"}, "s1")
    assert loop.run(run_id, deps) == RunStatus.WAITING
    assert "an approval signal wants" in deps.store.get(run_id).state["rejected"]  # type: ignore[union-attr]
    deps.store.signal(run_id, APPROVAL, {"approvals": {"r1": True}}, "s2")
    assert loop.run(run_id, deps) == RunStatus.DONE
    run = deps.store.get(run_id)
    assert run is not None and run.state["output"] == "refund handled"
    assert run.state["pending"] is None
    # The first request was not made again: the conversation came from the window.
    assert made[prompt] == ["model", "refund 500", "model"]
    assert run.state["usage"]["requests"] == 2


def test_a_denied_tool_is_not_run(deps: loop.Deps) -> None:
    prompt = f"refund denied {uuid.uuid4().hex}"
    run_id = _start(deps, "pai-approver", prompt)
    assert loop.run(run_id, deps) == RunStatus.WAITING
    deps.store.signal(run_id, APPROVAL, {"approvals": {"r1": False}}, "s1")
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert made[prompt] == ["model", "model"]


# -- the Anthropic agent: the real SDK, a keyed HTTP effect and a ctx.db write ------------
@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> ModelServer:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", MODEL.url)
    return MODEL


def test_the_agent_s_client_is_the_one_for_the_address_set_at_request_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whoever imported tests.helpers.pai_flows first, and whatever the environment was then, a
    request goes where ANTHROPIC_BASE_URL says now, and nowhere without it."""
    provider = pai_flows.agent.model.provider  # type: ignore[union-attr]
    monkeypatch.setenv("ANTHROPIC_BASE_URL", MODEL.url)
    assert provider.base_url.rstrip("/") == MODEL.url.rstrip("/")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    assert provider.base_url.rstrip("/") == "http://127.0.0.1:9"
    monkeypatch.delenv("ANTHROPIC_BASE_URL")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="set ANTHROPIC_BASE_URL"):
        provider.client  # noqa: B018  (the property is the check)


@pytest.mark.parametrize(("when", "pos"), [("after", 2), ("after", 3), ("after", 5), ("before", 8)])
def test_an_anthropic_agent_with_an_http_effect_and_a_db_write_survives_a_kill(
    store: Any,
    leases: Any,
    settings: Settings,
    mail: Any,
    sql: Any,
    stand_in: ModelServer,
    when: str,
    pos: int,
) -> None:
    deps = loop.Deps(settings=settings, store=store, leases=leases, model=None)
    MODEL.control(reset=True)
    run_id = _start(deps, "pai_support", f"TOOLS: {pai_flows.PLAN}\nHelp me, please.")
    with pytest.raises(ProcessDied):
        loop.run(run_id, _killed(deps, when, pos))
    assert _redeliver(run_id, deps) == RunStatus.DONE
    journal = store.journal(run_id, "agent", 0)
    names = [c.name.split("__")[-1] for c in journal]
    assert names == [
        "model.request", "<agent>.call_tool:lookup",
        "model.request", "<agent>.call_tool:notify",
        "model.request", "<agent>.call_tool:remember",
        "model.request", "<agent>.call_tool:lookup",
        "model.request",
    ]  # fmt: skip
    # The stand-in was asked once per request, and once more only for a request a kill
    # cut short after it was answered.
    cut_short = when == "after" and names[pos] == "model.request"
    assert MODEL.stats()["requests"] == 5 + int(cut_short)
    notify_key = f"cairn:{run_id}:agent:0:{journal[3].name}:0"
    assert [m["idempotency_key"] for m in mail.messages()] == [notify_key]  # delivered once
    remember_key = f"cairn:{run_id}:agent:0:{journal[5].name}:0"
    assert sql("SELECT idempotency_key FROM invoice_ledger WHERE run_id = %s", run_id) == [
        (remember_key,)
    ]  # the row committed with its call's record: once, not lost
    run = store.get(run_id)
    assert run.cost_usd == pytest.approx(sum(c.cost_usd for c in journal)) and run.cost_usd > 0
    assert run.state["usage"]["requests"] == 5 and run.state["usage"]["tool_calls"] == 4


# -- an agent on pydantic-ai's OpenAI model: the worker's limiter and prices --------------
OPENAI_KEY = "sk-test-pai-openai"  # the stand-in takes any key; the limiter keys on its hash


def _openai_agent() -> Agent[None, str]:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=MODEL.openai_url, api_key=OPENAI_KEY)
    agent = Agent(
        OpenAIChatModel("gpt-4o-mini", provider=provider),
        name="pai_openai",
        capabilities=[CairnDurability()],
    )

    @agent.tool_plain
    def lookup(query: str) -> str:
        return f"help page about {query}"

    return agent


agent_workflow("pai-openai", _openai_agent())


def test_an_openai_agent_s_requests_go_through_the_fleet_s_limiter_and_prices(
    store: Any, leases: Any, settings: Settings
) -> None:
    """pydantic-ai's OpenAIChatModel through the real openai SDK: each request booked with
    the worker's limiter (real Redis) under openai, its model and its key's hash, the
    unused tokens given back, and priced by OpenAI's table, cached tokens at their price."""
    from cairn.steps.model import ModelClient, cost_of
    from cairn.store.ratelimit import Limit, account
    from tests.helpers.limits import Booked

    limiter = Booked(leases.client, limits={"openai:gpt-4o-mini": Limit(rpm=1000, tpm=10**6)})
    model = ModelClient(
        openai_base_url=MODEL.openai_url, openai_api_key=OPENAI_KEY, limiter=limiter
    )
    deps = loop.Deps(settings=settings, store=store, leases=leases, model=model)
    MODEL.control(reset=True)
    try:
        run_id = _start(deps, "pai-openai", "TOOLS: lookup\nCACHED: 8\nWhere is parcel 42?")
        assert loop.run(run_id, deps) == RunStatus.DONE
    finally:
        model.close()
    assert MODEL.stats()["by_api"]["chat.completions"]["requests"] == 2  # the tool, the answer
    who = account(OPENAI_KEY)
    assert [t[:3] for t in limiter.takes] == [("openai", "gpt-4o-mini", who)] * 2
    assert all(t[3] > 0 for t in limiter.takes)  # its prompt and most output, booked
    assert [s[:3] for s in limiter.settles] == [("openai", "gpt-4o-mini", who)] * 2
    journal = [c for c in store.journal(run_id, "agent", 0) if c.name.endswith("model.request")]
    assert len(journal) == 2
    for call in journal:  # OpenAI's price for the model, the cache's tokens at its own
        usage = call.result["usage"]
        assert usage["cache_read_tokens"] == 8
        cached, fresh = 8, usage["input_tokens"] - 8
        expected = (fresh * 0.15 + cached * 0.075 + usage["output_tokens"] * 0.60) / 1e6
        assert call.cost_usd == pytest.approx(expected)
        assert call.cost_usd == pytest.approx(cost_of("gpt-4o-mini", usage, "openai"))
    run = store.get(run_id)
    assert run.cost_usd == pytest.approx(sum(c.cost_usd for c in journal)) and run.cost_usd > 0


def test_a_compacted_window_is_still_a_conversation_the_agent_can_go_on_with() -> None:
    from cairn.pydantic_ai import messages_of
    from cairn.steps.window import compact

    clock = ManualClock()
    deps = loop.Deps(
        settings=SETTINGS, store=MemoryStore(clock), leases=MemoryLeases(clock), model=None
    )
    run_id = _start(deps, "pai-helper", f"long {uuid.uuid4().hex}")
    assert loop.run(run_id, deps) == RunStatus.DONE
    window = list(deps.store.load(run_id).window)  # type: ignore[union-attr]
    compacted = compact(window, budget_tokens=10, keep_last=2)
    assert len(compacted) < len(window) and compacted[0]["role"] == "user"
    assert "[Summary of the earlier conversation]" in compacted[0]["content"]
    history = messages_of(compacted)
    assert [m.kind for m in history] == ["request", "response"]  # the tail opens on a reply
    result = asyncio.run(helper.run("and then?", message_history=history))
    assert result.output.startswith("answer after")


# -- streaming: the agent's text as token events ------------------------------------------
asked: list[str] = []


async def _stream_script(messages: list[ModelMessage], info: AgentInfo) -> Any:
    asked.append("stream")
    for word in ("streamed ", "from ", "the ", "agent"):
        yield word


streamer = Agent(
    FunctionModel(stream_function=_stream_script),
    name="streamer",
    capabilities=[CairnDurability(event_stream_handler=stream_tokens)],
)
agent_workflow("pai-streamer", streamer)


def test_an_agents_text_streams_as_token_events_and_a_replay_streams_nothing() -> None:
    from cairn.client.events import follow
    from cairn.testing import MemoryEvents
    from cairn.workers.outbox import Outbox

    clock = ManualClock()
    store, leases = MemoryStore(clock), MemoryLeases(clock)
    outbox = Outbox(MemoryEvents(leases, clock), SETTINGS)
    deps = loop.Deps(settings=SETTINGS, store=store, leases=leases, model=None, events=outbox)
    asked.clear()
    run_id = _start(deps, "pai-streamer", "hello")

    class DieBeforeSave(Middleware):
        def after_effect(self, cp: Checkpoint) -> None:
            raise ProcessDied

    with pytest.raises(ProcessDied):  # killed after the request's record, before the save
        loop.run(run_id, dataclasses.replace(deps, middleware=Chain([DieBeforeSave()])))
    assert _redeliver(run_id, deps) == RunStatus.DONE
    outbox.flush()
    events = list(follow(store, outbox.log, run_id, until=time.monotonic() + 5))
    tokens = [e for e in events if e.kind == "token"]
    assert "".join(e.data["text"] for e in tokens) == "streamed from the agent"
    assert {e.data["call"] for e in tokens} == {0}  # the model request's journal place
    assert len({e.attempt for e in tokens}) == 1  # the replay streamed nothing again
    assert asked == ["stream"]
    run = store.get(run_id)
    assert run is not None and run.state["output"] == "streamed from the agent"


def test_each_request_tool_call_and_the_output_are_on_the_run_page(
    store: Any, leases: Any, settings: Settings
) -> None:
    from fastapi.testclient import TestClient

    from cairn.web.api import create_app

    deps = loop.Deps(settings=settings, store=store, leases=leases, model=None)
    run_id = _start(deps, "pai-helper", f"page {uuid.uuid4().hex}")
    assert loop.run(run_id, deps) == RunStatus.DONE
    token = uuid.uuid4().hex
    app = create_app(dataclasses.replace(settings, api_token=token))
    with TestClient(app, follow_redirects=True) as http:
        bearer = {"Authorization": f"Bearer {token}"}
        calls = http.get(f"/runs/{run_id}/calls", headers=bearer).json()["calls"]
        assert [c["name"] for c in calls] == NAMES
        assert calls[1]["result"] == {"result": "page about fencing", "kind": "tool_return"}
        assert http.get("/runs/nope/calls", headers=bearer).status_code == 404
        login(http, token)
        page = http.get(f"/ui/runs/{run_id}").text
    assert "5 journaled" in page and "call_tool:notify" in page
    assert "page about fencing" in page and "answer after 2 tools" in page  # a tool; the output


# -- steering: messages sent while the agent works reach its next request -----------------
def _steer_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Two lookups, then an answer naming every user prompt the model was shown."""
    prompts = [str(p.content) for m in messages for p in m.parts if p.part_kind == "user-prompt"]
    made[prompts[0]].append("model:" + "|".join(prompts[1:]))
    turn = sum(1 for m in messages if m.kind == "response")
    if turn < 2:
        return ModelResponse(parts=[ToolCallPart("consult", {"turn": turn})])
    return ModelResponse(parts=[TextPart("heard: " + "|".join(prompts[1:]))])


steered = Agent(
    FunctionModel(_steer_script), name="steered", capabilities=[CairnDurability(steer=True)]
)
_steer_clients: dict[str, cairn.Client] = {}


@steered.tool_plain
def consult(turn: int) -> str:
    ctx = cairn.current()
    assert ctx is not None
    if turn == 0:  # the user types while the agent's first tool runs
        _steer_clients[ctx.run_id].steer(ctx.run_id, {"role": "user", "content": "in French"})
    return f"page {turn}"


agent_workflow("pai-steered", steered)


def test_a_steer_message_reaches_the_agent_s_next_request_once_across_a_kill(
    deps: loop.Deps,
) -> None:
    prompt = f"explain fencing {uuid.uuid4().hex}"
    run_id = _start(deps, "pai-steered", prompt)
    client = _steer_clients[run_id] = cairn.Client(
        settings=deps.settings, store=deps.store, send=lambda run_id, priority: None
    )
    client.steer(run_id, "keep it short")  # before the first request
    # Killed as the second request returned, before its record (journal: messages,
    # request, tool, messages, request, ...): the replay takes in the same messages at the
    # same places from the journal, and makes that request again with the same prompts.
    with pytest.raises(ProcessDied):
        loop.run(run_id, _killed(deps, "after", 4))
    assert _redeliver(run_id, deps) == RunStatus.DONE

    run = deps.store.get(run_id)
    assert run is not None
    assert run.state["output"] == "heard: keep it short|in French"
    # What the model was shown at each request: the second twice (the kill cut it before
    # its record), the same both times; "in French" came once, though read again.
    assert made[prompt] == [
        "model:keep it short",
        "model:keep it short|in French",
        "model:keep it short|in French",
        "model:keep it short|in French",
    ]
    window = deps.store.load(run_id).window  # type: ignore[union-attr]
    prompts = [p["content"] for m in window for p in m["parts"] if p["part_kind"] == "user-prompt"]
    assert prompts == [prompt, "keep it short", "in French"]  # in the conversation once each


def test_the_inbox_lists_the_deferred_call_and_an_edit_runs_it_with_its_args(
    deps: loop.Deps,
) -> None:
    client = Client(settings=deps.settings, store=deps.store, send=lambda run_id, priority: None)
    prompt = f"refund via the inbox {uuid.uuid4().hex}"
    run_id = _start(deps, "pai-approver", prompt)
    assert loop.run(run_id, deps) == RunStatus.WAITING
    [asked] = [a for a in client.approvals(workflow="pai-approver") if a.run_id == run_id]
    assert (asked.event, asked.tool, asked.request["args"]) == (APPROVAL, "refund", {"cents": 500})
    assert asked.request["calls"][0]["tool_call_id"] == "r1"
    client.decide(asked.approval_id, "edit", args={"cents": 300}, by="ops@acme")
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert made[prompt] == ["model", "refund 300", "model"]


CUT_SLOW = 6.0  # how long the stand-in takes over a request the test cuts


def _wait(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_an_interrupting_message_cuts_the_request_in_flight_and_it_is_made_again_with_it(
    store: Any, leases: Any, settings: Settings, stand_in: ModelServer
) -> None:
    deps = loop.Deps(settings=settings, store=store, leases=leases, model=None)
    client = Client(settings=settings, store=store, send=lambda run_id, priority: None)
    prompt = f"Explain fencing. {uuid.uuid4().hex}"
    run_id = _start(deps, "pai_cut_short", prompt)
    client.steer(run_id, "keep it short")  # queued: read before the first request
    MODEL.control(reset=True, delay_ms=int(CUT_SLOW * 1000))  # the first request takes a while
    # Killed as the request made again returned, before its record (journal: messages,
    # request (cut), messages, request).
    killed = _killed(deps, "after", 3)
    died: list[BaseException] = []

    def work() -> None:
        try:
            loop.run(run_id, killed)
        except ProcessDied as exc:
            died.append(exc)

    runner = threading.Thread(target=work)
    started = time.monotonic()
    runner.start()
    try:
        _wait(lambda: MODEL.stats()["requests"] == 1, "the first request")
    finally:
        MODEL.control(delay_ms=0)  # the request made again answers at once
    client.steer(run_id, "in French", interrupt=True)
    runner.join(CUT_SLOW)
    assert died and time.monotonic() - started < CUT_SLOW / 2  # cut, not answered
    client.steer(run_id, "too late")  # after the read the replay finds in the journal
    assert _redeliver(run_id, deps) == RunStatus.DONE

    # What the model was sent: the cut request; the one made again, with the message that
    # cut it once at the end; the replay's, the same (the cut and the read from the journal).
    said = [
        [b["text"] for m in body["messages"] if m["role"] == "user" for b in _blocks(m)]
        for body in MODEL.received()
    ]
    first, again = [prompt, "keep it short"], [prompt, "keep it short", "in French"]
    assert said == [first, again, again]
    journal = store.journal(run_id, "agent", 0)
    names = [c.name.split("__")[-1] for c in journal]
    assert names == [READ, "model.request", READ, "model.request"]
    assert journal[1].error is not None and journal[1].error["type"] == "CallInterrupted"
    assert journal[1].cost_usd > 0  # its worst case, as ctx.model's cut counts
    # The stand-in acks the user's turn as sent: the answer is the one to the new message.
    answer = "ack: " + "\n".join(again)
    run = store.get(run_id)
    assert run is not None and run.state["output"] == answer
    window = store.load(run_id).window
    prompts = [p["content"] for m in window for p in m["parts"] if p["part_kind"] == "user-prompt"]
    assert prompts == again  # in the conversation once each
    answers = [p["content"] for m in window for p in m["parts"] if p["part_kind"] == "text"]
    assert answers == [answer]  # the cut request's answer is in no part of it


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    return [{"text": content}] if isinstance(content, str) else [b for b in content if "text" in b]
