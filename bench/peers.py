"""The peers, each run in its own process: `python -m bench.peers SYSTEM SPEC_JSON`.

A child process keeps a peer's threads, singletons and warnings away from the other
systems' timings. It prints one JSON object: {"results": [...]} or {"error": "..."}.

Task kinds:
  noop  {"steps": N, "window_bytes": W, "durability": "async"|"sync"}
        N no-op steps over state that carries a W-byte model window.
  grow  {"steps": N, "msg_bytes": B, "channel": "list"|"delta"}
        every step adds one B-byte message to the window.
"""

from __future__ import annotations

import json
import operator
import sys
import uuid
from typing import Any

from bench.common import child_main, measure, message, missing_module, window

PEERS = {
    "langgraph": ("langgraph", "langgraph.checkpoint.postgres"),
    "dbos": ("dbos",),
}


def missing(system: str) -> str | None:
    """The first module of the peer that cannot be imported, or None."""
    return missing_module(PEERS[system])


# -- LangGraph -----------------------------------------------------------------------------
def _concat(state: list[Any], writes: Any) -> list[Any]:
    out = list(state)
    for w in writes:
        out.extend(w)
    return out


def langgraph_tasks(url: str, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from typing import Annotated, TypedDict

    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, StateGraph

    try:
        from langgraph.channels import DeltaChannel
    except ImportError:  # older langgraph
        DeltaChannel = None

    def build(channel: str | None, msg_bytes: int = 0) -> Any:
        if channel is None:
            win_type: Any = list
        elif channel == "list":
            win_type = Annotated[list, operator.add]
        else:
            if DeltaChannel is None:
                raise RuntimeError("langgraph.channels.DeltaChannel not in this langgraph")
            win_type = Annotated[list, DeltaChannel(_concat)]

        State = TypedDict("State", {"window": win_type, "i": int, "n": int})

        def tick(state: dict[str, Any]) -> dict[str, Any]:
            i = state["i"] + 1
            if channel is None:
                return {"i": i}
            return {"i": i, "window": [message(msg_bytes, i)]}

        def route(state: dict[str, Any]) -> str:
            return END if state["i"] >= state["n"] else "tick"

        g = StateGraph(State)
        g.add_node("tick", tick)
        g.add_edge(START, "tick")
        g.add_conditional_edges("tick", route)
        return g

    out = []
    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        for t in tasks:
            steps = int(t["steps"])
            if t["kind"] == "noop":
                graph = build(None).compile(checkpointer=saver)
                init = {"window": window(int(t["window_bytes"])), "i": 0, "n": steps}
            else:
                graph = build(t["channel"], int(t["msg_bytes"])).compile(checkpointer=saver)
                init = {"window": [], "i": 0, "n": steps}
            durability = t.get("durability", "async")
            elapsed, wals = [], []
            for _ in range(int(t.get("reps", 1))):
                config = {
                    "configurable": {"thread_id": uuid.uuid4().hex},
                    "recursion_limit": steps + 10,
                }
                e, w, final = measure(
                    url,
                    lambda: graph.invoke(init, config, durability=durability),  # noqa: B023
                )
                if final["i"] != steps:
                    raise RuntimeError(f"langgraph ran {final['i']} of {steps} steps")
                if t["kind"] == "grow" and len(final["window"]) != steps:
                    raise RuntimeError(f"langgraph window has {len(final['window'])} messages")
                elapsed.append(e)
                wals.append(w)
            out.append({**t, "elapsed": elapsed, "wal": wals})
    return out


# -- DBOS ----------------------------------------------------------------------------------
def dbos_tasks(url: str, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from dbos import DBOS

    @DBOS.step()
    def noop_step(i: int) -> None:
        return None

    @DBOS.step()
    def msg_step(i: int, size: int) -> dict[str, Any]:
        return message(size, i)

    @DBOS.workflow()
    def noop_flow(win: list[dict[str, Any]], n: int) -> int:
        for i in range(n):
            noop_step(i)
        return n

    @DBOS.workflow()
    def grow_flow(n: int, size: int) -> int:
        win: list[dict[str, Any]] = []
        for i in range(n):
            win.append(msg_step(i, size))
        return len(win)

    DBOS(config={"name": "cairn-bench", "system_database_url": url, "log_level": "WARNING"})
    DBOS.launch()
    out = []
    try:
        for t in tasks:
            steps = int(t["steps"])
            elapsed, wals = [], []
            win = window(int(t.get("window_bytes", 0))) if t["kind"] == "noop" else []
            for _ in range(int(t.get("reps", 1))):
                if t["kind"] == "noop":
                    e, w, n = measure(url, lambda: noop_flow(win, steps))  # noqa: B023
                else:
                    e, w, n = measure(url, lambda: grow_flow(steps, int(t["msg_bytes"])))  # noqa: B023
                if n != steps:
                    raise RuntimeError(f"dbos ran {n} of {steps} steps")
                elapsed.append(e)
                wals.append(w)
            out.append({**t, "elapsed": elapsed, "wal": wals})
    finally:
        DBOS.destroy()
    return out


RUNNERS = {"langgraph": langgraph_tasks, "dbos": dbos_tasks}


def main(argv: list[str]) -> int:
    system, spec = argv[0], json.loads(argv[1])
    return child_main(lambda: RUNNERS[system](spec["url"], spec["tasks"]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
