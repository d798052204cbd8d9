"""The reaper: send runs again whose worker was lost, and runs whose message was lost.

Without it a run on a worker lost whole waits for the broker's visibility timeout and
kombu's restore sweep: an hour by default. A class over the store, the leases and two
broker callables, so its rules are tested without Celery (tests/unit/test_reaper.py);
beat runs `Reaper.reap` on a thread of its own (cairn.workers.control), so no pass waits
for a pool process nor keeps one from a run.

Invariants (each a reason a run is or is not sent):
1. Listed, then no lease: its worker died, or a worker took the run, ran it and let go of
   it meanwhile. The second look (`unchanged`: same epoch, same updated_at) tells them
   apart; only a run still as listed is sent.
2. A run sent and not yet taken waits (keys.sent, which the next lease acquire deletes):
   no other message goes while it is out, for a first window (a lease TTL, or
   CAIRN_LOST_AFTER), then twice the last wait each time, up to CAIRN_PENDING_AFTER. A
   backlog of resumes longer than the window is not sent again each window.
3. A run never taken waits while the broker holds a message for it: it is sent again only
   when more runs wait for their first delivery than the broker holds run messages (a
   backlog after an outage holds one each, however old: none is sent), the oldest of them
   first. The broker's count is read before and after the runs are counted and the larger
   kept, so a run taken meanwhile is never counted as lost by mistake.
4. A delivery that took a run over a lease TTL ago, has no live lease and never let go
   of it (keys.DELIVERIES) lost its worker, whatever the run's status: a run that is done
   in Postgres but whose worker died before telling its stream is sent again too (its
   delivery then finds it stopped and tells the stream). A run another worker took and
   let go of meanwhile is sent once more at worst, which its lease makes harmless.
5. Bounded: every listing is a page of `batch` runs (a keyset walk on an index, or a
   count), each page's leases and marks are one Redis round trip (offer.lua), and a pass
   stops walking at its deadline; the next pass goes on where it stopped.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cairn.core import logs
from cairn.core.status import RunStatus

if TYPE_CHECKING:
    from cairn.core.settings import Settings
    from cairn.store.contract import CheckpointStore, LeaseManager

logger = logging.getLogger(__name__)

BATCH = 500  # runs a page: one query, one Redis round trip, 4-8 ms (bench/backlog.py)


@dataclasses.dataclass(kw_only=True)
class Reaper:
    """One pass finds the runs to send again and sends them through `send`.

    in_flight(taken_within) counts the run messages the broker holds (those a worker took
    over taken_within seconds ago and never claimed do not count: that worker died).
    budget: seconds a pass may walk (default: CAIRN_REAPER_INTERVAL); the walk's place
    is kept between passes of one Reaper.
    """

    store: CheckpointStore
    leases: LeaseManager
    settings: Settings
    in_flight: Callable[[float], int]
    send: Callable[[str], None]
    batch: int = BATCH
    budget: float | None = None
    clock: Callable[[], float] = time.monotonic
    # Where the walks go on: the last run id of the runs a worker took, and how far into
    # the deliveries never let go of.
    _after: str = dataclasses.field(default="", init=False)
    _deliveries: int = dataclasses.field(default=0, init=False)
    stats: dict[str, float] = dataclasses.field(default_factory=dict, init=False)

    def reap(self) -> int:
        """One pass; returns how many runs were sent again."""
        started = self.clock()
        deadline = started + (self.budget or self.settings.reaper_interval)
        self.stats = {"batches": 0, "listed": 0, "sent": 0}
        sent = self._lost_deliveries(deadline) + self._lost_messages(deadline)
        while True:  # the runs a worker took, a page at a time
            rows, after = self.store.stalled(
                self.settings.lease_ttl / 2, after=self._after, limit=self.batch
            )
            self.stats["batches"] += 1
            sent += self._offer([r["run_id"] for r in rows], {r["run_id"]: r for r in rows})
            self._after = after or ""
            if after is None or self.clock() >= deadline:
                break
        # Each pass folds the status deltas written since the last, so counting runs
        # sums a few hundred rows, never the whole history.
        self.store.fold_counts()
        self.stats["seconds"] = self.clock() - started
        logger.debug(
            "reaper pass: %d sent, %d listed in %d batches, %.3fs",
            sent,
            self.stats["listed"],
            self.stats["batches"],
            self.stats["seconds"],
            extra=logs.run(
                None,
                "reap_pass",
                sent=sent,
                listed=self.stats["listed"],
                batches=self.stats["batches"],
                seconds=self.stats["seconds"],
            ),
        )
        return sent

    def _offer(self, run_ids: list[str], listed: dict[str, dict[str, Any]], most: int = 0) -> int:
        """Send the runs among run_ids whose lease is gone and no message is out for
        (invariant 2), those listed from Postgres only if still as listed (invariant 1);
        at most `most` (0: all)."""
        if not run_ids:
            return 0
        s = self.settings
        self.stats["listed"] += len(run_ids)
        cap = max(s.pending_after, s.resend_window)
        offered = self.leases.offer(run_ids, s.resend_window, cap, most)
        still = self.store.unchanged([listed[r] for r in offered if r in listed])
        sent = [r for r in offered if r in still or r not in listed]
        self.leases.unmark([r for r in offered if r not in sent])
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
        self.stats["sent"] += len(sent)
        return len(sent)

    def _lost_deliveries(self, deadline: float) -> int:
        """Deliveries that never let go of their run (invariant 4), whatever its status:
        a run done in Postgres whose worker died before its last events is among them.
        Walked a page at a time from the oldest; most are runs still under way (their
        lease lives), so the walk goes on from where the last pass stopped."""
        sent = 0
        while True:
            page = self.leases.lost_deliveries(
                self.settings.lease_ttl, limit=self.batch, start=self._deliveries
            )
            self.stats["batches"] += 1
            sent += self._offer(page, {})
            # The runs sent stay listed until a worker takes them: the walk steps past.
            self._deliveries += len(page)
            if len(page) < self.batch:
                self._deliveries = 0
                return sent
            if self.clock() >= deadline:
                return sent

    def _lost_messages(self, deadline: float) -> int:
        """Runs never taken beyond the messages the broker holds: the oldest without a
        message out lost theirs (invariant 3). One count, then pages from the oldest
        until that many are sent (a page at most) or the pass's time is up."""
        s, store = self.settings, self.store
        # Every pending run (never taken or not) from the folded counts, a few rows: a
        # broker that holds as many run messages lost none, and the count is not needed.
        pending = int(store.counts().get(RunStatus.PENDING, {}).get("n", 0))
        if not pending:
            return 0
        # More runs waiting for a message than messages the broker holds: the oldest of
        # them lost theirs. The broker is read before and after the runs are counted, the
        # larger count kept: a run taken, claimed and acked meanwhile is counted once and
        # listed never, and a message on its way from the queue to a worker's unacked set
        # is counted on one of the two reads. A worker alive claims what it took at once;
        # one that took a message over a lease TTL (and CAIRN_LOST_AFTER) ago and never
        # claimed its run died whole. The runs sent again stay the oldest never taken,
        # their messages now counted: the pages step past them (their marks) to the next.
        taken_within = max(s.lost_after, s.lease_ttl)
        before = self.in_flight(taken_within)
        if pending <= before:
            return 0
        waiting = store.unclaimed_count(s.lost_after, upto=before + self.batch + 1)
        held = max(before, self.in_flight(taken_within))
        lost = min(waiting - held, self.batch)
        sent, after = 0, None
        while sent < lost:
            rows = store.unclaimed(s.lost_after, limit=self.batch, after=after)
            self.stats["batches"] += 1
            sent += self._offer(
                [r["run_id"] for r in rows], {r["run_id"]: r for r in rows}, most=lost - sent
            )
            if len(rows) < self.batch or self.clock() >= deadline:
                break
            after = (rows[-1]["created_at"], rows[-1]["run_id"])
        return sent
