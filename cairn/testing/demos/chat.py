"""The demo `chat` workflow: one streamed model answer, for a chat UI to watch token by
token (GET /runs/{id}/events, Client.events), then a short second step.

Input: {"prompt": str, "max_tokens": int (1..4096, default 512), "email": str (optional)}.
The answer ends up in state["answer"]; with "email", the second step also emails it there
(the step's idempotency key: a replay after a kill is delivered once), the effect `cairn
chaos chat` counts.
"""

from __future__ import annotations

from typing import Any

import httpx

from cairn.core.errors import InvalidInput, Transient
from cairn.steps.context import Context
from cairn.steps.model import text_of
from cairn.steps.registry import DONE, StepResult, workflow


def _validate(data: dict[str, Any]) -> dict[str, Any]:
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidInput("chat: 'prompt' must be a non-empty string")
    limit = data.get("max_tokens", 512)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 4096:
        raise InvalidInput("chat: 'max_tokens' must be a whole number from 1 to 4096")
    out: dict[str, Any] = {"prompt": prompt, "max_tokens": limit}
    if "email" in data:
        if not isinstance(data["email"], str) or "@" not in data["email"]:
            raise InvalidInput("chat: 'email' must be an email address")
        out["email"] = data["email"]
    return out


flow = workflow("chat", validate=_validate)


@flow.step()
def answer(ctx: Context) -> StepResult:
    """Each text delta is a `token` event as it arrives; the whole answer a `message`."""
    question = {"role": "user", "content": ctx.input["prompt"]}
    reply = ctx.model(stream=True, messages=[question], max_tokens=ctx.input["max_tokens"])
    text = text_of(reply)
    return StepResult(
        cursor="close",
        state={"answer": text},
        window=[*ctx.window, question, {"role": "assistant", "content": text}],
    )


@flow.step("close")
def finish(ctx: Context) -> StepResult:
    ctx.emit("answered", {"chars": len(ctx.state["answer"])})
    if "email" not in ctx.input:
        return StepResult(cursor=DONE)
    body = {
        "to": ctx.input["email"],
        "subject": "Your answer",
        "body": ctx.state["answer"][:2000],
        "ref": ctx.run_id,
    }
    try:
        resp = httpx.post(
            f"{ctx.config.mail_url}/v1/send",
            json=body,
            headers={"Idempotency-Key": ctx.idempotency_key()},
            timeout=30.0,
        )
    except httpx.TransportError as exc:
        raise Transient(f"mail API unreachable: {exc}") from exc
    if resp.status_code >= 500:
        raise Transient(f"mail API answered {resp.status_code}")
    resp.raise_for_status()
    return StepResult(cursor=DONE, state={"email_id": resp.json()["id"]})
