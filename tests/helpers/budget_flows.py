"""Workflows of the budget tests: `spender` spawns `children` runs of `spend` (each makes
`calls` model calls to the stand-in), waits for them, then makes one call of its own.
A child with `fail_once` (a folder) raises after its calls on its first attempt, so its
retry replays them from the journal."""

from __future__ import annotations

import os
from typing import Any

import cairn
from cairn import Context, StepResult, workflow

spender = workflow("spender")
spend = workflow("spend")
RETRY = cairn.Retry(attempts=3, backoff=0.01, on=(ValueError,))


def ask(ctx: Context, tag: str) -> Any:
    question = {"role": "user", "content": f"REPLY: ok {tag}"}
    return ctx.model(messages=[question], max_tokens=16)


@spender.step()
def fan(ctx: Context) -> StepResult:
    n = ctx.input.get("children", 0)
    if not n:
        return StepResult(cursor="last")
    kids = [
        cairn.Child(
            "spend", {"calls": ctx.input.get("calls", 1), "i": i, **ctx.input.get("child", {})}
        )
        for i in range(n)
    ]
    return StepResult.spawn(kids, cursor="last")


@spender.step()
def last(ctx: Context) -> StepResult:
    ask(ctx, "parent")
    return StepResult(cursor="done")


@spend.step(retry=RETRY)
def calls(ctx: Context) -> StepResult:
    for k in range(ctx.input["calls"]):
        ask(ctx, f"{ctx.input['i']}-{k}")
    folder = ctx.input.get("fail_once")
    if folder:
        marker = os.path.join(folder, f"{ctx.run_id}.failed")
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise ValueError("the first attempt fails after its calls")
    return StepResult(cursor="done")
