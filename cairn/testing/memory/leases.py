"""MemoryLeases and the MemoryLease it hands out: the Redis leases (store/lua/*.lua) in
dicts, on a clock a test can move."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from cairn.core.errors import LeaseLost
from cairn.store.keys import EPOCH_TTL
from cairn.store.lease import LeaseToken
from cairn.testing.memory.clock import Clock


class MemoryLease:
    """A lease MemoryLeases handed out; its TTL runs on the leases' clock.

    On a clock a test moves (a ManualClock), start_heartbeat does nothing: a lease expires
    only when a test moves the clock past the TTL without a renewal, which is how a test
    plays a process paused (SIGSTOP) while it held the run. ensure() then behaves as
    Lease.ensure: a renewal younger than half the TTL is trusted, an older one is checked.
    On the real clock (time.time, a LocalWorker's default) a thread renews it every third
    of its TTL, as a worker's heartbeat does: a step longer than the TTL (a model call, the
    first import of a provider's SDK on a busy machine) keeps its run.
    """

    def __init__(self, leases: MemoryLeases, run_id: str, token: LeaseToken, ttl: float) -> None:
        self._leases, self.run_id, self.token, self.ttl = leases, run_id, token, ttl
        self.epoch = token.epoch
        self._renewed_at = leases._clock()
        self._lost: str | None = None
        self._beat: threading.Event | None = None  # set: the heartbeat thread stops

    def start_heartbeat(self) -> MemoryLease:
        """On the real clock, a thread renewing it until it is released or lost; none on
        a clock a test moves (it stands still unless moved)."""
        if self._leases._clock is time.time and self._beat is None:
            self._beat = threading.Event()
            threading.Thread(
                target=self._renewing, args=(self._beat,), name="cairn-memory-lease", daemon=True
            ).start()
        return self

    def _renewing(self, stop: threading.Event) -> None:
        while not stop.wait(self.ttl / 3):
            try:
                self.renew()
            except LeaseLost:
                return

    def renew(self) -> None:
        """Extend it now; raise LeaseLost if another owner holds it or it expired."""
        if self._lost:
            raise LeaseLost(self.run_id, self._lost)
        started = self._leases._clock()
        held = self._leases._renew(self.run_id, self.token, self.ttl)
        if held is not True:
            self._lost = f"now held by {held or 'nobody (expired)'}"
            raise LeaseLost(self.run_id, self._lost)
        self._renewed_at = started

    def ensure(self, fresh: bool = False) -> None:
        """Raise LeaseLost unless this worker provably still holds it (fresh: ask the
        leases whatever the last renewal's age)."""
        if self._lost:
            raise LeaseLost(self.run_id, self._lost)
        if self._leases._clock() - self._renewed_at < self.ttl / 2 and not fresh:
            return
        self.renew()

    def release(self, ended: bool = False) -> None:
        """Let go of the run, only if still ours (ended: its epoch counter goes too)."""
        if self._beat is not None:
            self._beat.set()
        self._leases._release(self.run_id, self.token, ended)


class MemoryLeases:
    """LeaseManager in dicts under one lock, as store/lua/*.lua do it in Redis: an epoch
    counter per run that grows above a floor, leases and `sent` marks that expire on
    `clock` (seconds; a ManualClock lets a test move it)."""

    def __init__(self, clock: Clock = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # run_id: (value, expires at): the keys cairn:lease, cairn:epoch and cairn:sent
        self._leases: dict[str, tuple[LeaseToken, float]] = {}
        self._epochs: dict[str, tuple[int, float]] = {}
        self._sent: dict[str, tuple[bool, float]] = {}
        self._deliveries: dict[str, float] = {}  # keys.DELIVERIES: run -> when taken

    def acquire(
        self, run_id: str, ttl: float, floor: int = 0, owner: LeaseToken | None = None
    ) -> MemoryLease | None:
        """The run's lease with an epoch above floor, or None while another owner holds
        it (acquire.lua)."""
        owner = owner or LeaseToken.mine()
        with self._lock:
            now = self._clock()
            if _live(self._leases, run_id, now) is not None:
                return None
            counter = _live(self._epochs, run_id, now) or 0
            epoch = max(counter + 1, floor + 1)
            self._epochs[run_id] = (epoch, now + EPOCH_TTL)
            token = dataclasses.replace(owner, epoch=epoch)
            self._leases[run_id] = (token, now + ttl)
            self._sent.pop(run_id, None)
            self._deliveries[run_id] = now
        return MemoryLease(self, run_id, token, ttl)

    def holder(self, run_id: str) -> LeaseToken | None:
        """Who holds the run's lease."""
        with self._lock:
            held: LeaseToken | None = _live(self._leases, run_id, self._clock())
            return held

    def break_dead(self, run_id: str, token: LeaseToken) -> bool:
        """Delete a lease whose owner is known dead, only if it is still token."""
        return self._release(run_id, token, ended=False, listed=True)

    def lost_deliveries(self, older_than: float, limit: int = 10_000) -> list[str]:
        """Runs a delivery took over older_than seconds ago and never let go of."""
        with self._lock:
            before = self._clock() - older_than
            found = sorted((t, r) for r, t in self._deliveries.items() if t <= before)
        return [r for _, r in found[:limit]]

    def unheld(self, run_ids: list[str]) -> list[str]:
        """The run ids whose lease is gone."""
        with self._lock:
            now = self._clock()
            return [r for r in run_ids if _live(self._leases, r, now) is None]

    def mark_sent(self, run_id: str, window: float) -> bool:
        """False while an earlier message for the run is out and untaken (SET NX PX)."""
        with self._lock:
            now = self._clock()
            if _live(self._sent, run_id, now) is not None:
                return False
            self._sent[run_id] = (True, now + window)
            return True

    def _renew(self, run_id: str, token: LeaseToken, ttl: float) -> LeaseToken | bool | None:
        """renew.lua: True if extended, else who holds it now (None: nobody)."""
        with self._lock:
            now = self._clock()
            held: LeaseToken | None = _live(self._leases, run_id, now)
            if held is not None and str(held) == str(token):
                self._leases[run_id] = (held, now + ttl)
                return True
            return held

    def _release(self, run_id: str, token: LeaseToken, ended: bool, listed: bool = False) -> bool:
        """release.lua: compare and delete, never a successor's lease; the delivery leaves
        keys.DELIVERIES (listed: it stays, a dead owner's broken lease)."""
        with self._lock:
            held = _live(self._leases, run_id, self._clock())
            if held is None or str(held) != str(token):
                return False
            del self._leases[run_id]
            if not listed:
                self._deliveries.pop(run_id, None)
            if ended:
                self._epochs.pop(run_id, None)
            return True


def _live(table: dict[str, tuple[Any, float]], key: str, now: float) -> Any:
    """The key's value unless it expired (then it is gone, as in Redis)."""
    entry = table.get(key)
    if entry is None:
        return None
    if entry[1] <= now:
        del table[key]
        return None
    return entry[0]
