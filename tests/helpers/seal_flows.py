"""A run that takes one turn per signal its client sends (tests/fleet/test_key_deploy.py):
each turn is a delivery of its own, which any worker may take, and reads a payload its
client sealed (the signal, the input) and one a worker sealed (the state, the journal),
so a key deploy under way meets every mix of keys."""

from __future__ import annotations

import time

import cairn

ticked = cairn.workflow("ticked")


@ticked.step()
def turn(ctx: cairn.Context) -> cairn.StepResult:
    seen = [*ctx.state.get("seen", []), *([ctx.signal["i"]] if ctx.signal else [])]
    noted = ctx.call("note", lambda: {"turn": len(seen), "secret": ctx.input["secret"]})
    time.sleep(0.05)  # a model call's time: the deploy goes on meanwhile
    state = {"seen": seen, "noted": noted}
    if len(seen) >= ctx.input["turns"]:
        return cairn.StepResult(cursor=cairn.DONE, state=state)
    return cairn.StepResult.wait("tick", cursor="turn", state=state)
