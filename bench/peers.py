"""The peers, each run in its own process: `python -m bench.peers SYSTEM SPEC_JSON`.

A child process keeps a peer's threads, singletons and warnings away from the other
systems' timings. It prints one JSON object: {"results": [...]} or {"error": "..."}.

Task kinds:
  noop  {"steps": N, "window_bytes": W, "durability": "async"|"sync"}
        N no-op steps over state that carries a W-byte model window.
  grow  {"steps": N, "msg_bytes": B, "channel": "list"|"delta"}
        every step adds one B-byte message to the window.

Systems: langgraph (its PostgresSaver), cairn_saver (the same graphs on
cairn.langgraph.CairnSaver; the database must be upgraded with cairn's migrations), dbos.
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
    "cairn_saver": ("langgraph", "cairn.langgraph"),
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


def _lg_build(channel: str | None, msg_bytes: int = 0) -> Any:
    """The bench graph: one node, `tick`, run n times; with a channel, each tick adds one
    msg_bytes message to the window ("list": operator.add, "delta": DeltaChannel)."""
    from typing import Annotated, TypedDict

    from langgraph.graph import END, START, StateGraph

    if channel is None:
        win_type: Any = list
    elif channel == "list":
        win_type = Annotated[list, operator.add]
    else:
        try:
            from langgraph.channels import DeltaChannel
        except ImportError as exc:  # older langgraph
            raise RuntimeError("langgraph.channels.DeltaChannel not in this langgraph") from exc
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


def _lg_tasks(
    who: str, saver: Any, url: str, tasks: list[dict[str, Any]], check_stored: bool = False
) -> list[dict[str, Any]]:
    """Each task's graph compiled with checkpointer=saver and invoked reps times, each on a
    fresh thread, under measure(). check_stored: read the last checkpoint back (untimed)
    and raise unless it holds the whole window the graph returned."""
    out = []
    for t in tasks:
        steps = int(t["steps"])
        if t["kind"] == "noop":
            graph = _lg_build(None).compile(checkpointer=saver)
            init = {"window": window(int(t["window_bytes"])), "i": 0, "n": steps}
        else:
            graph = _lg_build(t["channel"], int(t["msg_bytes"])).compile(checkpointer=saver)
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
                raise RuntimeError(f"{who} ran {final['i']} of {steps} steps")
            if t["kind"] == "grow" and len(final["window"]) != steps:
                raise RuntimeError(f"{who} window has {len(final['window'])} messages")
            if check_stored:
                _check_stored(who, saver, graph, config, final, steps, t.get("channel"))
            elapsed.append(e)
            wals.append(w)
        out.append({**t, "elapsed": elapsed, "wal": wals})
    return out


def _check_stored(
    who: str,
    saver: Any,
    graph: Any,
    config: dict[str, Any],
    final: dict[str, Any],
    steps: int,
    channel: str | None,
) -> None:
    """The thread's latest checkpoint, read back through the saver (saver.get_tuple), holds
    the final state: i = steps and the whole window, message for message. A DeltaChannel's
    checkpoint holds a sentinel, its value rebuilt from the writes: read through the graph."""
    thread = {"configurable": {"thread_id": config["configurable"]["thread_id"]}}
    if channel == "delta":
        values = dict(graph.get_state(thread).values)
    else:
        got = saver.get_tuple(thread)
        if got is None:
            raise RuntimeError(f"{who} stored no checkpoint for the thread")
        values = got.checkpoint["channel_values"]
    if values.get("i") != steps:
        raise RuntimeError(f"{who} stored i={values.get('i')}, not {steps}")
    stored = values.get("window", [])
    if len(stored) != len(final["window"]):
        raise RuntimeError(
            f"{who} stored {len(stored)} of the window's {len(final['window'])} messages"
        )
    if stored != final["window"]:
        raise RuntimeError(f"{who} stored a window unlike the one the graph returned")


def _lg_warm_up(saver: Any) -> None:
    """A short run, not measured: first connections, prepared statements, code paths."""
    graph = _lg_build("list", 256).compile(checkpointer=saver)
    config = {"configurable": {"thread_id": f"warm-{uuid.uuid4().hex}"}}
    graph.invoke({"window": [], "i": 0, "n": 5}, config, durability="async")


def langgraph_tasks(url: str, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        _lg_warm_up(saver)
        return _lg_tasks("langgraph", saver, url, tasks, check_stored=True)


# -- cairn's LangGraph checkpointer ----------------------------------------------------------
def cairn_saver_tasks(url: str, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same graphs on cairn.langgraph.CairnSaver; url: a database cairn's migrations
    upgraded (the parent does it). Its Redis is never used by the saver."""
    from cairn import Settings
    from cairn.langgraph import CairnSaver

    saver = CairnSaver(Settings(database_url=url, redis_url="redis://unused.invalid/0"))
    try:
        _lg_warm_up(saver)
        return _lg_tasks("CairnSaver", saver, url, tasks, check_stored=True)
    finally:
        saver.close()


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


RUNNERS = {"langgraph": langgraph_tasks, "cairn_saver": cairn_saver_tasks, "dbos": dbos_tasks}


def main(argv: list[str]) -> int:
    system, spec = argv[0], json.loads(argv[1])
    return child_main(lambda: RUNNERS[system](spec["url"], spec["tasks"]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
