"""A LangGraph graph as a cairn workflow, for the tests' workers (CAIRN_WORKFLOWS=tests.lg_flows):
a refund drafted, approved by a person (interrupt), then sent."""

from __future__ import annotations

from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from cairn.langgraph import CairnSaver, idempotency_key, workflow


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
flow = workflow("lg_refund", builder.compile(checkpointer=CairnSaver()))
