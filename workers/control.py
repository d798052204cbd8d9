"""The control plane: beat runs the reaper, the wake pass, the schedules' firer and the
retention sweep itself, each on a thread of its own.

They were Celery tasks that beat sent to the control queue, which the workers served
before any run. A pass then needed a free pool process: with every process on a long
run the reaper waited for one to end (a take-over after a partition waited 12.8 s), and
passes slower than their interval queued up ticks that, served first, kept the runs
from being taken (issue 51: 30,000 stale runs, none done in minutes). On beat's own
threads no pass waits for a pool process or takes one from a run, no tick queues up (a
pass that overruns its interval delays its own next pass only), and a slow sweep never
holds up the reaper. Beat is one process already (the dispatcher's too), so each pass
runs once at a time, as the beat schedule made it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from cairn.core import logs
from cairn.core.errors import CairnError

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Periodic:
    """work() every `every` seconds (from one pass's start to the next's), on its thread."""

    name: str
    every: float
    work: Callable[[], object]

    def serve(self, stop: threading.Event) -> None:
        """Run a pass, then wait out the rest of the interval, until stop is set. A pass
        that fails is logged; the next one tries again (every pass is idempotent)."""
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.work()
            except CairnError as exc:  # Postgres or Redis away: said once a pass, briefly
                logger.warning(
                    "%s: pass failed (%s); the next in %gs",
                    self.name,
                    exc,
                    self.every,
                    extra=logs.run(None, "control_failed", control=self.name),
                )
            except Exception:
                logger.exception(
                    "%s: pass failed; the next in %gs",
                    self.name,
                    self.every,
                    extra=logs.run(None, "control_failed", control=self.name),
                )
            spent = time.monotonic() - started
            logger.debug(
                "control: %s pass in %.3fs",
                self.name,
                spent,
                extra=logs.run(None, "control_pass", control=self.name, seconds=spent),
            )
            stop.wait(max(self.every - spent, 0.0))


def start(passes: list[Periodic]) -> threading.Event:
    """Each pass on a daemon thread of its own (they die with beat); set the event
    returned to stop them."""
    stop = threading.Event()
    for p in passes:
        threading.Thread(target=p.serve, args=(stop,), name=f"cairn-{p.name}", daemon=True).start()
    return stop
