"""Parallel journaled calls: `python -m bench --only fanout`.

Eight calls of 100 ms each (a tool that waits on the network) in one step, on Postgres and
Redis through the in-process loop: side by side with asyncio.gather over ctx.acall and
with ctx.parallel, against the same eight bare (asyncio.gather of the coroutines, no
journal) and against eight journaled calls one after another. The wall of the calls is
timed inside the step (what the fan-out costs the step), the median of the repetitions;
the run's whole delivery (claim, lease, the save) is reported beside it.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import Any

import cairn
from bench.common import Databases, progress
from bench.internals import Database, Leases, PgStore, loop, upgrade

CALLS, SECONDS = 8, 0.1
FORMS = ("gather", "parallel", "sequential")

flow = cairn.workflow("bench-fanout")  # async: gather, sequential
sync_flow = cairn.workflow("bench-fanout-sync")  # ctx.parallel


async def _wait(i: int) -> int:
    await asyncio.sleep(SECONDS)
    return i


def _wait_sync(i: int) -> int:
    time.sleep(SECONDS)
    return i


@flow.step()
async def fan(ctx: cairn.Context) -> cairn.StepResult:
    form = ctx.input["form"]
    t0 = time.perf_counter()
    if form == "gather":
        got = list(await asyncio.gather(*(ctx.acall("wait", _wait, i) for i in range(CALLS))))
    else:
        got = [await ctx.acall("wait", _wait, i) for i in range(CALLS)]
    assert got == list(range(CALLS)), got
    return cairn.StepResult(cursor="done", state={"calls_s": time.perf_counter() - t0})


@sync_flow.step("fan")
def fan_sync(ctx: cairn.Context) -> cairn.StepResult:
    t0 = time.perf_counter()
    got = ctx.parallel([("wait", _wait_sync, i) for i in range(CALLS)])
    assert got == list(range(CALLS)), got
    return cairn.StepResult(cursor="done", state={"calls_s": time.perf_counter() - t0})


def _bare() -> float:
    async def fan_out() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(_wait(i) for i in range(CALLS)))
        return time.perf_counter() - t0

    return asyncio.run(fan_out())


def section(dbs: Databases, redis_url: str, sz: Any) -> dict[str, Any]:
    reps = 3 if getattr(sz, "quick", False) else 7
    url = dbs.fresh("fanout")
    upgrade(url)
    store = PgStore(Database(url))
    leases = Leases.from_url(redis_url)
    settings = cairn.Settings(database_url=url, redis_url=redis_url)
    deps = loop.Deps(settings=settings, store=store, leases=leases, model=None)
    samples: dict[str, list[float]] = {"bare": []}
    runs: dict[str, list[float]] = {}
    try:
        for rep in range(reps):
            progress(f"fanout: repetition {rep + 1} of {reps}")
            samples["bare"].append(_bare())
            for form in FORMS:
                run_id = f"fanout-{form}-{uuid.uuid4().hex[:8]}"
                workflow = "bench-fanout-sync" if form == "parallel" else "bench-fanout"
                store.create_run(run_id, workflow, {"form": form})
                t0 = time.perf_counter()
                if loop.run(run_id, deps) != "done":
                    raise RuntimeError(f"run {run_id} did not finish")
                runs.setdefault(form, []).append(time.perf_counter() - t0)
                journaled = len(store.journal(run_id, "fan", 0))
                if journaled != CALLS:
                    raise RuntimeError(f"run {run_id} journaled {journaled} calls of {CALLS}")
                run = store.get(run_id)
                assert run is not None
                samples.setdefault(form, []).append(run.state["calls_s"])
    finally:
        store.db.close()
        leases.client.close()
    ms = {k: round(1000 * statistics.median(v), 1) for k, v in samples.items()}
    out: dict[str, Any] = {
        "calls": CALLS,
        "call_ms": SECONDS * 1000,
        "reps": reps,
        "calls_ms": ms,
        "run_ms": {k: round(1000 * statistics.median(v), 1) for k, v in runs.items()},
    }
    for form in ("gather", "parallel"):
        out[f"{form}_vs_bare"] = round(ms[form] / ms["bare"], 3)
    out["sequential_vs_gather"] = round(ms["sequential"] / ms["gather"], 2)
    return out


TARGET = 1.2  # the fan-out's wall over the same calls bare, both forms


def targets(results: dict[str, Any], add: Any) -> None:
    """≤ TARGET × the bare asyncio.gather's wall, for gather and for ctx.parallel."""
    sec = results.get("fanout")
    if not isinstance(sec, dict) or "calls_ms" not in sec:
        return
    ms = sec["calls_ms"]
    for form, how in (("gather", "asyncio.gather over ctx.acall"), ("parallel", "ctx.parallel")):
        add(
            f"{sec['calls']} parallel journaled calls ({how}) ≤ {TARGET:g}× the bare gather",
            sec[f"{form}_vs_bare"] <= TARGET,
            f"{ms[form]:.1f} ms vs {ms['bare']:.1f} ms: {sec[f'{form}_vs_bare']:.3f}×; "
            f"one after another {ms['sequential']:.1f} ms",
        )


def render(results: dict[str, Any], c: Any) -> None:
    from rich.table import Table

    sec = results.get("fanout")
    if not isinstance(sec, dict) or "calls_ms" not in sec:
        return
    t = Table(
        title=f"12. Parallel journaled calls: {sec['calls']} calls of {sec['call_ms']:g} ms in "
        f"one step on PgStore + Redis, median of {sec['reps']} reps; calls = their wall inside "
        "the step, run = the whole delivery (claim, lease, save)"
    )
    for col in ("form", "calls ms", "× bare", "run ms"):
        t.add_column(col, justify="left" if col == "form" else "right")
    bare = sec["calls_ms"]["bare"]
    for form in ("bare", *FORMS):
        t.add_row(
            form,
            f"{sec['calls_ms'][form]:.1f}",
            f"{sec['calls_ms'][form] / bare:.2f}×",
            f"{sec['run_ms'][form]:.1f}" if form in sec["run_ms"] else "",
        )
    c.print(t)
