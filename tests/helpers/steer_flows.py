"""A chat agent steered while it runs (tests/fleet/test_steering.py): one step, a turn at
a time, each turn taking in the messages its user added (ctx.messages()) and then
thinking for a while (a journaled call), until a message says stop."""

from __future__ import annotations

import time
from typing import Any

import cairn

chat = cairn.workflow("steered_chat")


def _think(turn: int) -> int:
    time.sleep(0.2)  # a model call's time: the user types meanwhile
    return turn


@chat.step()
def talk(ctx: cairn.Context) -> cairn.StepResult:
    got: list[list[Any]] = []
    for turn in range(200):
        got.append(ctx.messages())
        if "stop" in got[-1]:
            break
        ctx.call("think", _think, turn)
    return cairn.StepResult(cursor=cairn.DONE, state={"got": got})


cut_chat = cairn.workflow("cut_chat")


@cut_chat.step()
def converse(ctx: cairn.Context) -> cairn.StepResult:
    """An agent whose model call its user may cut short with a message (Client.steer(...,
    interrupt=True)): the cut call raises CallInterrupted, and the next turn reads it."""
    got: list[list[Any]] = []
    for _ in range(20):
        got.append(ctx.messages())
        if "stop" in got[-1]:
            break
        asked = {"role": "user", "content": str(got[-1] or "go on")}
        try:
            ctx.model(messages=[asked], max_tokens=16, interruptible=True)
        except cairn.CallInterrupted:
            got.append(["cut"])
    return cairn.StepResult(cursor=cairn.DONE, state={"got": got})
