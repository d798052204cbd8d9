"""The faults a program mixes in, on the fleet's real processes and stand-ins. Those that
must wait for their moment (a run's next model request, a run being held, another
process taking a paused one's run over) wait in a thread of their own while the program
goes on; join() waits for them all and SIGCONTs whatever is still stopped.

A pause ends once the run was claimed above the paused process's lease epoch (a
checkpoint_history row of a newer epoch: taken over), or after MAX_PAUSE seconds: the
process then wakes as a zombie, and whatever it sends from then on is judged.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cairn.testing.mix.standins import Trap

if TYPE_CHECKING:
    from cairn.testing.mix.rig import MixFleet

MAX_PAUSE = 20.0  # seconds a paused process waits for its run to be taken over
HOLD_WAIT = 8.0  # seconds a kill or pause waits for its run to be held


class Faults:
    """The faults of one execution: `landed` records each one that happened."""

    def __init__(self, fleet: MixFleet, say: Callable[[str], None]) -> None:
        from cairn.store import Leases

        self.fleet, self._say = fleet, say
        self._leases = Leases.from_url(fleet.options.redis_url)
        self._threads: list[threading.Thread] = []
        self._stopped: set[int] = set()
        self._lock = threading.Lock()
        self.landed: list[dict[str, Any]] = []

    # -- the model stand-in ----------------------------------------------------------------
    def model_429_pause(self, run_id: str) -> None:
        """The run's next model request gets a 429 (retry-after 1 s); its sender is
        stopped inside that back-off until its run is taken over."""

        def stop_sender(request: dict[str, Any]) -> None:
            pid, epoch = request.get("pid"), request.get("epoch")
            if pid is None or epoch is None or not self._pool_child(pid):
                return
            self._background(lambda: self._pause(pid, run_id, epoch, "in a 429's back-off"))

        assert self.fleet.model is not None
        self.fleet.model.trap(Trap(run=run_id, status=429, retry_after=1.0, then=stop_sender))

    def model_fail(self, status: int, n: int) -> None:
        assert self.fleet.model is not None
        self.fleet.model.trap(Trap(run=None, status=status, retry_after=0.2, left=n))
        self._landed("model_fail", status=status, n=n)

    def model_slow(self, ms: int) -> None:
        assert self.fleet.model is not None
        self.fleet.model.control(delay_ms=ms)
        self._landed("model_slow", ms=ms)

    # -- processes ---------------------------------------------------------------------------
    def kill_at(self, run_id: str, point: str) -> None:
        self.fleet.arm(run_id, point)
        self._landed("kill_at", run=run_id, point=point)

    def kill_holder(self, run_id: str, whole: bool) -> None:
        def kill() -> None:
            held = self._held(run_id)
            if held is None:
                return
            pid, _ = held
            worker = self._worker_of(pid)
            if worker is None:
                return
            if whole:
                worker.kill()
                self._landed("kill_worker", run=run_id, worker=worker.name)
                assert self.fleet.crew is not None
                self.fleet.crew.replace()
            else:
                _signal(pid, signal.SIGKILL)
                self._landed("kill_child", run=run_id, pid=pid)

        self._background(kill)

    def pause_holder(self, run_id: str) -> None:
        def pause() -> None:
            held = self._held(run_id)
            if held is not None and self._pool_child(held[0]):
                self._pause(held[0], run_id, held[1], "holding its run")

        self._background(pause)

    def restart(self, what: str) -> None:
        self.fleet.restart(what)
        self._landed("restart", what=what)

    # -- the end -------------------------------------------------------------------------------
    def join(self, timeout: float = MAX_PAUSE + HOLD_WAIT + 5) -> None:
        """Wait for the faults in flight; SIGCONT any process still stopped."""
        end = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))
        with self._lock:
            for pid in self._stopped:
                _signal(pid, signal.SIGCONT)
            self._stopped.clear()
        self._threads.clear()

    def reset(self) -> None:
        """Leave the fleet as a program found it: no trap, no delay, nothing armed."""
        self.join()
        assert self.fleet.model is not None
        self.fleet.model.clear_traps()
        self.fleet.model.control(delay_ms=5)
        self.fleet.disarm()
        assert self.fleet.crew is not None
        self.fleet.crew.revive()  # a worker killed whole and not replaced
        self._leases.client.close()

    # -- helpers ---------------------------------------------------------------------------------
    def _background(self, fn: Callable[[], None]) -> None:
        t = threading.Thread(target=fn, daemon=True, name="mix-fault")
        self._threads.append(t)
        t.start()

    def _landed(self, kind: str, **what: Any) -> None:
        with self._lock:
            self.landed.append({"kind": kind, "at": time.time(), **what})

    def _held(self, run_id: str) -> tuple[int, int] | None:
        """(pid, epoch) of the process holding the run's lease, once one does."""
        end = time.monotonic() + HOLD_WAIT
        while time.monotonic() < end:
            token = self._leases.holder(run_id)
            if token is not None and self._worker_of(token.pid) is not None:
                return token.pid, token.epoch
            time.sleep(0.05)
        return None

    def _worker_of(self, pid: int) -> Any:
        """The crew's worker whose pool child pid is (None: not one of ours)."""
        return next((w for w in self.fleet.worker_procs() if pid in w.children()), None)

    def _pool_child(self, pid: int) -> bool:
        return self._worker_of(pid) is not None

    def _pause(self, pid: int, run_id: str, epoch: int, where: str) -> None:
        """SIGSTOP pid until run_id is claimed above epoch (MAX_PAUSE at most), SIGCONT."""
        time.sleep(0.05)  # into the wait the answer began
        with self._lock:
            self._stopped.add(pid)
        _signal(pid, signal.SIGSTOP)
        started = time.time()
        taken = False
        end = time.monotonic() + MAX_PAUSE
        while time.monotonic() < end:
            if self._claimed_above(run_id, epoch):
                taken = True
                break
            time.sleep(0.2)
        time.sleep(0.2)  # the new owner a moment ahead: its request first
        with self._lock:
            self._stopped.discard(pid)
        _signal(pid, signal.SIGCONT)
        self._landed(
            "pause", run=run_id, pid=pid, epoch=epoch, where=where, taken_over=taken,
            seconds=round(time.time() - started, 2),
        )  # fmt: skip

    def _claimed_above(self, run_id: str, epoch: int) -> bool:
        from cairn.store.admin import execute

        rows = execute(
            self.fleet.db_url,
            "SELECT max(epoch) AS epoch FROM checkpoint_history WHERE run_id = %s",
            (run_id,),
        )
        return bool(rows and rows[0]["epoch"] is not None and rows[0]["epoch"] > epoch)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
