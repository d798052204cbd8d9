"""What the `agent` demo's code versions share: its input, its prompts and its "notify"
tool (cairn.testing.demos.agent is version 1); and version 2 of `agent`, which a rolling
deploy under chaos (`cairn chaos agent --deploy cairn.testing.demos.agent_v2`) swaps in.

Version 2 differs from version 1 by one renamed step (`report` is `summarize`, with its
`renamed=` entry), one added journaled call (`stamp`, the time the loop ended, after the
calls version 1 recorded) and one changed state field (`notes` is `answers`, with a
migration from version 1). `register(reordered=True)` makes the `stamp` call first
instead: a step replayed on a journal version 1 wrote finds `stamp` where `model` was
recorded, the change `cairn deploy check` flags (agent_v2_reordered).

Nothing is registered on import here: a process holds one `agent`, and each version's
module registers its own.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from cairn.core.errors import InvalidInput, Transient
from cairn.steps.context import Context
from cairn.steps.model import text_of
from cairn.steps.registry import DONE, StepResult, Workflow, workflow


def validate(data: dict[str, Any]) -> dict[str, Any]:
    topic, email = data.get("topic", "checkpoints"), data.get("email")
    if not isinstance(topic, str) or not topic.strip():
        raise InvalidInput("agent: 'topic' must be a non-empty string")
    if not isinstance(email, str) or "@" not in email:
        raise InvalidInput("agent: 'email' must be an email address")
    turns = data.get("turns", 8)
    if isinstance(turns, bool) or not isinstance(turns, int) or not 1 <= turns <= 20:
        raise InvalidInput("agent: 'turns' must be a whole number from 1 to 20")
    return {"topic": topic, "email": email, "turns": turns}


def question(ctx: Context, turn: int, notes: list[str]) -> dict[str, Any]:
    return {
        "role": "user",
        "content": f"Turn {turn} on {ctx.input['topic']!r}; notes so far: {notes[-2:]}",
    }


def notify_body(ctx: Context, turn: int, note: str) -> dict[str, Any]:
    return {
        "to": ctx.input["email"],
        "subject": f"Agent progress: turn {turn}",
        "body": note[:200],
        "ref": ctx.run_id,
    }


def checked(resp: httpx.Response) -> dict[str, Any]:
    if resp.status_code >= 500:
        raise Transient(f"mail API answered {resp.status_code}")
    resp.raise_for_status()
    return {"email_id": resp.json()["id"]}


def notifies(turn: int, turns: int) -> bool:
    """Three notifications spread over the loop (the tool calls of this agent)."""
    return turn in {turns // 4, turns // 2, turns - 1}


def notify(ctx: Context, turn: int, note: str) -> dict[str, Any]:
    try:
        resp = httpx.post(
            f"{ctx.config.mail_url}/v1/send",
            json=notify_body(ctx, turn, note),
            headers={"Idempotency-Key": ctx.idempotency_key()},  # this call's own key
            timeout=30.0,
        )
    except httpx.TransportError as exc:
        raise Transient(f"mail API unreachable: {exc}") from exc
    return checked(resp)


def upgrade_state(state: dict[str, Any]) -> dict[str, Any]:
    """Version 1's state as version 2 reads it: the model's answers are `answers`."""
    state["answers"] = state.pop("notes", [])
    return state


def register(*, reordered: bool = False) -> Workflow:
    """Register version 2 of `agent` (with reordered, its `stamp` call made first)."""
    flow = workflow("agent", validate=validate, version=2, renamed={"report": "summarize"})
    flow.migration(from_version=1)(upgrade_state)

    @flow.step()
    def work(ctx: Context) -> StepResult:
        """Version 1's loop, then the time it ended (journaled: a replay reads it back)."""
        if reordered:
            stamped = ctx.call("stamp", time.time)
        answers: list[str] = []
        sent = []
        turns = ctx.input["turns"]
        for turn in range(turns):
            reply = ctx.model(messages=[question(ctx, turn, answers)], max_tokens=48)
            answers.append(text_of(reply).strip())
            if notifies(turn, turns):
                sent.append(ctx.call("notify", notify, ctx, turn, answers[-1]))
        if not reordered:
            stamped = ctx.call("stamp", time.time)
        state = {"answers": answers, "sent": sent, "stamped": stamped}
        return StepResult(cursor="summarize", state=state)

    @flow.step()
    def summarize(ctx: Context) -> StepResult:
        return StepResult(cursor=DONE, state={"outcome": f"{len(ctx.state['answers'])} notes"})

    return flow
