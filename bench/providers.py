"""A journaled model call per provider: `python -m bench --only providers`.

For each API cairn speaks (Anthropic Messages, OpenAI Chat Completions, OpenAI
Responses), the same small request sent `calls` times in a row to the model stand-in
(`cairn standin model`, a process of its own, answering at once), two ways, interleaved
rep by rep in this one process:

  bare   the provider's SDK client as a user makes it (`anthropic.Anthropic`,
         `openai.OpenAI`, retries off), `create` called in a loop: the floor.
  cairn  one step making the same calls through `ctx.model`, driven in process
         (workers.loop.run on PgStore + Redis leases, no broker) with what a worker
         gives a step: its ModelClient from settings (the fleet's rate limiter, no limit
         set: asked in Redis when its bucket was last found clear over 100 ms ago), the
         metrics middleware and the run events. Each call is checked against the lease
         and the cancel (the last record's read of it), booked, sent, priced, journaled in
         Postgres (a row as it returns, one round trip, committed without waiting for
         the disk: see PgStore.record_call) and told as a `message` event.
         Timed inside the step, around its calls only (the run's claim and save are
         per-step costs, measured by the per_step section).

Reported per provider: ms per call (median over reps) of each, the ratio (the median of
each rep's cairn ÷ its bare), and the ms cairn adds per call (the median of each rep's
difference). Target: ≤ 1 ms added per call.

Then an OpenAI Agents SDK agent of 5 turns (4 function tool calls, then the answer, as
the stand-in's `TOOLS:` line scripts it), `runs` runs a rep, four ways interleaved:

  plain    Runner.run on the SDK's own OpenAI provider: no durability, the floor.
  sqlite   the same with the SDK's own session store, SQLiteSession on a file.
  cairn    agent_workflow's run driven as above: every request and tool call journaled.
  cairn+s  the same with session=True: the items in Postgres with the step's checkpoint.

Reported: ms per turn (a run's wall time ÷ 5; for cairn the loop's whole run: lease,
claim, step, save), each way's ratio to plain (the median of each rep's ratio) and the ms
it adds a turn (the median of each rep's difference).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import httpx

import cairn
from bench.common import ROOT, median, progress
from bench.internals import (
    Chain,
    Database,
    Leases,
    Metrics,
    ModelClient,
    Outbox,
    PgStore,
    RedisEvents,
    fleet,
    loop,
    upgrade,
)

if TYPE_CHECKING:
    from bench.common import Databases
    from bench.sections import Sizes

FLOW = "bench_providers"
TARGET_MS = 1.0  # what a journaled call may add over the bare SDK call
LOG = ROOT / ".cairn" / "bench-providers" / "standin.log"


@dataclasses.dataclass(frozen=True)
class ProviderSizes:
    calls: int = 50  # calls per rep, each way
    reps: int = 7


QUICK = ProviderSizes(calls=20, reps=3)


@dataclasses.dataclass(frozen=True)
class AgentSizes:
    runs: int = 4  # agent runs per rep, each way (~20 s in all: the section's budget)
    reps: int = 5


AGENT_QUICK = AgentSizes(runs=3, reps=3)
AGENT_FLOW = "bench_oa_agent"
AGENT_TURNS = 5
AGENT_PROMPT = "TOOLS: lookup, lookup, lookup, lookup\nWhere is my parcel?"
AGENT_WAYS = ("plain", "sqlite", "cairn", "cairn+s")

# (row, the SDK's request): the same small prompt and answer on each API.
ASK = "REPLY: The parcel left the depot at nine and arrives tomorrow."
REQUESTS: dict[str, dict[str, Any]] = {
    "anthropic messages": {
        "model": "claude-haiku-4-5",
        "messages": [{"role": "user", "content": ASK}],
        "max_tokens": 64,
    },
    "openai chat": {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": ASK}],
        "max_tokens": 64,
    },
    "openai responses": {"model": "gpt-4.1-mini", "input": ASK, "max_output_tokens": 64},
}

flow = cairn.workflow(FLOW)


@flow.step()
def ask(ctx: cairn.Context) -> cairn.StepResult:
    request, calls = ctx.input["request"], ctx.input["calls"]
    t0 = time.perf_counter()
    for _ in range(calls):
        ctx.model(**request)
    return cairn.StepResult(cursor=cairn.DONE, state={"s": time.perf_counter() - t0})


def sizes(sz: Sizes) -> ProviderSizes:
    from bench import sections

    return QUICK if sz == sections.QUICK else ProviderSizes()


class _Bare:
    """The providers' SDK clients as a user makes them, against the stand-in."""

    def __init__(self, url: str) -> None:
        import anthropic
        import openai

        self.anthropic = anthropic.Anthropic(api_key="local", base_url=url, max_retries=0)
        self.openai = openai.OpenAI(api_key="local", base_url=f"{url}/v1", max_retries=0)

    def send(self, row: str, request: dict[str, Any]) -> Any:
        if row == "anthropic messages":
            return self.anthropic.messages.create(**request)
        if row == "openai chat":
            return self.openai.chat.completions.create(**request)
        return self.openai.responses.create(**request)

    def close(self) -> None:
        self.anthropic.close()
        self.openai.close()


class _AgentBench:
    """The Agents SDK agent the four ways time, registered as cairn workflows once."""

    _made: ClassVar[dict[str, Any]] = {}  # the agent and its workflows, made at the first section

    def __init__(self, openai_url: str, tmp: Path) -> None:
        from agents import Agent, OpenAIProvider, RunConfig, function_tool
        from openai import AsyncOpenAI

        from cairn.openai_agents import agent_workflow

        if not self._made:

            @function_tool
            def lookup(query: str) -> str:
                """Search the help pages."""
                return f"help page about {query}"

            agent = Agent(name="support", model="gpt-5-mini", tools=[lookup])
            # The stand-in has no trace endpoint: the SDK's traces would go to OpenAI.
            config = RunConfig(tracing_disabled=True)
            agent_workflow(AGENT_FLOW, agent, config=config)
            agent_workflow(AGENT_FLOW + "_session", agent, config=config, session=True)
            self._made["agent"] = agent
        self.agent = self._made["agent"]
        self.client = AsyncOpenAI(api_key="local", base_url=openai_url, max_retries=0)
        self.config = RunConfig(
            tracing_disabled=True,
            model_provider=OpenAIProvider(openai_client=self.client, use_responses=True),
        )
        self.tmp = tmp
        self.loop = asyncio.new_event_loop()  # one loop: the SDK's client keeps its pool

    def plain(self, session: bool) -> float:
        from agents import Runner, SQLiteSession

        memory = SQLiteSession(uuid.uuid4().hex, self.tmp / "sessions.db") if session else None
        t0 = time.perf_counter()
        result = self.loop.run_until_complete(
            Runner.run(self.agent, AGENT_PROMPT, run_config=self.config, session=memory)
        )
        took = time.perf_counter() - t0
        if memory is not None:
            memory.close()
        if len(result.raw_responses) != AGENT_TURNS:
            raise RuntimeError(f"the agent took {len(result.raw_responses)} turns")
        return took

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


def _standin() -> tuple[Any, str]:
    """`cairn standin model` in a process of its own, once it answers."""
    port = fleet.free_port()
    cairn_bin = str(ROOT / ".venv" / "bin" / "cairn")
    argv = [cairn_bin, "standin", "model", "--port", str(port)]
    if not (ROOT / ".venv" / "bin" / "cairn").exists():
        argv = [sys.executable, "-m", "cairn.cli", "standin", "model", "--port", str(port)]
    proc = fleet.Proc(argv, dict(os.environ), LOG, "standin")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{url}/_stats", timeout=1)
            return proc, url
        except httpx.HTTPError:
            if time.monotonic() > deadline or not proc.alive():
                proc.kill()
                raise RuntimeError(f"the model stand-in did not start:\n{proc.text()[-2000:]}")
            time.sleep(0.05)


def section(dbs: Databases, redis_url: str, sz: Sizes) -> dict[str, Any]:
    size = sizes(sz)
    url = dbs.fresh("providers")
    upgrade(url)
    standin, model_url = _standin()
    settings = cairn.Settings(
        database_url=url,
        redis_url=redis_url,
        anthropic_base_url=model_url,
        openai_base_url=f"{model_url}/v1",
    )
    db = Database(url, give_up_after=settings.store_give_up_after)
    store = PgStore(db)
    leases = Leases.from_url(redis_url)
    model = ModelClient.from_settings(settings, leases.client)
    deps = loop.Deps(
        settings=settings,
        store=store,
        leases=leases,
        model=model,
        middleware=Chain([Metrics()]),
        events=Outbox(RedisEvents(leases.client), settings),
    )
    bare = _Bare(model_url)

    def bare_s(row: str, calls: int) -> float:
        request = REQUESTS[row]
        t0 = time.perf_counter()
        for _ in range(calls):
            bare.send(row, request)
        return time.perf_counter() - t0

    def cairn_s(row: str, calls: int) -> float:
        run_id = f"{FLOW}-{uuid.uuid4().hex[:10]}"
        store.create_run(run_id, FLOW, {"request": REQUESTS[row], "calls": calls})
        if loop.run(run_id, deps) != "done":
            raise RuntimeError(f"run {run_id} did not finish")
        journaled = len(store.journal(run_id, "ask", 0))
        if journaled != calls:
            raise RuntimeError(f"run {run_id} journaled {journaled} calls of {calls}")
        run = store.get(run_id)
        assert run is not None
        return float(run.state["s"])

    samples: dict[str, dict[str, list[float]]] = {
        row: {"bare": [], "cairn": []} for row in REQUESTS
    }
    try:
        for row in REQUESTS:  # warm-up: imports, connections, prepared statements
            bare_s(row, 5)
            cairn_s(row, 5)
        for rep in range(size.reps):
            progress(f"providers rep {rep + 1}/{size.reps}")
            for row in REQUESTS:
                # Alternate which goes first, so neither always meets a warmer machine.
                order = ("bare", "cairn") if rep % 2 == 0 else ("cairn", "bare")
                for way in order:
                    took = bare_s(row, size.calls) if way == "bare" else cairn_s(row, size.calls)
                    samples[row][way].append(took * 1000 / size.calls)
        agents = _agents(deps, f"{model_url}/v1", agent_sizes(sz))
    finally:
        bare.close()
        model.close()
        leases.client.close()
        db.close()
        standin.kill()
        dbs.drop(url)
    rows = []
    for row, got in samples.items():
        pairs = list(zip(got["cairn"], got["bare"], strict=True))
        rows.append(
            {
                "api": row,
                "model": REQUESTS[row]["model"],
                "bare_ms": median(got["bare"]),
                "cairn_ms": median(got["cairn"]),
                "ratio": median([c / b for c, b in pairs]),
                "added_ms": median([c - b for c, b in pairs]),
                "added_min_ms": min(c - b for c, b in pairs),
                "added_max_ms": max(c - b for c, b in pairs),
            }
        )
    return {"calls": size.calls, "reps": size.reps, "rows": rows, "agents": agents}


def agent_sizes(sz: Sizes) -> AgentSizes:
    from bench import sections

    return AGENT_QUICK if sz == sections.QUICK else AgentSizes()


def _agents(deps: Any, openai_url: str, size: AgentSizes) -> dict[str, Any]:
    """The 5-turn agent the four ways, interleaved rep by rep: ms per turn and ratios."""
    with tempfile.TemporaryDirectory() as tmp:
        bench = _AgentBench(openai_url, Path(tmp))
        store = deps.store

        def cairn_run(session: bool) -> float:
            run_id = f"{AGENT_FLOW}-{uuid.uuid4().hex[:10]}"
            flow = AGENT_FLOW + ("_session" if session else "")
            given = {"prompt": AGENT_PROMPT, "session_id": run_id} if session else {}
            store.create_run(run_id, flow, {"prompt": AGENT_PROMPT, **given})
            t0 = time.perf_counter()
            if loop.run(run_id, deps) != "done":
                raise RuntimeError(f"run {run_id} did not finish")
            took = time.perf_counter() - t0
            journaled = [c.name for c in store.journal(run_id, "agent", 0)]
            if journaled.count("model") != AGENT_TURNS:
                raise RuntimeError(f"run {run_id} journaled {journaled}")
            return took

        ways = {
            "plain": lambda: bench.plain(False),
            "sqlite": lambda: bench.plain(True),
            "cairn": lambda: cairn_run(False),
            "cairn+s": lambda: cairn_run(True),
        }
        per_turn: dict[str, list[float]] = {w: [] for w in AGENT_WAYS}
        try:
            for way in AGENT_WAYS:  # warm-up: imports, connections, the event loops
                ways[way]()
            for rep in range(size.reps):
                progress(f"agents rep {rep + 1}/{size.reps}")
                # Rotate who goes first, so none always meets a warmer machine.
                order = AGENT_WAYS[rep % 4 :] + AGENT_WAYS[: rep % 4]
                for way in order:
                    took = sum(ways[way]() for _ in range(size.runs))
                    per_turn[way].append(took * 1000 / (size.runs * AGENT_TURNS))
        finally:
            bench.close()
    rows = []
    for way in AGENT_WAYS:
        pairs = list(zip(per_turn[way], per_turn["plain"], strict=True))
        rows.append(
            {
                "way": way,
                "ms_per_turn": median(per_turn[way]),
                "ratio": median([w / p for w, p in pairs]),
                "added_ms": median([w - p for w, p in pairs]),
                "min_ms": min(per_turn[way]),
                "max_ms": max(per_turn[way]),
                "reps_ms": per_turn[way],
            }
        )
    return {"runs": size.runs, "reps": size.reps, "turns": AGENT_TURNS, "rows": rows}


def targets(results: dict[str, Any], add: Any) -> None:
    """≤ TARGET_MS added per journaled call, for each API."""
    sec = results.get("providers")
    if not isinstance(sec, dict):
        return
    for r in sec.get("rows", []):
        add(
            f"a journaled ctx.model call adds ≤ {TARGET_MS:g} ms over the bare SDK call "
            f"({r['api']})",
            r["added_ms"] <= TARGET_MS,
            f"{r['cairn_ms']:.3f} ms vs {r['bare_ms']:.3f} ms a call: +{r['added_ms']:.3f} ms "
            f"(reps {r['added_min_ms']:.3f}..{r['added_max_ms']:.3f}), {r['ratio']:.2f}×",
        )


def render(results: dict[str, Any], c: Any) -> None:
    from rich.table import Table

    sec = results.get("providers")
    if not isinstance(sec, dict) or "rows" not in sec:
        return
    t = Table(
        title=f"11. A journaled model call per provider: {sec['calls']} calls a rep to the "
        f"stand-in (its own process), median of {sec['reps']} reps; bare = the SDK's "
        "create(); cairn = ctx.model in a step on PgStore + Redis (limiter, journal, events)"
    )
    for col in ("api", "model", "bare ms/call", "cairn ms/call", "× bare", "added ms/call"):
        t.add_column(col, justify="left" if col in ("api", "model") else "right")
    for r in sec["rows"]:
        t.add_row(
            r["api"],
            r["model"],
            f"{r['bare_ms']:.3f}",
            f"{r['cairn_ms']:.3f}",
            f"{r['ratio']:.2f}×",
            f"{r['added_ms']:.3f}",
        )
    c.print(t)
    agents = sec.get("agents")
    if not isinstance(agents, dict):
        return
    t = Table(
        title=f"11b. An OpenAI Agents SDK agent of {agents['turns']} turns (4 tool calls, then "
        f"the answer), {agents['runs']} runs a rep each way, median of {agents['reps']} reps: "
        "plain = Runner.run; sqlite = with SQLiteSession on a file; cairn = agent_workflow "
        "run by the loop on PgStore + Redis; cairn+s = with session=True (Postgres)"
    )
    for col in ("way", "ms/turn", "× plain", "added ms/turn", "reps' ms/turn"):
        t.add_column(col, justify="left" if col == "way" else "right")
    for r in agents["rows"]:
        t.add_row(
            r["way"],
            f"{r['ms_per_turn']:.2f}",
            f"{r['ratio']:.2f}×",
            f"{r['added_ms']:.2f}",
            f"{r['min_ms']:.2f}..{r['max_ms']:.2f}",
        )
    c.print(t)
