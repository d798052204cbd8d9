"""Workflows of tests/fleet/test_pinned.py: one pinned to the code version that started
it, one upgraded, each saying which version ran each step (CAIRN_CODE_VERSION)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import cairn

pinned = cairn.workflow("pin_fleet", versions="pin")
upgraded = cairn.workflow("pin_fleet_upgraded")


@pinned.step()
def ask(ctx: cairn.Context) -> cairn.StepResult:
    return cairn.StepResult.wait("go", cursor="work")


@pinned.step()
def work(ctx: cairn.Context) -> cairn.StepResult:
    # input "marker": the step's first visit writes it (the test kills its worker then)
    # and lingers; the visit after the crash finds it and goes on at once.
    marker = ctx.input.get("marker")
    if marker and not Path(marker).exists():
        Path(marker).write_text(os.environ.get("CAIRN_CODE_VERSION", ""))
        time.sleep(60)
    return cairn.StepResult(cursor="done", state={"by": os.environ.get("CAIRN_CODE_VERSION")})


@upgraded.step()
def only(ctx: cairn.Context) -> cairn.StepResult:
    return cairn.StepResult(cursor="done", state={"by": os.environ.get("CAIRN_CODE_VERSION")})
