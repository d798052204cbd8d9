"""A rolling deploy under chaos (`cairn chaos WORKFLOW --deploy NEW_MODULE`): the workers
start on the old code (version OLD_VERSION) and, once some runs ended, are swapped one at
a time for workers that import NEW_MODULE alone (version NEW_VERSION), while the kills go
on; then which versions started and finished the runs, and what the deploy stopped.

Each swap stops an old worker with SIGTERM (it hands its runs back at the next step
boundary) or SIGKILL (seeded, one in two), then starts a new one, until no old worker is
alive or starting (chaos's replacement for one it killed whole, begun before the deploy,
is old code too). The last swap is
always a SIGKILL of an old worker caught holding a run mid-step with a call journaled
(or, after BUSY_WAIT, whatever it holds): that run can only go on on the new code, which
replays the old code's journal. A run the new code cannot
go on with must stop `incompatible` with its reason; any other end but done fails the
verdict, as a run still active at the deadline does.
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cairn.core.status import RunStatus
from cairn.store import admin
from cairn.testing.chaos.kills import holders

if TYPE_CHECKING:
    from cairn.store import CheckpointStore, Leases
    from cairn.testing.chaos.rig import Crew

OLD_VERSION, NEW_VERSION = "v1", "v2"
SIGTERM_WAIT = 30.0  # seconds a SIGTERMed worker has to hand its runs back, then SIGKILL
BUSY_WAIT = 15.0  # seconds the last swap waits for its old worker to be caught mid-step

# The runs inside a step that journaled a call in it (the journal of the visit begun at
# the checkpoint's seq).
MID_STEP_SQL = """
SELECT DISTINCT j.run_id FROM journal j JOIN checkpoints c ON c.run_id = j.run_id AND c.seq = j.seq
 WHERE j.run_id = ANY(%s)
"""

# Per run: the version of its first claim, and the version of the step that ended it
# (the last step_history row: a saved `done`, or the stop).
VERSIONS_SQL = """
SELECT c.run_id, c.started_version,
       (SELECT h.code_version FROM step_history h WHERE h.run_id = c.run_id
         ORDER BY h.seq DESC, h.ended_at DESC LIMIT 1) AS ended_version
  FROM checkpoints c
"""


class Deployer:
    """The rolling deploy, in a thread of its own: begin() once, then done() says whether
    every old worker was swapped; `swaps` is its log."""

    def __init__(
        self,
        seed: int,
        crew: Crew,
        new_env: dict[str, str],
        busy: Callable[[], dict[int, list[str]]],
        db_url: str,
        say: Callable[[str], None],
    ) -> None:
        self._rng = random.Random(f"{seed}-deploy")
        self._crew, self._new_env, self._busy, self._say = crew, new_env, busy, say
        self._db_url = db_url
        self._thread: threading.Thread | None = None
        self.began_at: float | None = None
        self.first_up = threading.Event()  # a new-code worker is up
        self.swaps: list[dict[str, Any]] = []

    def begin(self) -> None:
        """Swap to the new code from now on: replacements of workers killed whole too."""
        if self._thread is not None:
            return
        self.began_at = time.time()
        self._crew.switch(self._new_env)
        self._say(f"[bold]deploy[/]: swapping the workers to {NEW_VERSION}")
        self._thread = threading.Thread(target=self._roll, daemon=True)
        self._thread.start()

    def started(self) -> bool:
        return self._thread is not None

    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def join(self, timeout: float = 120.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _roll(self) -> None:
        try:
            self._swap_each()
        except Exception as exc:  # noqa: BLE001 (the verdict says so; the runs go on)
            self._crew.warnings.append(f"the deploy stopped part way: {exc}")
        finally:
            self.first_up.set()  # the held runs go out whatever happened

    def _swap_each(self) -> None:
        """Until no old worker is alive or starting (a replacement for one chaos killed
        whole, begun before the switch, is old code too): swap the first one."""
        while True:
            old, starting = self._crew.others(NEW_VERSION)
            if not old:
                if not starting:
                    return
                time.sleep(0.1)
                continue
            self._swap(old[0], last=len(old) == 1 and not starting)

    def _swap(self, proc: Any, *, last: bool) -> None:
        """Stop one old worker, start a new one in its place."""
        how = "SIGKILL" if last or self._rng.random() < 0.5 else "SIGTERM"
        if how == "SIGKILL" and last:  # caught mid-step: the new code must replay its calls
            end = time.monotonic() + BUSY_WAIT
            while time.monotonic() < end and proc.alive() and not self._mid_step(proc):
                time.sleep(0.1)
        swap: dict[str, Any] = {"worker": proc.name, "how": how, "ts": time.time()}
        if not proc.alive():  # chaos killed it whole meanwhile: its replacement is new code
            swap["how"] = "gone"
        elif how == "SIGTERM":
            swap["held"] = len(self._held_by(proc))
            swap["seconds_to_exit"] = self._terminate(proc)
        else:
            swap["held"] = len(self._held_by(proc))
            swap["mid_step"] = len(self._mid_step(proc))
            proc.kill()
        self._say(f"[bold]deploy[/]: {swap['how']} {proc.name} ({swap.get('held', 0)} runs)")
        if swap["how"] != "gone":
            swap["new_worker"] = self._crew.replace()
        self.first_up.set()
        self.swaps.append(swap)

    def _held_by(self, proc: Any) -> list[str]:
        """The runs whose lease the worker (its parent or a pool child) holds."""
        held = self._busy()
        return [r for pid in (proc.pid, *proc.children()) for r in held.get(pid, [])]

    def _mid_step(self, proc: Any) -> list[str]:
        """The worker's runs inside a step that journaled a call."""
        held = self._held_by(proc)
        if not held:
            return []
        return [r["run_id"] for r in admin.execute(self._db_url, MID_STEP_SQL, (held,))]

    def _terminate(self, proc: Any) -> float:
        """SIGTERM the worker (its parent: Celery's warm shutdown) and wait for it to go;
        SIGKILL it after SIGTERM_WAIT. The seconds it took."""
        began = time.monotonic()
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return 0.0
        end = began + SIGTERM_WAIT
        while proc.alive() and time.monotonic() < end:
            time.sleep(0.05)
        if proc.alive():
            proc.kill()
        return round(time.monotonic() - began, 2)


def busy_pids(store: CheckpointStore, leases: Leases, procs: list[Any]) -> dict[int, list[str]]:
    """The runs each pid holds the lease of, now."""
    held, _ = holders(store, leases, procs)
    return {pid: [r.run_id for r in runs] for pid, runs in held.items()}


def read_versions(url: str) -> list[dict[str, Any]]:
    """Per run: started_version and the version of its last step_history row."""
    return admin.execute(url, VERSIONS_SQL)


def verdict(
    final: list[dict[str, Any]], versions: list[dict[str, Any]], swaps: list[dict[str, Any]]
) -> tuple[dict[str, Any], list[str]]:
    """The report's deploy section and its problems: a run stopped `incompatible` with no
    reason, a deploy that swapped no worker, or no run that the new code ended. (Runs
    lost, failed, or with an effect twice are the report's own problems.)"""
    problems: list[str] = []
    incompatible = [r for r in final if r["status"] == RunStatus.INCOMPATIBLE]
    silent = [r["run_id"] for r in incompatible if not (r.get("error") or "").strip()]
    if silent:
        problems.append(
            f"{len(silent)} run(s) stopped incompatible with no reason (e.g. {silent[0]})"
        )
    if not any(s["how"] != "gone" for s in swaps):
        problems.append("the deploy swapped no worker")
    status = {r["run_id"]: r["status"] for r in final}
    started = Counter(v["started_version"] or "none" for v in versions)
    ended = Counter(
        v["ended_version"] or "none" for v in versions if status.get(v["run_id"]) == RunStatus.DONE
    )
    crossed = sum(
        1
        for v in versions
        if status.get(v["run_id"]) == RunStatus.DONE
        and v["started_version"] == OLD_VERSION
        and v["ended_version"] == NEW_VERSION
    )
    if swaps and not ended.get(NEW_VERSION):
        problems.append(f"no run was finished by the new code ({NEW_VERSION})")
    reasons = Counter(reason_of(r.get("error") or "") for r in incompatible)
    section = {
        "old_version": OLD_VERSION,
        "new_version": NEW_VERSION,
        "swaps": swaps,
        "started": dict(sorted(started.items())),
        "finished": dict(sorted(ended.items())),
        "crossed": crossed,  # started on the old code, finished on the new
        "incompatible": len(incompatible),
        "incompatible_reasons": dict(reasons.most_common()),
        "incompatible_runs": [
            {"run_id": r["run_id"], "cursor": r["cursor"], "error": r.get("error")}
            for r in incompatible[:5]
        ],
    }
    return section, problems


def reason_of(error: str) -> str:
    """An incompatible stop's reason with its run's particulars left out, to count alike
    stops together: "call 0 is 'stamp' ... recorded 'model'", "no step 'x'", ..."""
    text = (
        error.split(": ", 1)[1] if error.startswith(("step ", "run ")) and ": " in error else error
    )
    return re.split(r"; a step must|\. Declare", text)[0].strip()[:160] or "(no reason)"
