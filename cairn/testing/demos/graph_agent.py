"""The demo `graph_agent` workflow: a LangGraph support agent run by cairn (the
`langgraph` extra: `pip install 'cairn[langgraph]'`).

Two nodes: "agent" asks the model (ctx.model through cairn.current(), journaled in the
node's scope) with two tools, "lookup" and "notify"; "tools" runs the tool it chose as a
journaled ctx.call. "notify" emails the customer with the call's own idempotency key, so a
node run again after a kill sends the same key and the mail API delivers it once. The
graph's checkpoints are the run's progress (CairnSaver): a run killed mid-graph goes on
from the last node that finished. `cairn chaos graph_agent` kills it at every call and
node, and pauses workers past their lease.

The first message's "TOOLS: lookup, notify" line is the script of the local Messages-API
stand-in (cairn.testing.standins): it calls those tools in order, one a turn, then answers
in text. A real model reads it as a hint.

Input: {"question": str, "email": str}. The graph's final state is state["output"].
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import httpx
from langgraph.graph import END, START, StateGraph

from cairn.core.errors import InvalidInput, Transient
from cairn.langgraph import CairnSaver, graph_workflow, node
from cairn.steps.context import Context, current


def _validate(data: dict[str, Any]) -> dict[str, Any]:
    question, email = data.get("question"), data.get("email")
    if not isinstance(question, str) or not question.strip():
        raise InvalidInput("graph_agent: 'question' must be a non-empty string")
    if not isinstance(email, str) or "@" not in email:
        raise InvalidInput("graph_agent: 'email' must be an email address")
    return {"question": question, "email": email}


class Ticket(TypedDict, total=False):
    question: str
    email: str
    messages: Annotated[list[dict[str, Any]], operator.add]


def _tool(name: str, what: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    return {"name": name, "description": what, "input_schema": schema}


TOOLS = [
    _tool("lookup", "Search the help pages for the text."),
    _tool("notify", "Email the customer the text."),
]


def _context() -> Context:
    ctx = current()
    if ctx is None:
        raise RuntimeError("graph_agent's nodes run inside a cairn step")
    return ctx


@node
def agent(state: Ticket) -> dict[str, Any]:
    """Ask the model what to do next: a tool to call, or the answer."""
    ctx = _context()
    first = [] if state.get("messages") else [
        {"role": "user", "content": f"TOOLS: lookup, notify\n{state['question']}"}
    ]  # fmt: skip
    reply = ctx.model(messages=[*state.get("messages", []), *first], tools=TOOLS, max_tokens=64)
    content = [block.model_dump(exclude_none=True) for block in reply.content]
    return {"messages": [*first, {"role": "assistant", "content": content}]}


def _lookup(ctx: Context, email: str, text: str) -> str:
    return f"help page about {text}"


def _notify(ctx: Context, email: str, text: str) -> str:
    body = {"to": email, "subject": "About your question", "body": text, "ref": ctx.run_id}
    try:
        resp = httpx.post(
            f"{ctx.config.mail_url}/v1/send",
            json=body,
            headers={"Idempotency-Key": ctx.idempotency_key()},  # this call's own key
            timeout=30.0,
        )
    except httpx.TransportError as exc:
        raise Transient(f"mail API unreachable: {exc}") from exc
    if resp.status_code >= 500:
        raise Transient(f"mail API answered {resp.status_code}")
    resp.raise_for_status()
    return str(resp.json()["id"])


RUN_TOOL = {"lookup": _lookup, "notify": _notify}


@node
def tools(state: Ticket) -> dict[str, Any]:
    """Run the tool the model chose, as a journaled call: a replay returns its record."""
    ctx = _context()
    [use] = [b for b in state["messages"][-1]["content"] if b.get("type") == "tool_use"]
    run = RUN_TOOL.get(use["name"])
    text = str(use.get("input", {}).get("text", ""))
    result = ctx.call(use["name"], run, ctx, state["email"], text) if run else "no such tool"
    block = {"type": "tool_result", "tool_use_id": use["id"], "content": result}
    return {"messages": [{"role": "user", "content": [block]}]}


def _route(state: Ticket) -> str:
    last = state["messages"][-1]["content"]
    return "tools" if any(b.get("type") == "tool_use" for b in last) else END


graph = StateGraph(Ticket)
graph.add_node("agent", agent)
graph.add_node("tools", tools)
graph.add_edge(START, "agent")
graph.add_conditional_edges("agent", _route)
graph.add_edge("tools", "agent")
flow = graph_workflow("graph_agent", graph.compile(checkpointer=CairnSaver()), validate=_validate)
