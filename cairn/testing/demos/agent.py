"""The demo `agent` and `agent_async` workflows: an agent loop in ONE step, as most teams
write one. Eight model calls and three tool effects (a "notify" email, keyed per call)
interleaved in `work`, then `report`. Every call is journaled, so a crash anywhere in the
loop costs at most the call in flight; `cairn chaos agent` kills it at every call.

Input: {"topic": str, "email": str, "turns": int (1..20, default 8)}.
"""

from __future__ import annotations

from typing import Any

import httpx

from cairn.core.errors import InvalidInput, Transient
from cairn.steps.context import Context
from cairn.steps.model import text_of
from cairn.steps.registry import DONE, StepResult, workflow


def _validate(data: dict[str, Any]) -> dict[str, Any]:
    topic, email = data.get("topic", "checkpoints"), data.get("email")
    if not isinstance(topic, str) or not topic.strip():
        raise InvalidInput("agent: 'topic' must be a non-empty string")
    if not isinstance(email, str) or "@" not in email:
        raise InvalidInput("agent: 'email' must be an email address")
    turns = data.get("turns", 8)
    if isinstance(turns, bool) or not isinstance(turns, int) or not 1 <= turns <= 20:
        raise InvalidInput("agent: 'turns' must be a whole number from 1 to 20")
    return {"topic": topic, "email": email, "turns": turns}


def _question(ctx: Context, turn: int, notes: list[str]) -> dict[str, Any]:
    return {
        "role": "user",
        "content": f"Turn {turn} on {ctx.input['topic']!r}; notes so far: {notes[-2:]}",
    }


def _notify_body(ctx: Context, turn: int, note: str) -> dict[str, Any]:
    return {
        "to": ctx.input["email"],
        "subject": f"Agent progress: turn {turn}",
        "body": note[:200],
        "ref": ctx.run_id,
    }


def _checked(resp: httpx.Response) -> dict[str, Any]:
    if resp.status_code >= 500:
        raise Transient(f"mail API answered {resp.status_code}")
    resp.raise_for_status()
    return {"email_id": resp.json()["id"]}


def _notifies(turn: int, turns: int) -> bool:
    """Three notifications spread over the loop (the tool calls of this agent)."""
    return turn in {turns // 4, turns // 2, turns - 1}


def _notify(ctx: Context, turn: int, note: str) -> dict[str, Any]:
    try:
        resp = httpx.post(
            f"{ctx.config.mail_url}/v1/send",
            json=_notify_body(ctx, turn, note),
            headers={"Idempotency-Key": ctx.idempotency_key()},  # this call's own key
            timeout=30.0,
        )
    except httpx.TransportError as exc:
        raise Transient(f"mail API unreachable: {exc}") from exc
    return _checked(resp)


flow = workflow("agent", validate=_validate)


@flow.step()
def work(ctx: Context) -> StepResult:
    """The loop: ask the model, note its answer, notify at three turns."""
    notes: list[str] = []
    sent = []
    turns = ctx.input["turns"]
    for turn in range(turns):
        reply = ctx.model(messages=[_question(ctx, turn, notes)], max_tokens=48)
        notes.append(text_of(reply).strip())
        if _notifies(turn, turns):
            sent.append(ctx.call("notify", _notify, ctx, turn, notes[-1]))
    return StepResult(cursor="report", state={"notes": notes, "sent": sent})


@flow.step()
def report(ctx: Context) -> StepResult:
    return StepResult(cursor=DONE, state={"outcome": f"{len(ctx.state['notes'])} notes"})


async def _anotify(ctx: Context, turn: int, note: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=30.0) as client:
        try:
            resp = await client.post(
                f"{ctx.config.mail_url}/v1/send",
                json=_notify_body(ctx, turn, note),
                headers={"Idempotency-Key": ctx.idempotency_key()},
            )
        except httpx.TransportError as exc:
            raise Transient(f"mail API unreachable: {exc}") from exc
    return _checked(resp)


async_flow = workflow("agent_async", validate=_validate)


@async_flow.step("work")
async def work_async(ctx: Context) -> StepResult:
    """The same loop as async code: ctx.amodel, ctx.acall of an httpx.AsyncClient call."""
    notes: list[str] = []
    sent: list[dict[str, Any]] = []
    turns = ctx.input["turns"]
    for turn in range(turns):
        reply = await ctx.amodel(messages=[_question(ctx, turn, notes)], max_tokens=48)
        notes.append(text_of(reply).strip())
        if _notifies(turn, turns):
            sent.append(await ctx.acall("notify", _anotify, ctx, turn, notes[-1]))
    return StepResult(cursor="report", state={"notes": notes, "sent": sent})


async_flow.step("report")(report)
