"""Kills from outside the workers: at seeded random moments, SIGKILL a busy pool child
or, now and then, a whole worker (parent and pool), which is then replaced."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cairn.core.records import RunFilter
from cairn.core.status import RunStatus
from cairn.testing import fleet

if TYPE_CHECKING:
    from cairn.store import CheckpointStore, Leases, Run


def holders(
    store: CheckpointStore, leases: Leases, procs: list[fleet.Proc], *, parents: bool = False
) -> tuple[dict[int, list[Run]], dict[int, fleet.Proc]]:
    """The runs worked on by the pid that holds their lease, and the crew's worker of each
    pool child alive (with parents, of each worker's own pid too: a threads worker holds
    its runs itself). A run in its first step is still pending: it counts too."""
    running = {
        r.run_id: r
        for status in (RunStatus.RUNNING, RunStatus.PENDING)
        for r in store.list_runs(RunFilter(status=status, limit=100_000))
    }
    held: dict[int, list[Run]] = defaultdict(list)
    if not running:
        return held, {}
    for run_id, token in leases.holders(list(running)).items():
        if token is not None:
            held[token.pid].append(running[run_id])
    live = [p for p in procs if p.alive() and p.name != "beat"]
    owners = {pid: p for p in live for pid in p.children()}
    if parents:
        owners.update((p.pid, p) for p in live)
    return held, owners


def where(run: Run) -> str:
    """The step a run is at, for the report (a run in its first step has no cursor yet)."""
    return run.cursor or "its first step"


def kill_from_outside(
    store: CheckpointStore,
    leases: Leases,
    procs: list[fleet.Proc],
    whole: bool,
    rng: random.Random,
) -> dict[str, Any] | None:
    """SIGKILL a random busy pool child (or the whole worker holding it)."""
    held, owners = holders(store, leases, procs)
    busy = sorted(pid for pid in held if pid in owners)
    if not busy:
        return None
    pid = rng.choice(busy)
    now = time.time()
    if whole:
        proc = owners[pid]
        victims = [r for child in proc.children() for r in held.get(child, [])]
        proc.kill()
        return {
            "kind": "whole_worker",
            "worker": proc.name,
            "pid": proc.pid,
            "ts": now,
            "run_id": victims[0].run_id if victims else None,
            "runs": [r.run_id for r in victims],
            "cursor": ",".join(where(r) for r in victims),
        }
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    row = held[pid][0]
    return {
        "kind": "pool_child",
        "pid": pid,
        "ts": now,
        "run_id": row.run_id,
        "cursor": where(row),
        "seq": row.seq,
    }


class OutsideKiller:
    """The schedule of kills from outside, from the seed: `planned` kills, about one in
    four of a whole worker, 1-4 s apart. The kill log is `kills`."""

    def __init__(
        self,
        seed: int,
        planned: int,
        replace: Callable[[], object],
        say: Callable[[str], None],
    ) -> None:
        # The draws from rng keep their order (sample, then a uniform per gap and a choice
        # per kill): the same seed replays the same schedule.
        self._rng = random.Random(seed)
        self._planned = planned
        self._whole = (
            set(self._rng.sample(range(planned), max(1, planned // 4))) if (planned >= 2) else set()
        )
        self._replace, self._say = replace, say
        self._replacing: list[threading.Thread] = []
        self._next = time.monotonic() + self._rng.uniform(1.0, 3.0)
        self.kills: list[dict[str, Any]] = []

    def tick(self, store: CheckpointStore, leases: Leases, procs: list[fleet.Proc]) -> None:
        """Kill now if a kill is due (and there is a busy pool child to kill)."""
        if len(self.kills) >= self._planned or time.monotonic() < self._next:
            return
        # One whole worker down at a time: not while a replacement is still starting.
        as_whole = len(self.kills) in self._whole and not any(t.is_alive() for t in self._replacing)
        kill = kill_from_outside(store, leases, procs, as_whole, self._rng)
        if kill is None:
            return
        self.kills.append(kill)
        self._next = time.monotonic() + self._rng.uniform(1.0, 4.0)
        if kill["kind"] == "whole_worker":
            self._say(
                f"[red]SIGKILL[/] whole worker {kill['worker']} "
                f"({len(kill['runs'])} runs); starting a replacement"
            )
            t = threading.Thread(target=self._replace, daemon=True)
            t.start()
            self._replacing.append(t)

    def join(self) -> None:
        """Wait (90 s at most each) for the replacement workers still starting."""
        for t in self._replacing:
            t.join(timeout=90)
