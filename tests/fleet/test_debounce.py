"""Debounced enqueues on real processes: two enqueuing processes race on the same keys, beat
is SIGKILLed before the runs come due and a wake pass is SIGKILLed between its commit and
its sends; each key still gets exactly one run, started once, with the latest input (the
reaper sends what the killed pass committed, the next beat's pass the rest)."""

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
from tests.helpers.wakes import beat_wakes, spawn_waker

KEYS = [f"conv-{k}" for k in range(10)]
ROUNDS = 6
QUIET = 4.0  # seconds: above any gap between two enqueues of a key, even on a loaded machine

# An enqueuer: waits for `go`, then enqueues every key ROUNDS times, and writes the run id
# each enqueue of a key returned.
ENQUEUER = """
import json, os, sys, time
from cairn.client.client import Client

name, go, out, keys, rounds, quiet = sys.argv[1:7]
keys, got = json.loads(keys), {}
with Client() as client:
    client.get("warm-up")  # the pool open before the race
    open(out + ".ready", "w").close()
    while not os.path.exists(go):
        time.sleep(0.001)
    for i in range(int(rounds)):
        for key in keys:
            run_id = client.enqueue("echo", {"from": name, "i": i}, debounce_key=key,
                                    debounce=float(quiet), max_wait=120.0)
            got.setdefault(key, []).append(run_id)
with open(out, "w") as f:
    json.dump(got, f)
"""


def _spawn(script: str, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as f:  # the child keeps its copy
        return subprocess.Popen(
            [sys.executable, "-c", script, *args],
            env={**env, "PYTHONPATH": str(ROOT)},
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def test_two_enqueuers_racing_with_beat_and_a_wake_pass_killed_start_one_run_per_key(
    client: Client, worker_env: dict[str, str], sql, tmp_path: Path
) -> None:
    env = {
        **worker_env,
        "CAIRN_LOG_FORMAT": "json",
        "CAIRN_LOST_AFTER": "3",  # the reaper's backstop for the killed pass's runs
    }
    worker = fleet.spawn_worker(env, tmp_path / "w.log", "w", 2)
    beat = fleet.start_beat(env, tmp_path / "beat.log", tmp_path / "beat-schedule")
    go, keys = tmp_path / "go", json.dumps(KEYS)
    outs = [tmp_path / f"enqueued-{n}.json" for n in "ab"]
    enqueuers = [
        _spawn(
            ENQUEUER,
            [n, str(go), str(o), keys, str(ROUNDS), str(QUIET)],
            env,
            tmp_path / f"{n}.log",
        )
        for n, o in zip("ab", outs, strict=True)
    ]
    waker: subprocess.Popen[bytes] | None = None
    procs = [worker, beat]
    try:
        fleet.wait_ready(worker)
        wait_for(lambda: "beat ticking" in beat.text(), 60, "beat to tick")
        for out in outs:  # both enqueuers' clients open: the race starts at once
            wait_for(lambda o=out: Path(f"{o}.ready").exists(), 60, "an enqueuer to be ready")
        go.touch()
        for n, proc in zip("ab", enqueuers, strict=True):
            assert proc.wait(60) == 0, (tmp_path / f"{n}.log").read_text()
        # The latest enqueue of each key, after both racers: the input its run starts with.
        last = {
            key: client.enqueue("echo", {"final": key}, debounce_key=key, debounce=QUIET)
            for key in KEYS
        }
        beat.kill()  # no pass from beat now: the runs come due with it dead
        waker, killed_out = spawn_waker(env, tmp_path, "committed", batch=4)
        wait_for(lambda: waker.poll() is not None, 60, "the wake pass to be killed")
        assert waker.returncode == -signal.SIGKILL, (tmp_path / "waker-committed.log").read_text()
        beat = fleet.start_beat(env, tmp_path / "beat2.log", tmp_path / "beat2-schedule")
        procs.append(beat)
        wait_for(
            lambda: all(client.get(r).status == RunStatus.DONE for r in last.values()),  # type: ignore[union-attr]
            90,
            "every key's run to start and finish",
        )
        time.sleep(1.0)  # a second start, if there were one, would show by now
        beats_log = "".join(p.text() for p in procs if p is not worker)  # beat's wake passes
    finally:
        for proc in procs:
            proc.kill()
        for p in [*enqueuers, *([waker] if waker else [])]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    # Every enqueue of a key, from either process, returned the one run of that key.
    for out in outs:
        for key, ids in json.loads(out.read_text()).items():
            assert set(ids) == {last[key]}, key
    runs = client.list(limit=500, workflow="echo")
    assert sorted(r.run_id for r in runs) == sorted(last.values())  # one run per key
    for key, run_id in last.items():
        run = client.get(run_id)
        assert run is not None and run.state == {"input": {"final": key}}
    started = sql("SELECT run_id, count(*) FROM step_history WHERE cursor = 'said' GROUP BY 1")
    assert sorted(started) == sorted((r, 1) for r in last.values())  # each started once
    # Woken once each: the killed pass's batch (sent by the reaper), beat's passes the rest.
    killed = json.loads(killed_out.read_text())
    assert killed
    woken = Counter(killed + beat_wakes(beats_log))
    assert woken == Counter(last.values()), {r: n for r, n in woken.items() if n != 1}
