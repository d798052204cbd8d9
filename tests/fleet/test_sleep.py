"""Durable sleep on real processes: 30 sleeping runs woken exactly once by two `cairn beat`s
(one SIGKILLed, one paused and continued) and two more wake passes in processes of their
own, one SIGKILLed between its commit and its sends, one paused (SIGSTOP) inside its
transaction with its batch locked and continued later."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

from cairn.client.client import Client
from cairn.core.status import RunStatus
from cairn.testing import fleet
from tests.helpers.runs import wait_for
from tests.helpers.wakes import beat_wakes, spawn_waker

RUNS = 30
NAP = 5.0


def _state(pid: int) -> str:
    """The process's state letter from /proc (T: stopped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_sleeping_runs_are_woken_once_with_two_beats_and_wake_passes_killed_and_paused(
    client: Client, worker_env: dict[str, str], sql, tmp_path: Path
) -> None:
    env = {**worker_env, "CAIRN_LOG_FORMAT": "json"}
    worker = fleet.spawn_worker(env, tmp_path / "w.log", "w", 2)
    beats = [
        fleet.start_beat(env, tmp_path / f"beat{i}.log", tmp_path / f"beat{i}-schedule")
        for i in range(2)
    ]
    killer, killed_out = spawn_waker(env, tmp_path, "committed")
    pauser, paused_out = spawn_waker(env, tmp_path, "woken")
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
    woken = Counter(killed + paused + beat_wakes("".join(b.text() for b in beats)))
    assert woken == Counter(ids), {r: n for r, n in woken.items() if n != 1}
    for run in runs.values():
        assert (
            run is not None
            and run.state is not None
            and run.state["woke_at"] - run.state["slept_at"] >= NAP
        )
    after = sql("SELECT run_id, count(*) FROM step_history WHERE cursor = 'after' GROUP BY 1")
    assert sorted(after) == sorted((r, 1) for r in ids)
