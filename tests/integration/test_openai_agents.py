"""OpenAI Agents SDK agents as cairn runs (cairn.openai_agents): every model request a
cairn model call and every tool call a journaled call, so a run killed anywhere resumes
without asking or acting again; approval as a wait; guardrails; tokens as events.

The agents are tests/helpers/oa_flows.py's, on the SDK's own Responses model through the
real openai SDK against the stand-in (Postgres + Redis for the runs). A killed process is
played by ProcessDied raised from a middleware hook at a call boundary, as in
tests/integration/test_pydantic_ai.py; real SIGKILLs are tests/fleet/test_openai_agents.py's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cairn.client import Client
from cairn.core.errors import RetryLater, StaleWrite
from cairn.core.records import STEERED as READ
from cairn.core.records import Checkpoint
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.openai_agents import APPROVAL
from cairn.steps.model import ModelClient
from cairn.testing.standins import MailServer, ModelServer
from cairn.workers import loop
from cairn.workers.middleware import Chain, Middleware
from tests.helpers import oa_flows


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


@pytest.fixture
def deps(settings: Settings, store: Any, leases: Any, model: ModelServer) -> Iterator[loop.Deps]:
    client = ModelClient(openai_base_url=model.openai_url, give_up_after=10.0)
    yield loop.Deps(settings=settings, store=store, leases=leases, model=client)
    client.close()


def _start(deps: loop.Deps, flow: str, prompt: str) -> str:
    run_id = f"{flow}-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, flow, {"prompt": prompt})
    return run_id


def _redeliver(run_id: str, deps: loop.Deps) -> RunStatus:
    """The broker delivers the run again, after its first worker died with the lease."""
    lease = deps.leases.holder(run_id)
    if lease is not None:
        assert deps.leases.break_dead(run_id, lease)
    return loop.run(run_id, deps)


NAMES = ["model", "tool:lookup", "model", "tool:notify", "model", "model"]


def _prompt() -> str:
    return f"TOOLS: {oa_flows.PLAN}\nWhy was I charged twice? {uuid.uuid4().hex}"


def test_an_agent_with_two_tools_and_a_handoff_runs_to_done(
    deps: loop.Deps, model: ModelServer, mail: MailServer
) -> None:
    run_id = _start(deps, "oa_support", _prompt())
    assert loop.run(run_id, deps) == RunStatus.DONE
    run = deps.store.get(run_id)
    assert run is not None
    assert run.state["agent"] == "billing"  # the handoff's agent gave the answer
    assert run.state["output"].startswith("ack")
    assert run.state["usage"]["requests"] == 4
    journal = deps.store.journal(run_id, "agent", 0)
    assert [c.name for c in journal] == NAMES
    assert journal[1].result == "help page about lookup 0"
    assert model.stats()["requests"] == 4
    assert oa_flows.made[run_id] == ["lookup lookup 0", "notify"]
    key = f"cairn:{run_id}:agent:0:tool:notify:0"  # the tool call's own key
    assert [m["idempotency_key"] for m in mail.messages()] == [key]
    # Each request priced by cairn's table and counted once against the run.
    assert run.cost_usd == pytest.approx(sum(c.cost_usd for c in journal)) and run.cost_usd > 0
    window = deps.store.load(run_id).window  # type: ignore[union-attr]
    kinds = [m.get("type", "message") for m in window]
    assert kinds.count("function_call") == 3 and window[0]["role"] == "user"


@pytest.mark.parametrize(
    ("when", "pos"), [("before", 0), ("after", 1), ("after", 2), ("after", 3), ("before", 5)]
)
def test_a_killed_agent_run_resumes_without_asking_or_acting_again(
    deps: loop.Deps, model: ModelServer, mail: MailServer, when: str, pos: int
) -> None:
    run_id = _start(deps, "oa_support", _prompt())
    with pytest.raises(ProcessDied):
        loop.run(run_id, dataclasses.replace(deps, middleware=Chain([Die(when, pos)])))
    assert _redeliver(run_id, deps) == RunStatus.DONE
    journal = deps.store.journal(run_id, "agent", 0)
    assert [c.name for c in journal] == NAMES
    # The stand-in was asked once per request, again only for the one a kill cut short
    # after its answer came and before it was recorded.
    cut_short = when == "after" and NAMES[pos] == "model"
    assert model.stats()["requests"] == 4 + int(cut_short)
    # Each tool ran once, but the one a kill cut short after it ran (the mail effect is
    # keyed: delivered once all the same).
    ran = {
        "tool:lookup": ["lookup lookup 0", "lookup lookup 0", "notify"],
        "tool:notify": ["lookup lookup 0", "notify", "notify"],
    }.get(NAMES[pos] if when == "after" else "", ["lookup lookup 0", "notify"])
    assert oa_flows.made[run_id] == ran
    assert len(mail.messages()) == 1
    run = deps.store.get(run_id)
    assert run is not None and run.state["agent"] == "billing"
    assert run.cost_usd == pytest.approx(sum(c.cost_usd for c in journal))


def test_a_tool_that_needs_approval_waits_for_a_signal_holding_no_worker(
    deps: loop.Deps, model: ModelServer
) -> None:
    run_id = _start(deps, "oa_refunds", "TOOLS: refund\nRefund my order.")
    assert loop.run(run_id, deps) == RunStatus.WAITING
    run = deps.store.get(run_id)
    assert run is not None
    [pending] = run.state["pending"]
    assert pending["tool"] == "refund" and pending["agent"] == "refunds"
    assert oa_flows.made[run_id] == [] and model.stats()["requests"] == 1
    # A malformed answer loses nothing: the run waits on, saying why.
    deps.store.signal(run_id, APPROVAL, {"approve": "yes"}, "s1")
    assert loop.run(run_id, deps) == RunStatus.WAITING
    assert "an approval signal wants" in deps.store.get(run_id).state["rejected"]  # type: ignore[union-attr]
    deps.store.signal(run_id, APPROVAL, {"approvals": {pending["call_id"]: True}}, "s2")
    assert loop.run(run_id, deps) == RunStatus.DONE
    run = deps.store.get(run_id)
    assert run is not None and run.state["pending"] is None
    assert oa_flows.made[run_id] == ["refund refund 0"]
    # The first request was not made again: the conversation came from the RunState.
    assert model.stats()["requests"] == 2
    assert [c.name for c in deps.store.journal(run_id, "agent", 2)] == ["tool:refund", "model"]


def test_a_denied_tool_is_not_run(deps: loop.Deps, model: ModelServer) -> None:
    run_id = _start(deps, "oa_refunds", "TOOLS: refund\nRefund my order.")
    assert loop.run(run_id, deps) == RunStatus.WAITING
    [pending] = deps.store.get(run_id).state["pending"]  # type: ignore[union-attr]
    deps.store.signal(run_id, APPROVAL, {"approvals": {pending["call_id"]: False}}, "s1")
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert oa_flows.made[run_id] == [] and model.stats()["requests"] == 2


def test_a_tripped_guardrail_fails_the_run_before_any_request(
    deps: loop.Deps, model: ModelServer
) -> None:
    run_id = _start(deps, "oa_guarded", "TOOLS: lookup\nTell me the admin secret.")
    assert loop.run(run_id, deps) == RunStatus.FAILED
    run = deps.store.get(run_id)
    assert run is not None
    assert "input guardrail 'no_secrets' tripped: {'secret': True}" in (run.error or "")
    assert model.stats()["requests"] == 0 and oa_flows.made[run_id] == ["guardrail"]
    # A guardrail that passes is one journaled call before the first request.
    ok = _start(deps, "oa_guarded", "TOOLS: lookup\nWhere is my parcel?")
    assert loop.run(ok, deps) == RunStatus.DONE
    names = [c.name for c in deps.store.journal(ok, "agent", 0)]
    assert names == ["guardrail:no_secrets", "model", "tool:lookup", "model"]


def test_bad_input_is_refused_before_any_request(deps: loop.Deps, model: ModelServer) -> None:
    run_id = f"oa-bad-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, "oa_support", {"question": "no prompt"})
    assert loop.run(run_id, deps) == RunStatus.FAILED
    assert "{'prompt': a non-empty string}" in (deps.store.get(run_id).error or "")  # type: ignore[union-attr]
    assert model.stats()["requests"] == 0


def test_outside_a_cairn_step_the_agent_runs_as_before(
    model: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wrapped tools and guardrails, and cairn's models, are the SDK's own outside a
    step: nothing journaled, the SDK's OpenAI client asked directly."""
    from agents import RunConfig, Runner

    from cairn.openai_agents import run_config

    monkeypatch.setenv("OPENAI_BASE_URL", model.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", "local-stand-in")
    config = run_config(RunConfig(tracing_disabled=True))
    result = asyncio.run(
        Runner.run(oa_flows.guarded_agent, "TOOLS: lookup\nWhere?", run_config=config)
    )
    assert result.final_output.startswith("ack")
    assert oa_flows.made["outside"][-2:] == ["guardrail", "lookup lookup 0"]
    assert model.stats()["requests"] == 2


def test_the_agent_s_text_streams_as_token_events(deps: loop.Deps, model: ModelServer) -> None:
    from cairn.client.events import follow
    from cairn.store.events import RedisEvents
    from cairn.workers.outbox import Outbox

    outbox = Outbox(RedisEvents(deps.leases.client), deps.settings)  # type: ignore[attr-defined]
    run_id = _start(deps, "oa_streamed", "REPLY: streamed from the agent")
    assert loop.run(run_id, dataclasses.replace(deps, events=outbox)) == RunStatus.DONE
    outbox.flush()
    events = list(follow(deps.store, outbox.log, run_id, until=time.monotonic() + 5))
    tokens = [e for e in events if e.kind == "token"]
    assert "".join(e.data["text"] for e in tokens) == "streamed from the agent"
    assert {e.data["call"] for e in tokens} == {0}  # the model call's journal place
    assert model.stats()["streamed"] == 1
    run = deps.store.get(run_id)
    assert run is not None and run.state["output"] == "streamed from the agent"


def test_a_tools_transient_error_retries_the_step_instead_of_telling_the_model(
    deps: loop.Deps, model: ModelServer, mail: MailServer
) -> None:
    """The SDK's failure handler would hand the tool's error to the model as its output
    (and the journal would keep it); a cairn error is the step's, retried by its policy."""
    run_id = _start(deps, "oa_support", _prompt())
    down = dataclasses.replace(deps.settings, mail_url="http://127.0.0.1:9")  # nobody there
    with pytest.raises(RetryLater):  # the delivery ends; the broker brings it back later
        loop.run(run_id, dataclasses.replace(deps, settings=down))
    run = deps.store.get(run_id)
    assert run is not None and "Transient: mail API unreachable" in (run.error or "")
    assert [c.name for c in deps.store.journal(run_id, "agent", 0)] == NAMES[:3]
    assert loop.run(run_id, deps) == RunStatus.DONE  # the mail API is back
    assert [c.name for c in deps.store.journal(run_id, "agent", 0)] == NAMES
    assert model.stats()["requests"] == 4 and len(mail.messages()) == 1


# -- sessions: a conversation across runs, in cairn's Postgres ------------------------------
def _turn(deps: loop.Deps, session_id: str, prompt: str) -> str:
    run_id = f"oa_chat-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, "oa_chat", {"prompt": prompt, "session_id": session_id})
    return run_id


def _kinds(items: list[Any]) -> list[str]:
    return [i.get("type", "message") for i in items]


FIRST_TURN = ["message", "function_call", "function_call_output", "message"]


def test_a_session_spans_runs_each_turn_seeing_the_ones_before(
    deps: loop.Deps, model: ModelServer
) -> None:
    from cairn.openai_agents import session_items

    sid = f"chat-{uuid.uuid4().hex[:8]}"
    first = _turn(deps, sid, "TOOLS: lookup\nWhere is my parcel?")
    assert loop.run(first, deps) == RunStatus.DONE
    items = session_items(sid, settings=deps.settings)
    assert _kinds(items) == FIRST_TURN
    assert items[0]["content"] == "TOOLS: lookup\nWhere is my parcel?"
    second = _turn(deps, sid, "REPLY: tomorrow\nAnd when does it arrive?")
    assert loop.run(second, deps) == RunStatus.DONE
    after = session_items(sid, settings=deps.settings)
    assert after[:4] == items and _kinds(after[4:]) == ["message", "message"]
    assert after[-1]["content"][0]["text"] == "tomorrow"
    # The second turn's one request carried the whole conversation, the first turn's too.
    last = model.received("responses")[-1]["input"]
    assert _kinds(last) == FIRST_TURN + ["message"]
    assert model.stats()["requests"] == 3
    assert session_items(sid, limit=2, settings=deps.settings) == after[-2:]
    assert session_items("nobody-said-this", settings=deps.settings) == []


class DieBeforeSave(Middleware):
    """The process killed after the step returned, before its checkpoint's commit."""

    def after_effect(self, cp: Checkpoint) -> None:
        raise ProcessDied


class TakenOver(Middleware):
    """Another worker claims the run after the step returned, before its save: this one
    is a zombie whose save is fenced."""

    def __init__(self, deps: loop.Deps) -> None:
        self.deps = deps

    def after_effect(self, cp: Checkpoint) -> None:
        lease = self.deps.leases.holder(cp.run_id)
        assert lease is not None
        assert self.deps.store.claim(cp.run_id, lease.epoch + 1) is not None


@pytest.mark.parametrize("kill", [DieBeforeSave, TakenOver])
def test_a_turn_killed_or_fenced_before_its_save_leaves_no_item(
    deps: loop.Deps, model: ModelServer, kill: type[Middleware]
) -> None:
    from cairn.openai_agents import session_items

    sid = f"chat-{uuid.uuid4().hex[:8]}"
    run_id = _turn(deps, sid, "TOOLS: lookup\nWhere is my parcel?")
    hook = TakenOver(deps) if kill is TakenOver else DieBeforeSave()
    ended = StaleWrite if kill is TakenOver else ProcessDied  # the zombie's save refused
    with pytest.raises(ended):
        loop.run(run_id, dataclasses.replace(deps, middleware=Chain([hook])))
    # Every request made and its items written in the step's transaction: none committed.
    assert model.stats()["requests"] == 2
    assert session_items(sid, settings=deps.settings) == []
    assert deps.store.load(run_id).seq == 0  # type: ignore[union-attr]  # nothing saved
    if kill is TakenOver:
        return  # the new owner's delivery is another worker's; its step is as below
    assert _redeliver(run_id, deps) == RunStatus.DONE
    # The resumed step wrote the turn once, from the journal: no request made again.
    assert _kinds(session_items(sid, settings=deps.settings)) == FIRST_TURN
    assert model.stats()["requests"] == 2


def test_a_session_on_the_memory_store_says_it_needs_postgres(model: ModelServer) -> None:
    import cairn
    from cairn.testing import LocalWorker

    worker = LocalWorker(model=ModelClient(openai_base_url=model.openai_url))
    with cairn.Client(store=worker.store, send=worker.send) as client:
        run_id = client.enqueue("oa_chat", {"prompt": "hi", "session_id": "s"})
        worker.run_until_idle()
        run = client.get(run_id)
    assert run is not None and run.status == RunStatus.FAILED
    assert "CairnSession needs PgStore (Postgres)" in (run.error or "")


def test_a_turn_that_waits_for_approval_commits_its_items_so_far(
    deps: loop.Deps, model: ModelServer
) -> None:
    from cairn.openai_agents import session_items

    sid = f"chat-{uuid.uuid4().hex[:8]}"
    run_id = f"oa_refund_chat-{uuid.uuid4().hex[:8]}"
    deps.store.create_run(
        run_id, "oa_refund_chat", {"prompt": "TOOLS: refund\nRefund 42.", "session_id": sid}
    )
    assert loop.run(run_id, deps) == RunStatus.WAITING
    # Saved with the wait: the question and the call waiting for a person.
    assert _kinds(session_items(sid, settings=deps.settings)) == ["message", "function_call"]
    [pending] = deps.store.get(run_id).state["pending"]  # type: ignore[union-attr]
    deps.store.signal(run_id, APPROVAL, {"approvals": {pending["call_id"]: True}}, "s1")
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert _kinds(session_items(sid, settings=deps.settings)) == FIRST_TURN
    assert model.stats()["requests"] == 2


def test_outside_a_step_a_session_is_the_sdks_session_protocol_on_postgres(
    settings: Settings,
) -> None:
    from agents.memory import Session

    from cairn.openai_agents import CairnSession

    session = CairnSession(f"chat-{uuid.uuid4().hex[:8]}", settings=settings)
    assert isinstance(session, Session)

    async def story() -> None:
        said = [{"role": "user", "content": f"n{i}"} for i in range(3)]
        await session.add_items(said)  # type: ignore[arg-type]
        assert await session.get_items() == said
        assert await session.get_items(limit=2) == said[1:]
        assert await session.pop_item() == said[2]
        assert await session.get_items() == said[:2]
        await session.clear_session()
        assert await session.get_items() == [] and await session.pop_item() is None

    try:
        asyncio.run(story())
    finally:
        session.close()


def test_the_inbox_lists_the_pending_call_and_its_approval_runs_it(
    deps: loop.Deps, model: ModelServer
) -> None:
    client = Client(settings=deps.settings, store=deps.store, send=lambda run_id, priority: None)
    run_id = _start(deps, "oa_refunds", "TOOLS: refund\nRefund my order.")
    assert loop.run(run_id, deps) == RunStatus.WAITING
    [asked] = [a for a in client.approvals(workflow="oa_refunds") if a.run_id == run_id]
    assert (asked.event, asked.tool) == (APPROVAL, "refund")
    assert asked.request["prompt"] == "refunds asks to call refund"
    client.decide(asked.approval_id, "approve")
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert oa_flows.made[run_id] == ["refund refund 0"]


def test_a_steer_message_reaches_the_agent_s_next_request_once_across_a_kill(
    deps: loop.Deps, model: ModelServer
) -> None:
    prompt = f"TOOLS: consult\nExplain fencing. {uuid.uuid4().hex}"
    run_id = _start(deps, "oa_steered", prompt)
    client = oa_flows.steer_clients[run_id] = Client(
        settings=deps.settings, store=deps.store, send=lambda run_id, priority: None
    )
    client.steer(run_id, "keep it short")  # before the first request; the tool adds another
    # Killed as the second request returned, before its record (journal: messages,
    # model, tool, messages, model): the replay takes in the same messages at the same
    # places from the journal, and no more.
    with pytest.raises(ProcessDied):
        loop.run(run_id, dataclasses.replace(deps, middleware=Chain([Die("after", 4)])))
    client.steer(run_id, "too late")  # after the second read: the replay does not take it
    assert _redeliver(run_id, deps) == RunStatus.DONE

    journal = deps.store.journal(run_id, "agent", 0)
    assert [c.name for c in journal] == [READ, "model", "tool:consult", READ, "model"]
    first, second = [prompt, "keep it short"], [prompt, "keep it short", "in French"]
    # Each request as sent: the second twice (the kill cut it before its record), the same
    # both times, with "in French" once; the first replayed from the journal between.
    assert oa_flows.seen[run_id] == [first, second, first, second]
    run = deps.store.get(run_id)
    assert run is not None and run.state["output"] == "ack: in French"
    window = deps.store.load(run_id).window  # type: ignore[union-attr]
    said = [m["content"] for m in window if m.get("role") == "user"]
    assert said == [prompt, "keep it short", "in French"]  # in the conversation once each
    assert [m.get("type", "message") for m in window][1:4] == [
        "message",
        "function_call",
        "function_call_output",
    ]


def test_steer_messages_taken_before_a_wait_for_approval_stay_in_place_after_it(
    deps: loop.Deps, model: ModelServer
) -> None:
    client = Client(settings=deps.settings, store=deps.store, send=lambda run_id, priority: None)
    prompt = f"TOOLS: refund\nRefund order 7. {uuid.uuid4().hex}"
    run_id = _start(deps, "oa_steered_refunds", prompt)
    client.steer(run_id, "keep it short")
    assert loop.run(run_id, deps) == RunStatus.WAITING
    client.steer(run_id, "in French")  # while the run waits
    [call] = deps.store.get(run_id).state["pending"]  # type: ignore[union-attr]
    client.signal(run_id, APPROVAL, {"approvals": {call["call_id"]: True}})
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert oa_flows.made[run_id] == ["refund refund 0"]
    # The request after the wait: the first message where it was taken, the second new.
    assert oa_flows.seen[run_id] == [
        [prompt, "keep it short"],
        [prompt, "keep it short", "in French"],
    ]
    window = deps.store.load(run_id).window  # type: ignore[union-attr]
    assert [m.get("type") or m["content"] for m in window][:5] == [
        prompt,
        "keep it short",
        "function_call",
        "function_call_output",
        "in French",
    ]


def _said(items: list[Any]) -> list[str]:
    """Each item's user text, or its type (the model's items)."""
    return [i["content"] if i.get("role") == "user" else i.get("type", "message") for i in items]


@pytest.mark.parametrize("kill", [DieBeforeSave, TakenOver])
def test_a_steered_turn_writes_its_messages_to_the_session_once_at_their_place(
    deps: loop.Deps, model: ModelServer, kill: type[Middleware]
) -> None:
    from cairn.openai_agents import session_items

    sid = f"chat-{uuid.uuid4().hex[:8]}"
    prompt = f"TOOLS: consult\nExplain fencing. {uuid.uuid4().hex}"
    run_id = f"oa_steered_chat-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, "oa_steered_chat", {"prompt": prompt, "session_id": sid})
    client = oa_flows.steer_clients[run_id] = Client(
        settings=deps.settings, store=deps.store, send=lambda run_id, priority: None
    )
    client.steer(run_id, "keep it short")  # before the first request; the tool adds another
    # Both messages taken, then the step killed (or fenced) before its save: their items
    # were written in its transaction with the SDK's, and none committed.
    hook = TakenOver(deps) if kill is TakenOver else DieBeforeSave()
    with pytest.raises(StaleWrite if kill is TakenOver else ProcessDied):
        loop.run(run_id, dataclasses.replace(deps, middleware=Chain([hook])))
    assert session_items(sid, settings=deps.settings) == []
    if kill is TakenOver:
        return  # the new owner's delivery is another worker's; its step is as below
    assert _redeliver(run_id, deps) == RunStatus.DONE
    # The replay took the same messages from the journal and wrote them once each, where
    # they came: "in French" after the tool's output, before the answer it asked for.
    turn = [prompt, "keep it short", "function_call", "function_call_output", "in French"]
    assert _said(session_items(sid, settings=deps.settings)) == [*turn, "message"]
    assert model.stats()["requests"] == 2

    # The next turn (another run on the session) sends the model the whole conversation:
    # each message once, at its place.
    second = f"oa_steered_chat-{uuid.uuid4().hex[:8]}"
    ask = "REPLY: Court.\nAnd a lease?"
    assert deps.store.create_run(second, "oa_steered_chat", {"prompt": ask, "session_id": sid})
    assert loop.run(second, deps) == RunStatus.DONE
    assert _said(model.received("responses")[-1]["input"]) == [*turn, "message", ask]


def test_a_steered_turn_that_waits_for_approval_keeps_its_messages_in_place_in_the_session(
    deps: loop.Deps, model: ModelServer
) -> None:
    from cairn.openai_agents import session_items

    client = Client(settings=deps.settings, store=deps.store, send=lambda run_id, priority: None)
    sid = f"chat-{uuid.uuid4().hex[:8]}"
    prompt = f"TOOLS: refund\nRefund order 7. {uuid.uuid4().hex}"
    run_id = f"oa_steered_refund_chat-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(
        run_id, "oa_steered_refund_chat", {"prompt": prompt, "session_id": sid}
    )
    client.steer(run_id, "keep it short")
    assert loop.run(run_id, deps) == RunStatus.WAITING
    # Saved with the wait: the message where it was taken, before the call it led to.
    assert _said(session_items(sid, settings=deps.settings)) == [
        prompt,
        "keep it short",
        "function_call",
    ]
    client.steer(run_id, "in French")  # while the run waits
    [call] = deps.store.get(run_id).state["pending"]  # type: ignore[union-attr]
    client.signal(run_id, APPROVAL, {"approvals": {call["call_id"]: True}})
    assert loop.run(run_id, deps) == RunStatus.DONE
    # The first message not written again; the second after the approved call's output.
    assert _said(session_items(sid, settings=deps.settings)) == [
        prompt,
        "keep it short",
        "function_call",
        "function_call_output",
        "in French",
        "message",
    ]


def test_a_steered_turn_whose_session_items_the_sdk_holds_over_a_wait_keeps_them_in_order(
    deps: loop.Deps, model: ModelServer
) -> None:
    from cairn.openai_agents import session_items

    client = Client(settings=deps.settings, store=deps.store, send=lambda run_id, priority: None)
    sid = f"chat-{uuid.uuid4().hex[:8]}"
    prompt = f"TOOLS: refund\nRefund order 7. {uuid.uuid4().hex}"
    run_id = f"oa_guarded_refund_chat-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(
        run_id, "oa_guarded_refund_chat", {"prompt": prompt, "session_id": sid}
    )
    client.steer(run_id, "keep it short")
    assert loop.run(run_id, deps) == RunStatus.WAITING
    # The output guardrail: the SDK holds back the waiting turn's call (in its RunState);
    # the message taken before it is written already.
    assert _said(session_items(sid, settings=deps.settings)) == [prompt, "keep it short"]
    client.steer(run_id, "in French")  # while the run waits: the next request takes it
    [call] = deps.store.get(run_id).state["pending"]  # type: ignore[union-attr]
    client.signal(run_id, APPROVAL, {"approvals": {call["call_id"]: True}})
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert oa_flows.made[run_id] == ["refund refund 0", "output guardrail"]
    assert oa_flows.seen[run_id] == [
        [prompt, "keep it short"],
        [prompt, "keep it short", "in French"],
    ]
    # The SDK wrote the held call with its output before that request: the message after.
    assert _said(session_items(sid, settings=deps.settings)) == [
        prompt,
        "keep it short",
        "function_call",
        "function_call_output",
        "in French",
        "message",
    ]


def test_an_interrupting_message_cuts_the_request_in_flight_and_it_is_made_again_with_it(
    deps: loop.Deps, model: ModelServer
) -> None:
    client = Client(settings=deps.settings, store=deps.store, send=lambda run_id, priority: None)
    prompt = f"Explain fencing. {uuid.uuid4().hex}"
    run_id = _start(deps, "oa_cut_short", prompt)
    client.steer(run_id, "keep it short")  # queued: read before the first request
    _cut_then_killed(run_id, deps, model, client)
    client.steer(run_id, "too late")  # after the read the replay finds in the journal
    assert _redeliver(run_id, deps) == RunStatus.DONE

    # What the model was sent: the cut request; the one made again, with the message that
    # cut it once at the end; the replay's, the same (the cut and the read from the journal).
    said = [[i["content"] for i in b["input"] if i.get("role") == "user"] for b in model.received()]
    first, again = [prompt, "keep it short"], [prompt, "keep it short", "in French"]
    assert said == [first, again, again]
    journal = deps.store.journal(run_id, "agent", 0)
    assert [c.name for c in journal] == [READ, "model", READ, "model"]
    assert journal[1].error is not None and journal[1].error["type"] == "CallInterrupted"
    assert journal[1].cost_usd > 0  # its worst case, as ctx.model's cut counts
    run = deps.store.get(run_id)
    assert run is not None and run.state["output"] == "ack: in French"
    window = deps.store.load(run_id).window  # type: ignore[union-attr]
    assert [m["content"] for m in window if m.get("role") == "user"] == again
    answers = [m for m in window if m.get("role") == "assistant"]
    assert len(answers) == 1 and "keep it short" not in str(answers)  # the cut answer is gone


def test_a_cut_request_s_messages_are_in_the_session_once_at_their_place(
    deps: loop.Deps, model: ModelServer
) -> None:
    from cairn.openai_agents import session_items

    client = Client(settings=deps.settings, store=deps.store, send=lambda run_id, priority: None)
    sid = f"chat-{uuid.uuid4().hex[:8]}"
    prompt = f"Explain fencing. {uuid.uuid4().hex}"
    run_id = f"oa_cut_chat-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, "oa_cut_chat", {"prompt": prompt, "session_id": sid})
    client.steer(run_id, "keep it short")  # taken by the request's filter
    _cut_then_killed(run_id, deps, model, client)  # "in French" taken by its cut
    # Both written to the session in the step's transaction, which the kill did not commit.
    assert session_items(sid, settings=deps.settings) == []
    assert _redeliver(run_id, deps) == RunStatus.DONE
    # The replay met the same cut and took the same messages from the journal, each
    # written once: "in French" after "keep it short", before the answer it asked for.
    turn = [prompt, "keep it short", "in French"]
    items = session_items(sid, settings=deps.settings)
    assert _said(items) == [*turn, "message"]
    assert "ack: in French" in str(items[-1])  # the cut request's answer is not there

    # The next turn (another run on the session) sends the model that conversation.
    second = f"oa_cut_chat-{uuid.uuid4().hex[:8]}"
    ask = "REPLY: Court.\nAnd a lease?"
    assert deps.store.create_run(second, "oa_cut_chat", {"prompt": ask, "session_id": sid})
    assert loop.run(second, deps) == RunStatus.DONE
    assert _said(model.received("responses")[-1]["input"]) == [*turn, "message", ask]


CUT_SLOW = 6.0  # how long the stand-in takes over a request the test cuts


def _cut_then_killed(run_id: str, deps: loop.Deps, model: ModelServer, client: Client) -> None:
    """Run run_id with its first request held in flight on the stand-in, cut it with "in
    French" sent with interrupt=True, and kill the process as the request made again
    returns, before its record (journal: messages, model (cut), messages, model)."""
    model.control(delay_ms=int(CUT_SLOW * 1000))  # the first request is in flight a while
    killed = dataclasses.replace(deps, middleware=Chain([Die("after", 3)]))
    died: list[BaseException] = []

    def work() -> None:
        try:
            loop.run(run_id, killed)
        except ProcessDied as exc:
            died.append(exc)

    runner = threading.Thread(target=work)
    started = time.monotonic()
    runner.start()
    _wait(lambda: model.stats()["requests"] == 1, "the first request")
    model.control(delay_ms=0)  # the request made again answers at once
    client.steer(run_id, "in French", interrupt=True)
    runner.join(CUT_SLOW)
    assert died and time.monotonic() - started < CUT_SLOW / 2  # cut, not answered


def _wait(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
