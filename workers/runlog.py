"""A run in the worker's log: a line when a delivery takes it, a line when the delivery
ends, and at DEBUG a line per step saved.

Two lines a delivery at INFO whatever the run's length: enough to follow a run from
worker to worker (run_id, workflow, cursor, seq and epoch are fields of each record,
see cairn.logs), and a long run does not drown the rest of the log.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from cairn.core import logs
from cairn.core.status import RunStatus
from cairn.workers.middleware import Chain, Middleware

if TYPE_CHECKING:
    from cairn.store import Checkpoint

logger = logging.getLogger(__name__)


class Delivery(Middleware):
    """One delivery of a run, from its claimed checkpoint cp (began: time.monotonic()
    when the delivery began). A middleware of this delivery only (`around`): the steps'
    hooks are what see the checkpoints the delivery saves, which the stop line reports."""

    def __init__(self, cp: Checkpoint, began: float) -> None:
        self.first = self.last = cp
        self.began = began
        self.steps = 0

    def around(self, chain: Chain) -> Chain:
        """chain, then this delivery's own hooks."""
        return Chain([*chain.middleware, self])

    def started(self) -> None:
        """The run is leased and claimed, and goes on from here."""
        cp = self.first
        if cp.status == RunStatus.WAITING:
            how = "wakes"
        elif cp.seq == 0 and cp.deliveries <= 1:
            how = "starts"
        else:
            how = "resumes"
        logger.info(
            "run %s (%s) %s at %s (seq %d, epoch %d)",
            cp.run_id,
            cp.workflow,
            how,
            repr(cp.cursor) if cp.cursor else "its first step",
            cp.seq,
            cp.epoch,
            extra=logs.at(cp, "started", workflow=cp.workflow, found=str(cp.status)),
        )

    def resumed(self, cp: Checkpoint) -> None:
        self.last = cp  # its resumes counted

    def after_step(
        self,
        cp: Checkpoint,
        *,
        saved: Checkpoint | None,
        exception: BaseException | None,
        seconds: float,
    ) -> None:
        if saved is None:
            return  # a failed step is logged where it fails (retry, failed)
        self.steps += 1
        self.last = saved
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "run %s step %r saved (seq %d) in %.3fs; next %r",
                cp.run_id,
                cp.cursor,
                saved.seq,
                seconds,
                saved.cursor,
                extra=logs.at(
                    cp,
                    "step",
                    workflow=cp.workflow,
                    next=saved.cursor,
                    seconds=round(seconds, 6),
                    cost_usd=saved.cost_usd - cp.cost_usd,
                ),
            )

    def stopped(self, status: RunStatus, cut: BaseException | None = None) -> None:
        """The delivery ends: the run at status (done, waiting, failed, ...; or as it was,
        if the delivery found nothing to do), or cut by an exception (retry, hand-off,
        lost lease, outage), the run going on elsewhere or later."""
        cp, seconds = self.last, time.monotonic() - self.began
        if cut is not None:
            what = f"{status}, delivery cut by {type(cut).__name__}"
        elif self.steps == 0 and status == self.first.status:
            what = f"{status}, nothing to do"
        else:
            what = str(status)
        logger.info(
            "run %s (%s) %s: %d step(s) in %.2fs, cost $%.4f, %d resume(s)",
            cp.run_id,
            cp.workflow,
            what,
            self.steps,
            seconds,
            cp.cost_usd,
            cp.resumes,
            extra=logs.at(
                cp,
                "stopped",
                workflow=cp.workflow,
                status=str(status),
                steps=self.steps,
                seconds=round(seconds, 3),
                cost_usd=cp.cost_usd,
                resumes=cp.resumes,
                cut=type(cut).__name__ if cut is not None else None,
            ),
        )
