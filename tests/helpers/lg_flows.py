"""A LangGraph graph as a cairn workflow, for the tests' workers (CAIRN_WORKFLOWS=tests.helpers.lg_flows):
a refund drafted, approved by a person (interrupt), then sent."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import httpx
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import cairn
from cairn.langgraph import CairnSaver, graph_workflow, idempotency_key, node


class Refund(TypedDict, total=False):
    order: str
    approved: Any
    sent: str


def approve(state: Refund) -> dict[str, Any]:
    return {"approved": interrupt({"question": "refund?", "order": state["order"]})}


def send(state: Refund) -> dict[str, Any]:
    return {"sent": idempotency_key()}  # the key a real send would carry


builder = StateGraph(Refund)
builder.add_node("approve", approve)
builder.add_node("send", send)
builder.add_edge(START, "approve")
builder.add_edge("approve", "send")
builder.add_edge("send", END)
flow = graph_workflow("lg_refund", builder.compile(checkpointer=CairnSaver()))


# A tool-calling agent as a graph: "agent" asks the model (ctx.model, journaled), "tools"
# runs the tool it chose (ctx.call, journaled): a lookup, a keyed email, a ledger row
# through ctx.db that commits with its call's record. The Messages-API stand-in calls the
# tools the first message's "TOOLS:" line lists, one a turn, then answers in text.
class Support(TypedDict):
    messages: Annotated[list[dict[str, Any]], operator.add]


TOOLS = [
    {
        "name": name,
        "description": what,
        "input_schema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    }
    for name, what in (
        ("lookup", "Search the help pages."),
        ("notify", "Email the customer."),
        ("remember", "Write a ledger row."),
    )
]


@node
def agent(state: Support) -> dict[str, Any]:
    ctx = cairn.current()
    assert ctx is not None
    reply = ctx.model(messages=state["messages"], tools=TOOLS, max_tokens=64)
    content = [block.model_dump(exclude_none=True) for block in reply.content]
    return {"messages": [{"role": "assistant", "content": content}]}


def _lookup(ctx: cairn.Context, text: str) -> str:
    return f"help page about {text}"


def _notify(ctx: cairn.Context, text: str) -> str:
    try:
        resp = httpx.post(
            f"{ctx.config.mail_url}/v1/send",
            json={"to": "customer@example.com", "subject": "note", "body": text, "ref": ctx.run_id},
            headers={"Idempotency-Key": ctx.idempotency_key()},  # this call's own key
            timeout=30.0,
        )
    except httpx.TransportError as exc:
        raise cairn.Transient(f"mail API unreachable: {exc}") from exc
    if resp.status_code >= 500:
        raise cairn.Transient(f"mail API answered {resp.status_code}")
    resp.raise_for_status()
    return str(resp.json()["id"])


def _remember(ctx: cairn.Context, text: str) -> str:
    key = ctx.idempotency_key()
    # No ON CONFLICT: a row written twice would fail the run, a row lost would be missing.
    ctx.db.execute(
        "INSERT INTO invoice_ledger (idempotency_key, run_id, customer, amount_cents)"
        " VALUES (%s, %s, %s, %s)",
        (key, ctx.run_id, text[:100], 1),
    )
    return key


RUN_TOOL = {"lookup": _lookup, "notify": _notify, "remember": _remember}


@node
def tools(state: Support) -> dict[str, Any]:
    ctx = cairn.current()
    assert ctx is not None
    [use] = [b for b in state["messages"][-1]["content"] if b.get("type") == "tool_use"]
    result = ctx.call(use["name"], RUN_TOOL[use["name"]], ctx, use["input"]["text"])
    block = {"type": "tool_result", "tool_use_id": use["id"], "content": result}
    return {"messages": [{"role": "user", "content": [block]}]}


def _route(state: Support) -> str:
    last = state["messages"][-1]["content"]
    return "tools" if any(b.get("type") == "tool_use" for b in last) else END


support = StateGraph(Support)
support.add_node("agent", agent)
support.add_node("tools", tools)
support.add_edge(START, "agent")
support.add_conditional_edges("agent", _route)
support.add_edge("tools", "agent")
support_flow = graph_workflow("lg_support", support.compile(checkpointer=CairnSaver()))
