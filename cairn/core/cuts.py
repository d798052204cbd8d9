"""Cuts: how a steer message sent with interrupt=True reaches the calls in flight of its
run in this process. A call that may be interrupted watches its run while it runs; the
store fires the run's cuts when it hears of such a message (the memory store at once, the
Postgres store from its LISTEN thread). Plain Python, no I/O: both stores share it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


class Cut:
    """One call's watch: fired at most once; what to do then is registered by the waiter
    (set an Event, resolve an asyncio future), and runs at once if it already fired."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.fired = False
        self._then: list[Callable[[], None]] = []

    def on_fire(self, then: Callable[[], None]) -> None:
        with self._lock:
            if not self.fired:
                self._then.append(then)
                return
        then()

    def fire(self) -> None:
        with self._lock:
            if self.fired:
                return
            self.fired, then, self._then = True, self._then, []
        for each in then:
            each()


class Cuts:
    """The calls in flight that may be interrupted, by run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, set[Cut]] = {}

    @contextlib.contextmanager
    def watch(self, run_id: str) -> Iterator[Cut]:
        cut = Cut()
        with self._lock:
            self._runs.setdefault(run_id, set()).add(cut)
        try:
            yield cut
        finally:
            with self._lock:
                left = self._runs.get(run_id)
                if left is not None:
                    left.discard(cut)
                    if not left:
                        del self._runs[run_id]

    def fire(self, run_id: str) -> None:
        with self._lock:
            cuts = list(self._runs.get(run_id, ()))
        for cut in cuts:
            cut.fire()
