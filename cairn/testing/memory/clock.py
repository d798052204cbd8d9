"""The clock the in-memory twins read: time.time, or a ManualClock a test moves."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]


class ManualClock:
    """A clock a test moves by hand: pass it to MemoryStore and MemoryLeases, then
    `advance(seconds)` to let a wait time out, a retry fall due or a lease expire.
    Starts at the real time, so timestamps a step takes itself (time.time()) agree."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
