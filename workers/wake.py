"""The wake pass: waiting runs whose time came (a sleep's end, a wait's timeout, a debounced
enqueue's quiet period) are sent, and so are the runs stopped over their tenant's budget
per day or month once a new period began (CheckpointStore.roll_budgets, the same guards).

Run in beat's process on a thread of its own (every CAIRN_SCHEDULE_TICK seconds, like
the schedules' firer: cairn.workers.control). Each due run is sent exactly once however many passes
run at once (two `cairn beat`s) and wherever one is killed, because

1. a pass moves its batch out of waiting (to pending) in one statement and commits before
   it sends anything (CheckpointStore.wake): rows another pass holds are skipped, and a
   run woken is no longer waiting, so no second pass gets it;
2. a pass killed between its commit and its sends leaves pending runs with no message;
   the reaper finds them (`stalled`, as claimed runs; a debounced run never claimed is
   counted among the runs waiting for a first delivery, one more than the broker holds
   messages for) and sends each once (its lease check and its mark of a send);
3. a pass paused (SIGSTOP) inside its transaction holds its rows' locks: the other passes
   skip them, and it sends them when it goes on, or, killed, woke none of them.

The index on the wake time (checkpoints_waiting) makes a pass cost the due runs only,
however many runs sleep.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from cairn.core import logs
from cairn.store.rows import WAKE_BATCH

if TYPE_CHECKING:
    from cairn.store.contract import Maintenance

logger = logging.getLogger(__name__)

WAKE_TASK = "cairn.wake"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Waker:
    """One pass wakes the due runs, a batch per transaction, and sends each through `send`.

    hook(point, run_ids) is called at "woken" (a batch moved, not committed) and
    "committed" (not sent yet): the crash tests' fault points.
    """

    store: Maintenance
    send: Callable[[str], None]
    batch: int = WAKE_BATCH
    hook: Callable[[str, list[str]], None] | None = None

    def wake(self) -> list[str]:
        """One pass; returns the run ids it woke (and sent)."""
        hook = self.hook
        woken: list[str] = []
        while True:
            ids = self.store.wake(
                self.batch,
                before_commit=(lambda ids: hook("woken", ids)) if hook is not None else None,
            )
            if ids and hook is not None:
                hook("committed", ids)
            for run_id in ids:
                self.send(run_id)
            woken += ids
            if len(ids) < self.batch:
                break
        # A tenant's budget in a new UTC day or month: its runs stopped over the last
        # one's limit go on, a batch per pass (the next pass takes the rest).
        for run_id in self.store.roll_budgets(self.batch):
            self.send(run_id)
            woken.append(run_id)
        if woken:
            more = f" and {len(woken) - 10} more" if len(woken) > 10 else ""
            logger.info(
                "woke %d run(s): %s%s",
                len(woken),
                ", ".join(woken[:10]),
                more,
                extra=logs.run(None, "wake", runs=woken),
            )
        return woken
