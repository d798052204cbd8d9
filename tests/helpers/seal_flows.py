"""A run that takes a turn at a time, each a delivery of its own (a short sleep between
them, ended by beat's wake pass, so any worker may take the next), reading the steer
messages its client sent meanwhile (tests/fleet/test_key_deploy.py). A turn reads payloads
its client sealed (the input at the claim, the messages inside the step) and ones a worker
sealed (the state at the claim, the journal), so a key deploy under way meets every mix of
keys, at the claim and inside a step; the run ends once it has read `turns` messages."""

from __future__ import annotations

import time

import cairn

ticked = cairn.workflow("ticked", max_steps=10_000)


@ticked.step()
def turn(ctx: cairn.Context) -> cairn.StepResult:
    got = ctx.messages()  # sealed by the client, opened inside the step
    seen = [*ctx.state.get("seen", []), *(m["i"] for m in got)]
    noted = ctx.call("note", lambda: {"turn": len(seen), "secret": ctx.input["secret"]})
    time.sleep(0.05)  # a model call's time: the deploy goes on meanwhile
    state = {"seen": seen, "noted": noted}
    if len(seen) >= ctx.input["turns"]:
        return cairn.StepResult(cursor=cairn.DONE, state=state)
    return cairn.StepResult(cursor="turn", state=state, sleep=0.2)
