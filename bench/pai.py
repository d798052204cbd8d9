"""A pydantic-ai agent run on cairn and on DBOS: what durability adds to one agent run.

The same agent in each system: `Agent(FunctionModel(script), name=...)`, whose script
answers at once: four turns that each call one tool, then a text answer (5 model
requests, 4 tool calls a run; the tool a plain sync function returning a short string).
Each system runs in its own process (`python -m bench.pai SYSTEM SPEC_JSON`, as
bench.peers does) and measures, rep by rep and interleaved with its own, the same agent
without any durability capability (`plain`): the floor, as no persistence at all.

  cairn  `capabilities=[CairnDurability()]`, registered with cairn.pydantic_ai.workflow
         and driven in process (create_run + workers.loop.run, PgStore + Redis Leases,
         no broker): each request and tool call one journaled call (a journal row).
  dbos   `capabilities=[DBOSDurability()]`, agent.run awaited in an @DBOS.workflow. By
         default DBOS records the model requests as steps and runs a plain function
         tool in the workflow's own code, unrecorded: 5 durable units, not 9.
  dbos + tool steps  the same, with the tool wrapped in @DBOS.step, so each tool call is
         recorded too: 9 units, as cairn records (the like-for-like row).

Each row: ms per agent run (batches of `runs` agent runs; median, min and max over the
batches), the process's CPU ms per run, the WAL bytes per run (min over batches), the
durable units each run recorded (counted in the database afterwards), and the overhead
over the plain agent measured in the same process.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bench import common
from bench.common import Databases, measure, median, missing_module, progress

if TYPE_CHECKING:
    from bench.sections import Sizes

PROMPT = "Where is parcel 42?"
TOOLS = 4  # tool calls a run, one a turn
REQUESTS = TOOLS + 1  # model requests a run: one per tool turn, then the answer
UNITS = REQUESTS + TOOLS  # durable units a run when every request and tool call is one
ANSWER = f"parcel 42 found after {TOOLS} lookups"
FLOW = "bench_pai"  # the cairn workflow's name

# What really ran in this process, to check each batch made every request and tool call.
made: Counter[str] = Counter()

LABELS = {
    "plain@cairn": "plain agent (no durability), in cairn's process",
    "cairn": "cairn: CairnDurability, in process (PgStore + Redis leases)",
    "plain@dbos": "plain agent (no durability), in DBOS's process",
    "dbos": "DBOS: DBOSDurability (tools unrecorded)",
    "dbos+steps": "DBOS: DBOSDurability + tool as @DBOS.step",
}
PROCESS = {"cairn": ("plain@cairn", "cairn"), "dbos": ("plain@dbos", "dbos", "dbos+steps")}
NEEDS = {"cairn": ("pydantic_ai",), "dbos": ("pydantic_ai", "dbos")}


def missing(system: str) -> str | None:
    """The first module the system needs that cannot be imported, or None."""
    return missing_module(NEEDS[system])


# -- the agent -----------------------------------------------------------------------------
def _script(messages: list[Any], info: Any) -> Any:
    """One tool call a turn for TOOLS turns, then the answer; instant."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart

    made["requests"] += 1
    turn = sum(1 for m in messages if m.kind == "response")
    if turn < TOOLS:
        return ModelResponse(parts=[ToolCallPart("lookup", {"query": f"parcel 42, try {turn}"})])
    return ModelResponse(parts=[TextPart(ANSWER)])


def lookup(query: str) -> str:
    """Look the query up."""
    made["tools"] += 1
    return f"no news about {query}"


def make_agent(name: str, capabilities: list[Any], tool: Callable[..., str] = lookup) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel

    agent = Agent(FunctionModel(_script), name=name, capabilities=capabilities)
    agent.tool_plain(name="lookup")(tool)
    return agent


def _usage(result: Any) -> Any:
    return result.usage  # a property since pydantic-ai 2 (calling it is deprecated)


def _check_plain(result: Any) -> None:
    u = _usage(result)
    if result.output != ANSWER or u.requests != REQUESTS or u.tool_calls != TOOLS:
        raise RuntimeError(
            f"plain agent: output {result.output!r}, {u.requests} requests, {u.tool_calls} tools"
        )


class Batches:
    """Times batches of agent runs for one process's systems, rep by rep."""

    def __init__(self, url: str, runs: int) -> None:
        self.url, self.runs = url, runs
        self.out: dict[str, dict[str, list[float]]] = {}

    def batch(self, key: str, one: Callable[[], Any], check: Callable[[list[Any]], int]) -> None:
        """`runs` calls of one() timed together; check(their results) raises unless every
        run completed, and returns the durable units the runs recorded in all."""
        before = made.copy()
        cpu0 = time.process_time()
        elapsed, wal, got = measure(self.url, lambda: [one() for _ in range(self.runs)])
        cpu = time.process_time() - cpu0
        for what, each in (("requests", REQUESTS), ("tools", TOOLS)):
            n = made[what] - before[what]
            if n != each * self.runs:
                raise RuntimeError(f"{key}: {n} {what} for {self.runs} runs, not {each} each")
        units = check(got)
        s = self.out.setdefault(key, {"ms": [], "cpu_ms": [], "wal": [], "units": []})
        s["ms"].append(1000 * elapsed / self.runs)
        s["cpu_ms"].append(1000 * cpu / self.runs)
        s["wal"].append(wal / self.runs)
        s["units"].append(units / self.runs)

    def rounds(self, reps: int, warmup: int, fns: dict[str, tuple[Any, Any]]) -> None:
        """warmup untimed runs of each, then reps rounds of one batch each, the order
        reversed every other round so no system always goes first."""
        for key, (one, _) in fns.items():
            for _ in range(warmup):
                one()
        order = list(fns)
        for rep in range(reps):
            for key in order if rep % 2 == 0 else order[::-1]:
                self.batch(key, *fns[key])


# -- cairn (child process) -----------------------------------------------------------------
def cairn_child(spec: dict[str, Any]) -> dict[str, Any]:
    import psycopg

    from bench.cairn_sys import InProcess, cairn_setup
    from bench.internals import loop
    from cairn import RunStatus
    from cairn.pydantic_ai import CairnDurability, agent_workflow

    url, runs = spec["url"], int(spec["runs"])
    cairn_setup(url)
    agent_workflow(FLOW, make_agent("bench_pai", [CairnDurability()]))  # once in this process
    plain = make_agent("bench_pai_plain", [])
    inproc = InProcess(url, spec["redis_url"])
    store, deps = inproc.store, inproc.deps
    runner = asyncio.Runner()
    check_conn = psycopg.connect(url, autocommit=True)

    def plain_run() -> Any:
        return runner.run(plain.run(PROMPT))

    def plain_check(results: list[Any]) -> int:
        for r in results:
            _check_plain(r)
        return 0

    def cairn_run() -> tuple[str, Any]:
        run_id = f"{FLOW}-{uuid.uuid4().hex[:12]}"
        store.create_run(run_id, FLOW, {"prompt": PROMPT})
        return run_id, loop.run(run_id, deps)

    def cairn_check(results: list[tuple[str, Any]]) -> int:
        for run_id, status in results:
            run = store.get(run_id)
            state = run.state if run is not None else {}
            usage = state.get("usage") or {}
            if (
                status != RunStatus.DONE
                or state.get("output") != ANSWER
                or usage.get("requests") != REQUESTS
                or usage.get("tool_calls") != TOOLS
            ):
                raise RuntimeError(f"cairn run {run_id} ended {status}: state {state!r:.300}")
        rows = check_conn.execute(
            "SELECT run_id, count(*) FROM journal WHERE run_id = ANY(%s) GROUP BY run_id",
            ([r for r, _ in results],),
        ).fetchall()
        if len(rows) != len(results) or any(n != UNITS for _, n in rows):
            raise RuntimeError(f"cairn journal rows per run: {[n for _, n in rows]}, not {UNITS}")
        return sum(n for _, n in rows)

    b = Batches(url, runs)
    try:
        b.rounds(
            int(spec["reps"]),
            int(spec["warmup"]),
            {"plain@cairn": (plain_run, plain_check), "cairn": (cairn_run, cairn_check)},
        )
    finally:
        check_conn.close()
        inproc.close()
        runner.close()
    return b.out


# -- DBOS (child process) ------------------------------------------------------------------
def dbos_child(spec: dict[str, Any]) -> dict[str, Any]:
    import psycopg
    from dbos import DBOS
    from pydantic_ai.durable_exec.dbos import DBOSDurability

    url, runs = spec["url"], int(spec["runs"])
    plain = make_agent("bench_pai_plain", [])
    agent = make_agent("bench_pai_dbos", [DBOSDurability()])
    stepped = make_agent(
        "bench_pai_dbos_steps", [DBOSDurability()], DBOS.step(name="bench_pai_lookup")(lookup)
    )

    def outcome(result: Any) -> dict[str, Any]:
        u = _usage(result)
        return {
            "id": DBOS.workflow_id,
            "output": result.output,
            "requests": u.requests,
            "tool_calls": u.tool_calls,
        }

    @DBOS.workflow(name="bench_pai")
    async def flow(prompt: str) -> dict[str, Any]:
        return outcome(await agent.run(prompt))

    @DBOS.workflow(name="bench_pai_steps")
    async def flow_steps(prompt: str) -> dict[str, Any]:
        return outcome(await stepped.run(prompt))

    DBOS(config={"name": "cairn-bench-pai", "system_database_url": url, "log_level": "WARNING"})
    DBOS.launch()
    runner = asyncio.Runner()
    check_conn = psycopg.connect(url, autocommit=True)

    def plain_check(results: list[Any]) -> int:
        for r in results:
            _check_plain(r)
        return 0

    def dbos_check(units: int) -> Callable[[list[dict[str, Any]]], int]:
        def check(results: list[dict[str, Any]]) -> int:
            for r in results:
                if (r["output"], r["requests"], r["tool_calls"]) != (ANSWER, REQUESTS, TOOLS):
                    raise RuntimeError(f"dbos workflow {r['id']}: {r!r:.300}")
            ids = [r["id"] for r in results]
            done = check_conn.execute(
                "SELECT count(*) FROM dbos.workflow_status"
                " WHERE workflow_uuid = ANY(%s) AND status = 'SUCCESS'",
                (ids,),
            ).fetchone()
            steps = check_conn.execute(
                "SELECT workflow_uuid, count(*) FROM dbos.operation_outputs"
                " WHERE workflow_uuid = ANY(%s) GROUP BY workflow_uuid",
                (ids,),
            ).fetchall()
            if done is None or done[0] != len(ids):
                raise RuntimeError(f"dbos: {done} of {len(ids)} workflows recorded SUCCESS")
            if len(steps) != len(ids) or any(n != units for _, n in steps):
                raise RuntimeError(f"dbos steps per workflow: {[n for _, n in steps]}, not {units}")
            return sum(n for _, n in steps)

        return check

    b = Batches(url, runs)
    try:
        b.rounds(
            int(spec["reps"]),
            int(spec["warmup"]),
            {
                "plain@dbos": (lambda: runner.run(plain.run(PROMPT)), plain_check),
                "dbos": (lambda: runner.run(flow(PROMPT)), dbos_check(REQUESTS)),
                "dbos+steps": (lambda: runner.run(flow_steps(PROMPT)), dbos_check(UNITS)),
            },
        )
    finally:
        check_conn.close()
        runner.close()
        DBOS.destroy()
    return b.out


CHILDREN = {"cairn": cairn_child, "dbos": dbos_child}


def run_child(system: str, spec: dict[str, Any], timeout: float = 300.0) -> dict[str, Any] | str:
    """The child's samples, or a note saying why the system did not run."""
    gone = missing(system)
    if gone is not None:
        return f"skipped: {gone} not installed"
    got = common.run_child(
        "bench.pai", [system, json.dumps(spec)], f"pydantic_ai {system}", timeout
    )
    return got if isinstance(got, str) else dict(got)


# -- the section (bench process) -----------------------------------------------------------
def _row(key: str, s: dict[str, list[float]]) -> dict[str, Any]:
    return {
        "system": LABELS[key],
        "key": key,
        "ms": median(s["ms"]),
        "min_ms": min(s["ms"]),
        "max_ms": max(s["ms"]),
        "cpu_ms": median(s["cpu_ms"]),
        "wal_bytes": min(s["wal"]),
        "units": median(s["units"]),
        "samples_ms": s["ms"],
        "samples_cpu_ms": s["cpu_ms"],
        "samples_wal": s["wal"],
    }


def section(dbs: Databases, redis_url: str, sz: Sizes) -> dict[str, Any]:
    quick = sz.reps <= 1  # bench.sections.QUICK: a smoke run, seconds
    runs, reps, warmup = (4, 2, 2) if quick else (12, 7, 5)
    rows: list[dict[str, Any]] = []
    for system, keys in PROCESS.items():
        progress(
            f"pydantic_ai: {system} and the plain agent (own process, fresh database), "
            f"{reps} rounds of {runs} agent runs each"
        )
        gone = missing(system)
        if gone is not None:
            rows += [
                {"system": LABELS[k], "key": k, "skipped": f"skipped: {gone} not installed"}
                for k in keys
            ]
            continue
        url = dbs.fresh(f"pai_{system}")
        try:
            got = run_child(
                system,
                {"url": url, "redis_url": redis_url, "runs": runs, "reps": reps, "warmup": warmup},
            )
        finally:
            dbs.drop(url)
        if isinstance(got, str):
            rows += [{"system": LABELS[k], "key": k, "skipped": got} for k in keys]
            continue
        plain = _row(keys[0], got[keys[0]])
        rows.append(plain)
        for k in keys[1:]:
            r = _row(k, got[k])
            r["plain_ms"] = plain["ms"]
            r["vs_plain"] = r["ms"] / plain["ms"] if plain["ms"] else None
            r["overhead_ms"] = r["ms"] - plain["ms"]
            r["overhead_cpu_ms"] = r["cpu_ms"] - plain["cpu_ms"]
            r["overhead_ms_per_unit"] = r["overhead_ms"] / r["units"] if r["units"] else None
            r["overhead_ms_per_9"] = r["overhead_ms"] / UNITS
            # paired: each batch over the plain batch of the same round
            r["paired_overhead_ms"] = median(
                [a - p for a, p in zip(r["samples_ms"], plain["samples_ms"], strict=False)]
            )
            rows.append(r)
    by = {r["key"]: r for r in rows if "skipped" not in r}
    ratios = []
    for k, what in (
        ("dbos+steps", "DBOS with the tool as @DBOS.step (9 units each: like for like)"),
        ("dbos", "DBOS as configured by default (5 units: its tool calls unrecorded)"),
    ):
        if "cairn" in by and k in by and by[k]["overhead_ms"] > 0:
            ratios.append(
                {
                    "vs": k,
                    "what": f"cairn's overhead ÷ that of {what}",
                    "ratio": by["cairn"]["overhead_ms"] / by[k]["overhead_ms"],
                    "per_unit_ratio": by["cairn"]["overhead_ms_per_unit"]
                    / by[k]["overhead_ms_per_unit"],
                }
            )
    return {
        "runs": runs,
        "reps": reps,
        "warmup": warmup,
        "requests": REQUESTS,
        "tool_calls": TOOLS,
        "units": UNITS,
        "rows": rows,
        "ratios": ratios,
        "note": "DBOSDurability leaves plain function tools in the workflow's code (not "
        "steps, so a recovered workflow runs them again); the '+ tool as @DBOS.step' row "
        "records them too, as cairn does: that is the like-for-like comparison. CPU is the "
        "whole process's (DBOS's background threads included). WAL is cluster-wide: the "
        "plain agent writes none, so its rows' WAL is what other clients wrote meanwhile",
    }


def main(argv: list[str]) -> int:
    system, spec = argv[0], json.loads(argv[1])
    return common.child_main(lambda: CHILDREN[system](spec))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
