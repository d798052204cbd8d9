"""cairn.langgraph.CairnSaver: LangGraph's own conformance suite, every capability; a
message history stored as appended tails (bytes per step flat in the thread's length);
and, inside a cairn run, puts fenced by the run's epoch and the thread's order."""

from __future__ import annotations

import asyncio
import dataclasses
import operator
import uuid
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from cairn.client import Client
from cairn.contrib import langgraph as lg
from cairn.core import errors
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.langgraph import CairnSaver
from cairn.steps import Context, StepResult, workflow
from cairn.steps.context import current
from cairn.steps.model import text_of
from cairn.store import Database
from cairn.store.graphs import GraphStore
from cairn.testing.standins import ModelServer
from cairn.workers import loop
from tests.helpers.services import BASE_DB, with_db


@pytest.fixture
def saver(settings: Settings) -> Any:
    s = CairnSaver(settings)
    yield s
    s.close()


def test_the_langgraph_conformance_suite_passes_every_capability(settings: Settings) -> None:
    @checkpointer_test(name="CairnSaver")
    async def cairn_saver() -> Any:
        s = CairnSaver(settings)
        yield s
        s.close()

    report = asyncio.run(validate(cairn_saver))
    failed = {
        name: [str(f) for f in result.failures] if hasattr(result, "failures") else result
        for name, result in report.results.items()
        if result is None or result.passed is not True
    }
    assert report.passed_all() and report.conformance_level() == "FULL", failed
    assert len(report.results) == 8  # put, put_writes, get_tuple, list, delete_thread, ...


# -- a graph whose state carries a message history --------------------------------------
class Chat(TypedDict):
    messages: Annotated[list[str], operator.add]
    turns: int
    n: int


def _turn(state: Chat) -> dict[str, Any]:
    turn = state["turns"] + 1
    return {"turns": turn, "messages": [f"message {turn}: " + "x" * 400]}


def _graph(saver: CairnSaver) -> Any:
    g = StateGraph(Chat)
    g.add_node("turn", _turn)
    g.add_edge(START, "turn")
    g.add_conditional_edges("turn", lambda s: END if s["turns"] >= s["n"] else "turn")
    return g.compile(checkpointer=saver)


def _chat(saver: CairnSaver, thread: str, n: int) -> dict[str, Any]:
    config = {"configurable": {"thread_id": thread}, "recursion_limit": 2 * n + 10}
    return _graph(saver).invoke({"messages": [], "turns": 0, "n": n}, config)


def _blob_bytes(sql: Any, thread: str) -> int:
    [(total,)] = sql(
        "SELECT coalesce(sum(octet_length(blob)), 0) FROM graph_blobs WHERE thread_id = %s",
        thread,
    )
    return int(total)


def test_a_message_history_costs_each_step_its_new_messages_only(
    saver: CairnSaver, settings: Settings, sql: Any
) -> None:
    short, long = f"short-{uuid.uuid4().hex}", f"long-{uuid.uuid4().hex}"
    assert len(_chat(saver, short, 10)["messages"]) == 10
    assert len(_chat(saver, long, 60)["messages"]) == 60
    per_step_short = _blob_bytes(sql, short) / 10
    per_step_long = _blob_bytes(sql, long) / 60
    # Flat: a step of the long thread stores what a step of the short one does (LangGraph's
    # Postgres saver writes the whole list again: 3x the bytes a step at 60 as at 10).
    assert per_step_long < 1.2 * per_step_short, (per_step_short, per_step_long)
    # And read back whole, by another saver that never saw the thread.
    other = CairnSaver(settings)
    try:
        state = other.get_tuple({"configurable": {"thread_id": long}})
        assert state is not None
        assert state.checkpoint["channel_values"]["messages"] == [
            f"message {i}: " + "x" * 400 for i in range(1, 61)
        ]
        # It goes on from there, appending: its first put after the read is a tail too.
        before = _blob_bytes(sql, long)
        config = {"configurable": {"thread_id": long}, "recursion_limit": 50}
        _graph(other).invoke({"messages": [], "turns": 0, "n": 3}, config)
        assert _blob_bytes(sql, long) - before < 5 * per_step_short
    finally:
        other.close()


def test_a_list_edited_in_place_is_stored_whole_not_as_a_tail(saver: CairnSaver, sql: Any) -> None:
    thread = f"edit-{uuid.uuid4().hex}"
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    items = [{"text": "a"}, {"text": "b"}]

    def put(parent: dict[str, Any], version: int) -> dict[str, Any]:
        cp = {
            "v": 4,
            "id": str(uuid.uuid1()),
            "ts": "2026-12-04T00:00:00+00:00",
            "channel_values": {"messages": items},
            "channel_versions": {"messages": version},
            "versions_seen": {},
            "updated_channels": ["messages"],
        }
        return saver.put(parent, cp, {"step": version}, {"messages": version})

    first = put(config, 1)
    items[0]["text"] = "A"  # the same list object, edited, then extended
    items.append({"text": "c"})
    put(first, 2)
    got = saver.get_tuple(config)
    assert got is not None
    assert got.checkpoint["channel_values"]["messages"] == [
        {"text": "A"},
        {"text": "b"},
        {"text": "c"},
    ]


# -- inside a cairn run: fenced -----------------------------------------------------------
graphs = workflow("lg-chat")
TAKE_OVER: dict[str, int] = {}  # run id -> the turn at which another worker claims it


@graphs.step()
def chat(ctx: Context) -> StepResult:
    saver = CairnSaver(ctx.config)
    try:

        def turn(state: Chat) -> dict[str, Any]:
            if TAKE_OVER.get(ctx.run_id) == state["turns"]:
                # Another worker claims the run now (this one paused past its lease, say).
                assert ctx._store.claim(ctx.run_id, ctx.epoch + 5) is not None
            return _turn(state)

        g = StateGraph(Chat)
        g.add_node("turn", turn)
        g.add_edge(START, "turn")
        g.add_conditional_edges("turn", lambda s: END if s["turns"] >= s["n"] else "turn")
        config = {"configurable": {"thread_id": ctx.run_id}}
        # durability="sync": each checkpoint written before the next super-step starts.
        out = g.compile(checkpointer=saver).invoke(
            {"messages": [], "turns": 0, "n": ctx.input["n"]}, config, durability="sync"
        )
    finally:
        saver.close()
    return StepResult(cursor="done", state={"turns": out["turns"]})


@pytest.fixture
def deps(settings: Settings, store: Any, leases: Any) -> loop.Deps:
    return loop.Deps(settings=settings, store=store, leases=leases, model=None)


def test_a_graph_in_a_cairn_run_checkpoints_under_the_runs_fence(
    deps: loop.Deps, saver: CairnSaver, sql: Any
) -> None:
    run_id = f"lg-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, "lg-chat", {"n": 4})
    assert loop.run(run_id, deps) == RunStatus.DONE
    rows = sql("SELECT run_id, epoch FROM graph_checkpoints WHERE thread_id = %s", run_id)
    assert len(rows) == 6 and {r[0] for r in rows} == {run_id}  # input, 4 turns, the end
    assert len({r[1] for r in rows}) == 1


def test_a_worker_that_lost_the_run_cannot_write_the_threads_next_checkpoint(
    deps: loop.Deps, sql: Any
) -> None:
    run_id = f"lg-{uuid.uuid4().hex[:8]}"
    TAKE_OVER[run_id] = 2
    assert deps.store.create_run(run_id, "lg-chat", {"n": 5})
    with pytest.raises(errors.StaleWrite, match="another worker owns the run"):
        loop.run(run_id, deps)
    # The checkpoints up to the claim, and none after: the thread ends at the second turn
    # (the claim came inside the third), all written at the first owner's epoch.
    reader = CairnSaver(deps.settings)
    latest = reader.get_tuple({"configurable": {"thread_id": run_id}})
    reader.close()
    assert latest is not None and latest.checkpoint["channel_values"]["turns"] == 2
    rows = sql("SELECT DISTINCT epoch FROM graph_checkpoints WHERE thread_id = %s", run_id)
    assert len(rows) == 1


def test_inside_a_run_a_put_must_extend_the_thread_outside_a_fork_is_fine(
    deps: loop.Deps, saver: CairnSaver, settings: Settings
) -> None:
    thread = f"fork-{uuid.uuid4().hex}"
    _chat(saver, thread, 3)
    history = list(saver.list({"configurable": {"thread_id": thread}}))
    old = history[2].config  # an older checkpoint: LangGraph's time travel forks from it
    cp = dict(history[2].checkpoint, id=str(uuid.uuid1()))
    saver.put(old, cp, {"step": 99}, {})  # outside a run: a fork, as LangGraph does
    # Inside a run the same fork is refused: the thread only moves forward.
    run_id = f"lg-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, "lg-chat", {"n": 1})
    cp2 = dict(history[2].checkpoint, id=str(uuid.uuid1()))
    lease = deps.leases.acquire(run_id, 30)
    assert lease is not None and deps.store.claim(run_id, lease.epoch) is not None
    from cairn.steps import context as step_context

    ctx = Context(deps.store.load(run_id), store=deps.store, lease=lease)  # type: ignore[arg-type]
    token = step_context._step.set(ctx)
    try:
        with pytest.raises(errors.StaleWrite, match="moved past"):
            saver.put(old, cp2, {"step": 100}, {})
    finally:
        step_context._step.reset(token)
        lease.release()


def test_graph_store_on_a_database_of_its_own(settings: Settings) -> None:
    db = Database(settings.database_url).open()
    try:
        s = CairnSaver(store=GraphStore(db))
        thread = f"own-{uuid.uuid4().hex}"
        assert len(_chat(s, thread, 2)["messages"]) == 2
        s.delete_thread(thread)
        assert s.get_tuple({"configurable": {"thread_id": thread}}) is None
    finally:
        db.close()


# -- a compiled graph as a cairn workflow -------------------------------------------------
class Refund(TypedDict, total=False):
    order: str
    drafted: str
    approved: Any
    sent: str


effects: dict[str, list[str]] = {}  # run id -> the keyed effects the nodes made, in order
DIE_IN_SEND: set[str] = set()  # runs whose "send" node kills its process once


class ProcessDied(BaseException):
    """The worker's process killed: nothing after it runs or records."""


def _run_of(key: str) -> str:
    return key.split(":")[1]


def draft(state: Refund) -> dict[str, Any]:
    key = lg.idempotency_key()
    effects.setdefault(_run_of(key), []).append(f"draft {key}")
    return {"drafted": f"refund of {state['order']}"}


def approve(state: Refund) -> dict[str, Any]:
    key = lg.idempotency_key()
    effects.setdefault(_run_of(key), []).append(f"ask {key}")
    return {"approved": interrupt({"question": "refund?", "order": state["order"]})}


def send(state: Refund) -> dict[str, Any]:
    key = lg.idempotency_key()
    run_id = _run_of(key)
    if run_id in DIE_IN_SEND:
        DIE_IN_SEND.discard(run_id)
        raise ProcessDied
    effects.setdefault(run_id, []).append(f"send {key}")
    return {"sent": key}


def _refund_graph() -> Any:
    g = StateGraph(Refund)
    g.add_node("draft", draft)
    g.add_node("approve", approve)
    g.add_node("send", send)
    g.add_edge(START, "draft")
    g.add_edge("draft", "approve")
    g.add_edge("approve", "send")
    g.add_edge("send", END)
    return g.compile(checkpointer=CairnSaver())


lg.workflow("lg-refund", _refund_graph())


def _redeliver(run_id: str, deps: loop.Deps) -> RunStatus:
    lease = deps.leases.holder(run_id)
    if lease is not None:
        assert deps.leases.break_dead(run_id, lease)
    return loop.run(run_id, deps)


def test_an_interrupt_waits_for_a_signal_and_a_kill_resumes_at_the_last_checkpoint(
    deps: loop.Deps,
) -> None:
    run_id = f"lg-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, "lg-refund", {"order": "o-42"})
    assert loop.run(run_id, deps) == RunStatus.WAITING
    run = deps.store.get(run_id)
    assert run is not None
    [asked] = run.state["interrupts"]
    assert asked["value"] == {"question": "refund?", "order": "o-42"}
    deps.store.signal(run_id, lg.RESUME, {"ok": True}, "s1")
    DIE_IN_SEND.add(run_id)
    with pytest.raises(ProcessDied):  # killed in "send", after "approve" was checkpointed
        loop.run(run_id, deps)
    assert _redeliver(run_id, deps) == RunStatus.DONE
    run = deps.store.get(run_id)
    assert run is not None and run.state["interrupts"] is None
    out = run.state["output"]
    assert out["approved"] == {"ok": True} and out["drafted"] == "refund of o-42"
    made = effects[run_id]
    # draft once; approve asked twice (LangGraph runs an interrupted node again when it is
    # answered) under one key; send once, under its own key.
    assert [m.split(" ")[0] for m in made] == ["draft", "ask", "ask", "send"]
    keys = [m.split(" ")[1] for m in made]
    assert keys[1] == keys[2] and len({keys[0], keys[1], keys[3]}) == 3
    assert out["sent"] == keys[3] and keys[3].startswith(f"cairn:{run_id}:send:")


def test_a_graph_without_cairn_saver_is_refused_at_once() -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    g = StateGraph(Refund)
    g.add_node("draft", draft)
    g.add_edge(START, "draft")
    with pytest.raises(errors.CairnError, match=r"checkpointer=cairn.langgraph.CairnSaver\(\)"):
        lg.workflow("lg-memory", g.compile(checkpointer=InMemorySaver()))


def test_the_sweep_takes_the_graph_of_a_run_with_the_run(deps: loop.Deps, sql: Any) -> None:
    run_id = f"lg-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, "lg-chat", {"n": 2})
    assert loop.run(run_id, deps) == RunStatus.DONE
    count = "SELECT count(*) FROM graph_checkpoints WHERE thread_id = %s"
    assert sql(count, run_id)[0][0] > 0
    assert deps.store.sweep(older_than=-3600) >= 1
    assert sql(count, run_id) == [(0,)]
    assert sql("SELECT count(*) FROM graph_blobs WHERE thread_id = %s", run_id) == [(0,)]


# -- journaled calls inside nodes: a scope per node and super-step -----------------------
DIE_IN_B: dict[str, str] = {}  # run id -> "before" | "after" (b's call) to die once


class Two(TypedDict, total=False):
    a: Any
    b: Any


@lg.node
def node_a(state: Two) -> dict[str, Any]:
    ctx = current()
    assert ctx is not None
    return {"a": ctx.call("fetch", lambda: effects.setdefault(ctx.run_id, []).append("a") or "A")}


@lg.node
def node_b(state: Two) -> dict[str, Any]:
    ctx = current()
    assert ctx is not None
    if DIE_IN_B.get(ctx.run_id) == "before":
        del DIE_IN_B[ctx.run_id]
        raise ProcessDied
    got = ctx.call("fetch", lambda: effects.setdefault(ctx.run_id, []).append("b") or "B")
    if DIE_IN_B.get(ctx.run_id) == "after":
        del DIE_IN_B[ctx.run_id]
        raise ProcessDied  # b's call recorded, its checkpoint not written
    return {"b": got}


def _two_graph() -> Any:
    g = StateGraph(Two)
    g.add_node("a", node_a)
    g.add_node("b", node_b)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g.compile(checkpointer=CairnSaver())


lg.workflow("lg-two", _two_graph())


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_node_resumed_from_the_checkpoint_finds_its_own_journal_records(
    deps: loop.Deps, when: str
) -> None:
    run_id = f"lg-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, "lg-two", {})
    DIE_IN_B[run_id] = when
    with pytest.raises(ProcessDied):
        loop.run(run_id, deps)
    assert _redeliver(run_id, deps) == RunStatus.DONE
    run = deps.store.get(run_id)
    assert run is not None
    # b got its own result, not a's (whose record holds place 0 of the step's journal).
    assert run.state["output"] == {"a": "A", "b": "B"}
    assert effects[run_id] == ["a", "b"]  # each call made once, across the kill
    scopes = [c["cursor"] for c in deps.store.calls(run_id)]
    assert scopes == ["graph/a.1", "graph/b.2"]


# -- the zombie, on LangGraph's PostgresSaver and on CairnSaver ----------------------------
def _next(saver: Any, tup: Any, who: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The checkpoint a writer that loaded tup writes next: one more message, by who."""
    values = dict(tup.checkpoint["channel_values"])
    values["messages"] = [*values["messages"], f"{who}: turn {values['turns'] + 1}"]
    values["turns"] += 1
    version = saver.get_next_version(tup.checkpoint["channel_versions"].get("messages"), None)
    cp = {
        **tup.checkpoint,
        "id": str(uuid6(clock_seq=-1)),  # LangGraph's ids: later ones sort after
        "channel_values": values,
        "channel_versions": {**tup.checkpoint["channel_versions"], "messages": version},
    }
    return cp, {"messages": version}


def _zombie_writes(saver: Any, thread: str, as_owner: Any) -> Any:
    """A and B both hold the thread at the same checkpoint (A paused past its lease, B took
    the run over); B writes two steps, then A, resumed, writes its next step. Returns the
    thread's latest checkpoint as the saver gives it."""
    _chat(saver, thread, 2)
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    held = saver.get_tuple(config)  # what A and B both loaded
    with as_owner("B"):
        tup = held
        for _ in range(2):
            cp, versions = _next(saver, tup, "B")
            saver.put(tup.config, cp, {"step": 1}, versions)
            tup = saver.get_tuple(config)
    with as_owner("A"):
        cp, versions = _next(saver, held, "A")
        try:
            saver.put(held.config, cp, {"step": 1}, versions)
        except errors.StaleWrite:
            pass  # refused: what CairnSaver does inside a run
    return saver.get_tuple(config)


def test_a_zombie_forks_the_thread_on_postgressaver_but_not_on_cairnsaver(
    deps: loop.Deps, settings: Settings, saver: CairnSaver
) -> None:
    import contextlib
    import types

    from langgraph.checkpoint.postgres import PostgresSaver

    from cairn.steps import context as step_context

    run_id = f"lg-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, "lg-chat", {"n": 1})
    lease = deps.leases.acquire(run_id, 30)
    assert lease is not None and deps.store.claim(run_id, lease.epoch) is not None
    epochs = {"A": lease.epoch, "B": lease.epoch + 5}

    @contextlib.contextmanager
    def as_owner(who: str) -> Any:
        """The writer runs as the run's owner at its epoch; B's claim fences A."""
        if who == "B" and deps.store.load(run_id).epoch < epochs["B"]:  # type: ignore[union-attr]
            assert deps.store.claim(run_id, epochs["B"]) is not None
        # A lease that checks nothing: the saver's fence, not the lease, is what is tested.
        holder = types.SimpleNamespace(epoch=epochs[who], ensure=lambda fresh=False: None)
        ctx = Context(deps.store.load(run_id), store=deps.store, lease=holder)  # type: ignore[arg-type]
        token = step_context._step.set(ctx)
        try:
            yield
        finally:
            step_context._step.reset(token)

    # A database of its own: LangGraph's tables (its "checkpoints" above all) are not ours.
    name = f"lg_pg_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(BASE_DB, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        with PostgresSaver.from_conn_string(with_db(BASE_DB, name)) as postgres:
            postgres.setup()
            forked = _zombie_writes(postgres, f"pg-{run_id}", as_owner)
    finally:
        with psycopg.connect(BASE_DB, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    # PostgresSaver took A's write: the thread's latest checkpoint is A's, a fork of the
    # one both loaded, without B's two turns. B's progress is off the thread's head.
    assert forked.checkpoint["channel_values"]["messages"][-1] == "A: turn 3"
    assert not any(m.startswith("B:") for m in forked.checkpoint["channel_values"]["messages"])
    kept = _zombie_writes(saver, f"cairn-{run_id}", as_owner)
    # CairnSaver refused it: the head is B's, four turns on.
    assert kept.checkpoint["channel_values"]["messages"][-2:] == ["B: turn 3", "B: turn 4"]
    lease.release()


# -- the graph's stream as the run's live events ------------------------------------------
class Said(TypedDict, total=False):
    question: str
    answer: str


def _answer(state: Said) -> dict[str, Any]:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langgraph.config import get_stream_writer

    get_stream_writer()({"progress": "asking"})
    chat = GenericFakeChatModel(messages=iter([AIMessage(content="graphs stream their text")]))
    return {"answer": chat.invoke(state["question"]).content}


def _said_graph() -> Any:
    g = StateGraph(Said)
    g.add_node("answer", _answer)
    g.add_edge(START, "answer")
    g.add_edge("answer", END)
    return g.compile(checkpointer=CairnSaver())


lg.workflow("lg-said", _said_graph())


def test_a_graphs_nodes_writes_and_chat_tokens_are_live_events(
    settings: Settings, deps: loop.Deps
) -> None:
    from cairn.client.client import Client
    from cairn.store.events import RedisEvents
    from cairn.workers.outbox import Outbox

    outbox = Outbox(RedisEvents(deps.leases.client), settings)
    live = dataclasses.replace(deps, events=outbox)
    run_id = f"lg-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, "lg-said", {"question": "do graphs stream?"})
    assert loop.run(run_id, live) == RunStatus.DONE
    with Client(settings=settings) as client:
        events = list(client.events(run_id, timeout=10))
    kinds = [e.kind for e in events]
    text = "".join(e.data["text"] for e in events if e.kind == "token")
    assert text == "graphs stream their text"  # deltas queued together share an event
    assert {"kind": "graph.custom", "data": {"progress": "asking"}} in [
        {"kind": e.kind, "data": e.data} for e in events
    ]
    assert [e.data for e in events if e.kind == "graph.node"] == [{"node": "answer"}]
    assert kinds.index("graph.custom") < kinds.index("graph.node") < kinds.index("step_saved")
    run = deps.store.get(run_id)
    assert run is not None and run.state["output"]["answer"] == "graphs stream their text"


# -- a node calling OpenAI: the worker's limiter and prices ---------------------------------
class Asked(TypedDict):
    question: str
    answer: str


@lg.node
def answer_with_openai(state: Asked) -> dict[str, Any]:
    ctx = current()
    assert ctx is not None
    ask = [{"role": "user", "content": state["question"]}]
    reply = ctx.model(model="gpt-4o-mini", messages=ask, max_tokens=50)
    return {"answer": text_of(reply)}


def _openai_graph() -> Any:
    g = StateGraph(Asked)
    g.add_node("answer", answer_with_openai)
    g.add_edge(START, "answer")
    g.add_edge("answer", END)
    return g.compile(checkpointer=CairnSaver())


lg.workflow("lg-openai", _openai_graph())


def test_a_node_calling_openai_goes_through_the_fleet_s_limiter_and_prices(
    deps: loop.Deps, model: ModelServer
) -> None:
    """ctx.model in a node, to OpenAI's Chat Completions through the real openai SDK:
    booked with the worker's limiter (real Redis) under openai, the model and the key's
    hash, its unused tokens given back, journaled in the node's scope and priced by
    OpenAI's table, cached tokens at their own price."""
    from cairn.steps.model import ModelClient
    from cairn.store.ratelimit import Limit, account
    from tests.helpers.limits import Booked

    key = "sk-test-langgraph-openai"
    limiter = Booked(deps.leases.client, limits={"openai:gpt-4o-mini": Limit(tpm=10**6)})
    client = ModelClient(openai_base_url=model.openai_url, openai_api_key=key, limiter=limiter)
    run_id = f"lg-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, "lg-openai", {"question": "REPLY: hi\nCACHED: 6"})
    try:
        assert loop.run(run_id, dataclasses.replace(deps, model=client)) == RunStatus.DONE
    finally:
        client.close()
    run = deps.store.get(run_id)
    assert run is not None and run.state["output"]["answer"] == "hi"
    assert model.stats()["by_api"]["chat.completions"]["requests"] == 1
    who = account(key)
    assert [t[:3] for t in limiter.takes] == [("openai", "gpt-4o-mini", who)]
    assert [s[:3] for s in limiter.settles] == [("openai", "gpt-4o-mini", who)]
    [call] = deps.store.calls(run_id)
    assert (call["cursor"], call["name"]) == ("graph/answer.1", "model")
    usage = call["result"]["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 6
    fresh = usage["prompt_tokens"] - 6  # OpenAI counts the cached ones in prompt_tokens
    expected = (fresh * 0.15 + 6 * 0.075 + usage["completion_tokens"] * 0.60) / 1e6
    assert call["cost_usd"] == pytest.approx(expected)
    assert run.cost_usd == pytest.approx(expected)


def test_an_interrupt_is_in_the_inbox_and_a_decision_resumes_the_graph(deps: loop.Deps) -> None:
    client = Client(settings=deps.settings, store=deps.store, send=lambda run_id, priority: None)
    run_id = f"lg-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, "lg-refund", {"order": "o-43"})
    assert loop.run(run_id, deps) == RunStatus.WAITING
    [asked] = [a for a in client.approvals(workflow="lg-refund") if a.run_id == run_id]
    assert asked.event == lg.RESUME and asked.tool is None
    assert asked.request["interrupts"][0]["value"] == {"question": "refund?", "order": "o-43"}
    client.decide(asked.approval_id, "deny", note="not this one")
    assert loop.run(run_id, deps) == RunStatus.DONE
    run = deps.store.get(run_id)
    assert run is not None
    approved = run.state["output"]["approved"]
    assert (approved["decision"], approved["note"]) == ("deny", "not this one")
