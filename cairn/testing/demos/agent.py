"""The demo `agent` and `agent_async` workflows: an agent loop in ONE step, as most teams
write one. Eight model calls and three tool effects (a "notify" email, keyed per call)
interleaved in `work`, then `report`. Every call is journaled, so a crash anywhere in the
loop costs at most the call in flight; `cairn chaos agent` kills it at every call.

Input: {"topic": str, "email": str, "turns": int (1..20, default 8)}.
"""

from __future__ import annotations

from typing import Any

import httpx

from cairn.core.errors import Transient
from cairn.steps.context import Context
from cairn.steps.model import text_of
from cairn.steps.registry import DONE, StepResult, workflow
from cairn.testing.demos.agent_parts import (
    checked,
    notifies,
    notify,
    notify_body,
    question,
    validate,
)

flow = workflow("agent", validate=validate)


@flow.step()
def work(ctx: Context) -> StepResult:
    """The loop: ask the model, note its answer, notify at three turns."""
    notes: list[str] = []
    sent = []
    turns = ctx.input["turns"]
    for turn in range(turns):
        reply = ctx.model(messages=[question(ctx, turn, notes)], max_tokens=48)
        notes.append(text_of(reply).strip())
        if notifies(turn, turns):
            sent.append(ctx.call("notify", notify, ctx, turn, notes[-1]))
    return StepResult(cursor="report", state={"notes": notes, "sent": sent})


@flow.step()
def report(ctx: Context) -> StepResult:
    return StepResult(cursor=DONE, state={"outcome": f"{len(ctx.state['notes'])} notes"})


async def _anotify(ctx: Context, turn: int, note: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=30.0) as client:
        try:
            resp = await client.post(
                f"{ctx.config.mail_url}/v1/send",
                json=notify_body(ctx, turn, note),
                headers={"Idempotency-Key": ctx.idempotency_key()},
            )
        except httpx.TransportError as exc:
            raise Transient(f"mail API unreachable: {exc}") from exc
    return checked(resp)


async_flow = workflow("agent_async", validate=validate)


@async_flow.step("work")
async def work_async(ctx: Context) -> StepResult:
    """The same loop as async code: ctx.amodel, ctx.acall of an httpx.AsyncClient call."""
    notes: list[str] = []
    sent: list[dict[str, Any]] = []
    turns = ctx.input["turns"]
    for turn in range(turns):
        reply = await ctx.amodel(messages=[question(ctx, turn, notes)], max_tokens=48)
        notes.append(text_of(reply).strip())
        if notifies(turn, turns):
            sent.append(await ctx.acall("notify", _anotify, ctx, turn, notes[-1]))
    return StepResult(cursor="report", state={"notes": notes, "sent": sent})


async_flow.step("report")(report)
