"""Fault injection points for `cairn chaos`: SIGKILL this process at a step boundary.

The loop calls hit() at three boundaries of every step: "before_effect" (before the step
function runs), "after_effect" (it returned; the checkpoint is not saved yet) and
"after_save". With CAIRN_FAULTS unset, hit() is a no-op (one attribute check).
"""

from __future__ import annotations

import os
from typing import Any

BOUNDARIES = ("before_effect", "after_effect", "after_save")

_plan: Any = None if not os.environ.get("CAIRN_FAULTS") else ...


def hit(boundary: str, run_id: str, seq: int, cursor: str) -> None:
    if _plan is None:
        return
