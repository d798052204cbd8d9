"""Durable sleep on real processes: 30 sleeping runs woken exactly once by two `cairn beat`s
(one SIGKILLed, one paused and continued) and two more wake passes in processes of their
own, one SIGKILLed between its commit and its sends, one paused (SIGSTOP) inside its
transaction with its batch locked and continued later."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from cairn.client.client import Client
from cairn.core.status import RunStatus
from cairn.testing import fleet
from tests.helpers.runs import wait_for
from tests.helpers.services import ROOT

RUNS = 30
NAP = 5.0

# A wake pass in its own process, looping until its first batch, where it stops at fault
# point `die`: "committed" (woken and committed, not sent: SIGKILL) or "woken" (moved,
# not committed, its rows locked: SIGSTOP; the test continues it). It writes the batch
# to `out` first, and after a SIGCONT sends it as a pass does and writes "sent".
WAKER = """
import json, os, signal, sys, time
from cairn.client.client import Client
from cairn.workers.wake import Waker

die, out = sys.argv[1], sys.argv[2]

def hook(point, ids):
    if point == die:
        with open(out, "w") as f:
            json.dump(ids, f)
        os.kill(os.getpid(), signal.SIGKILL if die == "committed" else signal.SIGSTOP)

with Client() as client:
    waker = Waker(store=client.store, send=client.send, batch=5, hook=hook)
    until = time.monotonic() + 60
    while time.monotonic() < until:
        if waker.wake():
            break
        time.sleep(0.005)
with open(out + ".sent", "w") as f:
    f.write("sent")
"""


def _waker(env: dict[str, str], tmp_path: Path, die: str) -> tuple[subprocess.Popen[bytes], Path]:
    script = tmp_path / "waker.py"
    script.write_text(WAKER)
    out = tmp_path / f"woken-{die}.json"
    with (tmp_path / f"waker-{die}.log").open("ab") as log:  # the child keeps its copy
        proc = subprocess.Popen(
            [sys.executable, str(script), die, str(out)],
            env={**env, "PYTHONPATH": str(ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, out


def _state(pid: int) -> str:
    """The process's state letter from /proc (T: stopped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _beat_wakes(text: str) -> list[str]:
    """The runs the worker's wake passes (beat's task) woke, from its JSON log lines."""
    woken: list[str] = []
    for line in text.splitlines():
        if line.startswith("{") and '"wake"' in line:
            entry = json.loads(line)
            woken += entry["runs"] if entry.get("action") == "wake" else []
    return woken


def test_sleeping_runs_are_woken_once_with_two_beats_and_wake_passes_killed_and_paused(
    client: Client, worker_env: dict[str, str], sql, tmp_path: Path
) -> None:
    env = {**worker_env, "CAIRN_LOG_FORMAT": "json"}
    worker = fleet.spawn_worker(env, tmp_path / "w.log", "w", 2)
    beats = [
        fleet.start_beat(env, tmp_path / f"beat{i}.log", tmp_path / f"beat{i}-schedule")
        for i in range(2)
    ]
    killer, killed_out = _waker(env, tmp_path, "committed")
    pauser, paused_out = _waker(env, tmp_path, "woken")
    procs = [worker, *beats]
    try:
        fleet.wait_ready(worker)
        for beat in beats:
            wait_for(lambda b=beat: "beat ticking" in b.text(), 60, "beat to tick")
        ids = [client.enqueue("sleeper", {"seconds": NAP}) for _ in range(RUNS)]
        wait_for(
            lambda: all(client.get(r).status == RunStatus.WAITING for r in ids),  # type: ignore[union-attr]
            30,
            "every run to sleep",
        )
        earliest = min(client.get(r).wakes_at for r in ids)  # type: ignore[union-attr,type-var]
        # Not one is sent before its time: no delivery, no step after the sleep.
        assert time.time() < earliest.timestamp(), "slept for less than the test's setup"
        beats[0].kill()  # one beat lost whole just before the runs are due
        # The two passes of their own take a batch each as the first runs come due.
        wait_for(lambda: killer.poll() is not None, 30, "the killed pass to die")
        assert killer.returncode == -signal.SIGKILL, (tmp_path / "waker-committed.log").read_text()
        wait_for(lambda: _state(pauser.pid) == "T", 30, "the paused pass to stop")
        beats[1].signal_all(signal.SIGSTOP)  # the other beat paused a while
        time.sleep(2.0)
        beats[1].signal_all(signal.SIGCONT)
        time.sleep(2.0)  # the beat's passes skip the paused pass's locked rows meanwhile
        os.kill(pauser.pid, signal.SIGCONT)
        assert pauser.wait(30) == 0, (tmp_path / "waker-woken.log").read_text()
        wait_for(
            lambda: all(client.get(r).status == RunStatus.DONE for r in ids),  # type: ignore[union-attr]
            60,
            "every run to wake and finish",
        )
        runs = {r: client.get(r) for r in ids}
    finally:
        for proc in procs:
            proc.kill()
        for p in (killer, pauser):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGKILL)
    assert all(run is not None for run in runs.values())
    killed, paused = json.loads(killed_out.read_text()), json.loads(paused_out.read_text())
    assert killed and paused and (tmp_path / f"{paused_out.name}.sent").exists()
    assert not (tmp_path / f"{killed_out.name}.sent").exists()
    # Exactly once: every run in one pass's batch, the killed pass's sent by the reaper.
    woken = Counter(killed + paused + _beat_wakes(worker.text()))
    assert woken == Counter(ids), {r: n for r, n in woken.items() if n != 1}
    for run in runs.values():
        assert (
            run is not None
            and run.state is not None
            and run.state["woke_at"] - run.state["slept_at"] >= NAP
        )
    after = sql("SELECT run_id, count(*) FROM step_history WHERE cursor = 'after' GROUP BY 1")
    assert sorted(after) == sorted((r, 1) for r in ids)
