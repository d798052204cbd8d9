"""The shipped `chat` workflow: one streamed model answer, for a chat UI to watch token by
token (GET /runs/{id}/events, Client.events), then a short second step.

Input: {"prompt": str, "max_tokens": int (1..4096, default 512)}. The answer ends up in
state["answer"].
"""

from __future__ import annotations

from typing import Any

from cairn.errors import InvalidInput
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
    return {"prompt": prompt, "max_tokens": limit}


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
    return StepResult(cursor=DONE)
