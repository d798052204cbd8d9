"""Pauses (`cairn chaos --pauses N`): at seeded random moments, SIGSTOP a pool child that
holds a run's lease or, now and then, a whole worker (parent and pool), for longer than the
lease TTL, then SIGCONT it. Meanwhile the lease lapses and another worker takes the run
over; the process that wakes is a zombie, in the middle of whatever it was doing (a model
call, a mail send, a LangGraph put, a commit, the events after one), and everything it
writes from then on must be refused. The verdict is the same as under kills.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cairn.testing import fleet
from cairn.testing.chaos.kills import holders, where

if TYPE_CHECKING:
    from cairn.store import CheckpointStore, Leases

# After the last pause ends, the runs are not judged before this many seconds: time for
# the zombie to wake and try its writes (each refused within milliseconds).
SETTLE = 1.0


class Pauser:
    """The schedule of pauses, from the seed: `planned` pauses one at a time, about one
    in three of a whole worker, each ttl*1.5 plus up to one more ttl long, 0.5-2 s apart.
    The pause log is `pauses` (each with its pid, runs, start and end wall-clock times)."""

    def __init__(self, seed: int, planned: int, ttl: float, say: Callable[[str], None]) -> None:
        # Its own stream of draws (not the kills'): adding pauses leaves the kills' schedule.
        self._rng = random.Random(f"{seed}-pauses")
        self._planned, self._ttl, self._say = planned, ttl, say
        wholes = max(1, planned // 3) if planned >= 2 else 0
        self._whole = set(self._rng.sample(range(planned), wholes))
        self._next = time.monotonic() + self._rng.uniform(0.5, 2.0)
        self._until = 0.0  # when the pause in effect ends
        self._paused: tuple[dict[str, Any], Callable[[int], None]] | None = None
        self._settled = 0.0  # when the last pause's zombie has had time to act
        self.pauses: list[dict[str, Any]] = []

    def tick(self, store: CheckpointStore, leases: Leases, procs: list[fleet.Proc]) -> None:
        """End the pause in effect if it is over; else start one if one is due."""
        now = time.monotonic()
        if self._paused is not None:
            if now >= self._until:
                self.resume()
                self._next = time.monotonic() + self._rng.uniform(0.5, 2.0)
            return
        if len(self.pauses) >= self._planned or now < self._next:
            return
        self._pause(store, leases, procs, len(self.pauses) in self._whole)

    def idle(self) -> bool:
        """No process is paused, and the last one woke long enough ago."""
        return self._paused is None and time.monotonic() >= self._settled

    def resume(self) -> None:
        """SIGCONT the paused process (or worker), if any."""
        if self._paused is None:
            return
        record, send = self._paused
        self._paused = None
        send(signal.SIGCONT)
        record["resumed"] = time.time()
        self._settled = time.monotonic() + SETTLE

    def settle(self) -> None:
        """Resume what is paused and wait until its zombie has had time to act."""
        self.resume()
        time.sleep(max(0.0, self._settled - time.monotonic()))

    def _pause(
        self, store: CheckpointStore, leases: Leases, procs: list[fleet.Proc], whole: bool
    ) -> None:
        held, owners = holders(store, leases, procs, parents=True)
        busy = sorted(pid for pid in held if pid in owners)
        if not busy:
            return
        pid = self._rng.choice(busy)
        seconds = round(self._ttl * 1.5 + self._rng.uniform(0.0, self._ttl), 3)
        proc = owners[pid]
        whole = whole or pid == proc.pid  # a threads worker's runs are its own process's
        if whole:
            runs = [r for p in (proc.pid, *proc.children()) for r in held.get(p, [])]
            send: Callable[[int], None] = proc.signal_all
        else:
            runs = held[pid]
            send = _to(pid)
        send(signal.SIGSTOP)
        record = {
            "kind": "whole_worker" if whole else "pool_child",
            "worker": proc.name,
            "pid": proc.pid if whole else pid,
            "ts": time.time(),
            "seconds": seconds,
            "run_id": runs[0].run_id if runs else None,
            "runs": [r.run_id for r in runs],
            "cursor": ",".join(where(r) for r in runs),
        }
        self.pauses.append(record)
        self._paused, self._until = (record, send), time.monotonic() + seconds
        what = f"whole worker {proc.name}" if whole else f"pool process {pid} of {proc.name}"
        self._say(f"[yellow]SIGSTOP[/] {what} ({len(runs)} runs) for {seconds:g}s")


def _to(pid: int) -> Callable[[int], None]:
    def send(sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # killed meanwhile (by a kill from outside, say)
            pass

    return send


def taken_over(pauses: list[dict[str, Any]], rows: list[dict[str, Any]]) -> int:
    """How many (pause, run) had the run claimed by another owner while its holder was
    stopped (a checkpoint_history row of a newer epoch between the pause and its end):
    zombies that woke after their run had moved on."""
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_run[row["run_id"]].append(row)
    n = 0
    for pause in pauses:
        end = pause.get("resumed", float("inf"))
        for run_id in pause["runs"]:
            history = by_run.get(run_id, [])
            epoch = max((r["epoch"] for r in history if r["at"] <= pause["ts"]), default=0)
            n += any(pause["ts"] < r["at"] <= end and r["epoch"] > epoch for r in history)
    return n
