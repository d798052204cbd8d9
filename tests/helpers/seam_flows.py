"""Workflows for the seam tests' workers (CAIRN_WORKFLOWS=tests.helpers.seam_flows): a LangGraph
mail graph (scalar state, or with a list channel) whose send node carries the task's key,
a streaming three-step run, and middleware that SIGKILLs the worker's process between a
step's commit and the events that announce it."""

from __future__ import annotations

import operator
import os
import signal
from pathlib import Path
from typing import Annotated, Any, TypedDict

import httpx
from langgraph.graph import END, START, StateGraph

import cairn
from cairn.langgraph import CairnSaver, graph_workflow, idempotency_key


def _ran(state: dict[str, Any], node: str) -> None:
    """One line per node body run, in the file the run's input names."""
    with open(state["log"], "a") as f:
        f.write(f"{node} {os.getpid()}\n")


class Mail(TypedDict, total=False):
    to: str
    log: str
    draft: str
    sent: str


class MailWithNotes(Mail, total=False):
    notes: Annotated[list[str], operator.add]  # a list channel: stored as appended tails


def _draft(state: Mail) -> dict[str, Any]:
    _ran(state, "draft")
    return {"draft": f"hello {state['to']}", **({"notes": ["drafted"]} if "notes" in state else {})}


def _send(state: Mail) -> dict[str, Any]:
    _ran(state, "send")
    ctx = cairn.current()
    assert ctx is not None
    key = idempotency_key()  # from the task: the same for every run of this node's task
    httpx.post(
        f"{ctx.config.mail_url}/v1/send",
        json={"to": state["to"], "subject": "hello", "body": state["draft"], "ref": ctx.run_id},
        headers={"Idempotency-Key": key},
        timeout=30,
    ).raise_for_status()
    return {"sent": key}


def _after(state: Mail) -> dict[str, Any]:
    _ran(state, "after")
    return {}


def _graph(schema: type) -> Any:
    builder = StateGraph(schema)
    for name, fn in (("draft", _draft), ("send", _send), ("after", _after)):
        builder.add_node(name, fn)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "send")
    builder.add_edge("send", "after")
    builder.add_edge("after", END)
    return builder.compile(checkpointer=CairnSaver())


graph_workflow("lg_mail", _graph(Mail))
graph_workflow("lg_mail_list", _graph(MailWithNotes))


# A streaming run of three steps: each streams a model answer and emits its own event.
stream = cairn.workflow("seam_stream")


def _speak(ctx: cairn.Context, nxt: str) -> cairn.StepResult:
    words = f"{ctx.cursor} says four words"
    reply = ctx.model(stream=True, messages=[{"role": "user", "content": f"REPLY: {words}"}])
    ctx.emit("said", {"step": ctx.cursor})
    return cairn.StepResult(cursor=nxt, state={ctx.cursor: reply.content[0].text})


@stream.step()
def one(ctx: cairn.Context) -> cairn.StepResult:
    return _speak(ctx, "two")


@stream.step()
def two(ctx: cairn.Context) -> cairn.StepResult:
    return _speak(ctx, "three")


@stream.step()
def three(ctx: cairn.Context) -> cairn.StepResult:
    return _speak(ctx, cairn.DONE)


class KillAfterCommit(cairn.Middleware):
    """SIGKILL this process right after the save of the step named in
    CAIRN_TEST_KILL_AFTER commits, before its events are queued; once per run (a marker
    file in CAIRN_TEST_KILL_DIR). With CAIRN_TEST_KILL_WHOLE=1, the whole worker: its main
    process first (a prefork pool's parent), so no process of it acks or resends."""

    def after_step(self, cp, *, saved, exception, seconds):  # type: ignore[no-untyped-def]
        if saved is None or cp.cursor != os.environ.get("CAIRN_TEST_KILL_AFTER"):
            return
        marker = Path(os.environ["CAIRN_TEST_KILL_DIR"]) / f"{cp.run_id}.{cp.cursor}"
        try:
            marker.touch(exist_ok=False)
        except FileExistsError:
            return
        if os.environ.get("CAIRN_TEST_KILL_WHOLE") == "1":
            os.kill(os.getppid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
