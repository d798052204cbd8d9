"""The reaper: send runs again whose worker was lost, and runs whose message was lost.

Without it a run on a worker lost whole waits for the broker's visibility timeout and
kombu's restore sweep: an hour by default. A class over the store, the leases and two
broker callables, so its rules are tested without Celery (tests/unit/test_reaper.py); the
Celery app runs `Reaper.reap` on beat's schedule.

Invariants (each a reason a run is or is not sent):
1. Listed, then no lease: its worker died, or a worker took the run, ran it and let go of
   it meanwhile. The second look (`unchanged`: same epoch, same updated_at) tells them
   apart; only a run still as listed is sent.
2. One message out per run: `mark_sent` holds a run's send for a window (a lease TTL, or
   CAIRN_LOST_AFTER), so a long backlog is not sent twice and no pass storms the broker.
3. A message is lost only if more runs wait for one than the broker holds: the broker's
   count is read before and after the runs are listed and the larger kept, so a run
   taken meanwhile is never counted as lost by mistake.
4. A delivery that took a run over a lease TTL ago, has no live lease and never let go
   of it (keys.DELIVERIES) lost its worker, whatever the run's status: a run that is done
   in Postgres but whose worker died before telling its stream is sent again too (its
   delivery then finds it stopped and tells the stream). A run another worker took and
   let go of meanwhile is sent once more at worst, which its lease makes harmless.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cairn.core import logs
from cairn.core.status import RunStatus

if TYPE_CHECKING:
    from cairn.core.settings import Settings
    from cairn.store.contract import CheckpointStore, LeaseManager

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reaper:
    """One pass finds the runs to send again and sends them through `send`.

    in_flight(taken_within) counts the run messages the broker holds (those a worker took
    over taken_within seconds ago and never claimed do not count: that worker died).
    """

    store: CheckpointStore
    leases: LeaseManager
    settings: Settings
    in_flight: Callable[[float], int]
    send: Callable[[str], None]

    def reap(self) -> int:
        """One pass; returns how many runs were sent again."""
        s, store = self.settings, self.store
        listed = {r["run_id"]: r for r in store.stalled(s.pending_after, s.lease_ttl / 2)}
        # How long each message sent may wait untaken before another is sent: a run
        # never taken waited out CAIRN_PENDING_AFTER already, and waits that again.
        window = {
            run_id: s.pending_after
            if r["status"] == RunStatus.PENDING and not r["epoch"]
            else s.resend_window
            for run_id, r in listed.items()
        }
        for r in self._lost_messages():
            listed[r["run_id"]], window[r["run_id"]] = r, s.resend_window
        # Deliveries that never let go of their run (invariant 4), whatever its status:
        # a run done in Postgres whose worker died before its last events is among them.
        for run_id in self.leases.lost_deliveries(s.lease_ttl):
            window.setdefault(run_id, s.resend_window)
        unheld = self.leases.unheld(list(window))
        still = store.unchanged([listed[r] for r in unheld if r in listed])  # invariant 1
        sent = [
            r
            for r in unheld
            if (r in still or r not in listed) and self.leases.mark_sent(r, window[r])
        ]
        for run_id in sent:
            self.send(run_id)
        if sent:
            more = f" and {len(sent) - 10} more" if len(sent) > 10 else ""
            logger.warning(
                "reaper re-enqueued %d run(s): %s%s",
                len(sent),
                ", ".join(sent[:10]),
                more,
                extra=logs.run(None, "reap", runs=sent),
            )
        # Each pass folds the status deltas written since the last, so counting runs
        # sums a few hundred rows, never the whole history.
        store.fold_counts()
        return len(sent)

    def _lost_messages(self) -> list[dict[str, Any]]:
        """Unclaimed runs beyond the messages the broker holds: the oldest lost theirs."""
        s, store = self.settings, self.store
        if not store.unclaimed(s.lost_after, limit=1):
            return []
        # More runs waiting for a message than messages the broker holds: the oldest of
        # them lost theirs. A long backlog holds a message for each: no storm. The broker
        # is read before and after the runs, the larger count kept: a run taken, claimed
        # and acked meanwhile is counted once and listed never, and a message on its way
        # from the queue to a worker's unacked set is counted on one of the two reads.
        # A worker alive claims what it took at once; one that took a message over a
        # lease TTL (and CAIRN_LOST_AFTER) ago and never claimed its run died whole.
        taken_within = max(s.lost_after, s.lease_ttl)
        before = self.in_flight(taken_within)
        unclaimed = store.unclaimed(s.lost_after)
        held = max(before, self.in_flight(taken_within))
        return unclaimed[: max(len(unclaimed) - held, 0)]
