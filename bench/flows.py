"""The bench's workflows (plugged into workers with CAIRN_WORKFLOWS=bench.flows) and a
no-op Celery task, the ceiling of the queue itself."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import shared_task
from celery.signals import task_prerun

from bench.common import message
from cairn import Child, Context, StepResult, workflow

NOOP = "bench_noop"
SLOW = "bench_slow"
NOOP_COUNTER = "bench:noop:done"

noop = workflow(NOOP, max_steps=1_000_000)


@noop.step()
def tick(ctx: Context) -> StepResult:
    """input: steps (how many visits), append_bytes (0: leave the window as it is)."""
    n = int(ctx.state.get("n", 0)) + 1
    size = int(ctx.input.get("append_bytes", 0))
    win = [*ctx.window, message(size, n)] if size else None
    cursor = "done" if n >= int(ctx.input["steps"]) else "tick"
    return StepResult(cursor=cursor, state={"n": n}, window=win)


CALLS = "bench_calls"
calls = workflow(CALLS, max_steps=1_000_000)


def _tool(n: int) -> dict[str, int]:
    return {"n": n}


@calls.step("tick")
def tick_calls(ctx: Context) -> StepResult:
    """bench_noop's step with input["calls"] journaled calls of a no-op tool in it."""
    n = int(ctx.state.get("n", 0)) + 1
    for i in range(int(ctx.input["calls"])):
        ctx.call("tool", _tool, i)
    cursor = "done" if n >= int(ctx.input["steps"]) else "tick"
    return StepResult(cursor=cursor, state={"n": n})


slow = workflow(SLOW, max_steps=1_000_000)


@slow.step()
def nap(ctx: Context) -> StepResult:
    """A long run of short steps, to be killed in the middle of."""
    time.sleep(float(ctx.input.get("sleep", 0.02)))
    n = int(ctx.state.get("n", 0)) + 1
    return StepResult(cursor="done" if n >= int(ctx.input["steps"]) else "nap", state={"n": n})


WAITING = "bench_waiting"
waiting = workflow(WAITING, max_steps=1_000)


@waiting.step()
def ask(ctx: Context) -> StepResult:
    """An agent's step: one model call (the stand-in answers after its delay), nothing else."""
    n = int(ctx.state.get("n", 0)) + 1
    ctx.model(max_tokens=16, messages=[{"role": "user", "content": f"step {n}"}])
    return StepResult(cursor="done" if n >= int(ctx.input["steps"]) else "ask", state={"n": n})


_redis: Any = None


@shared_task(name="bench.noop", ignore_result=True)
def noop_task() -> None:
    """Counts itself done in Redis: one round trip, next to cairn's save + lease."""
    global _redis
    if _redis is None:
        import redis

        _redis = redis.Redis.from_url(os.environ["CAIRN_REDIS_URL"])
    _redis.incr(NOOP_COUNTER)


# -- bench/flow.py: concurrency keys and child runs ------------------------------------------
KEYED = "bench_keyed"
FANOUT = "bench_fanout"
keyed = workflow(KEYED)


@keyed.step()
def once(ctx: Context) -> StepResult:
    """One step (sleeping input["sleep"] seconds, 0 by default): enqueued with a
    concurrency key or without, and the child of bench_fanout."""
    sleep = float(ctx.input.get("sleep", 0))
    if sleep:
        time.sleep(sleep)
    return StepResult(cursor="done")


fanout = workflow(FANOUT)


@fanout.step()
def spread(ctx: Context) -> StepResult:
    """input["n"] one-step bench_keyed children; `total` runs once all have stopped."""
    kids = [Child(KEYED, {}) for _ in range(int(ctx.input["n"]))]
    return StepResult.spawn(kids, cursor="total")


@fanout.step()
def total(ctx: Context) -> StepResult:
    kids = ctx.children()
    return StepResult(cursor="done", state={"done": sum(1 for k in kids if k.status == "done")})


# -- bench/latency.py: enqueue to the first step's start --------------------------------------
LATENCY = "bench_latency"
LATENCY_IDS = "lat-"  # its runs' ids begin so: only theirs are stamped at their task's start
STAMPS = "bench:latency:stamps"
latency = workflow(LATENCY)


def _stamp(tag: str) -> None:
    """tag and the wall clock now, pushed to Redis: when a step or task began."""
    global _redis
    if _redis is None:
        import redis

        _redis = redis.Redis.from_url(os.environ["CAIRN_REDIS_URL"])
    _redis.rpush(STAMPS, f"{tag} {time.time()}")


@latency.step()
def first(ctx: Context) -> StepResult:
    """Its first line stamps when the step began; the run ends there."""
    _stamp(ctx.run_id)
    return StepResult(cursor="done")


@shared_task(name="bench.stamp", ignore_result=True)
def stamp_task(tag: str) -> None:
    """The floor: a bare Celery task that stamps when it began, as `first` does."""
    _stamp(tag)


# -- bench/backlog.py: deliveries of the backlog's runs, duplicates included ------------------
BACKLOG_IDS = "backlog-"  # its runs' ids begin so: only their deliveries are counted
BACKLOG_DELIVERIES = "bench:backlog:deliveries"


@task_prerun.connect
def _task_began(task: Any = None, args: Any = None, **_: Any) -> None:
    """A cairn run's task began (before the loop's lease, claim and load): stamped apart,
    to split the latency into the queue's part and the loop's; a backlog run's counted."""
    global _redis
    if task is None or task.name != "cairn.run":
        return
    if str(args[0]).startswith(LATENCY_IDS):
        _stamp(f"task:{args[0]}")
    elif str(args[0]).startswith(BACKLOG_IDS):
        if _redis is None:
            import redis

            _redis = redis.Redis.from_url(os.environ["CAIRN_REDIS_URL"])
        _redis.incr(BACKLOG_DELIVERIES)
