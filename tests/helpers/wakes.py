"""A wake pass in a process of its own, stopped at a fault point, and the runs beat's
wake passes woke, read from a JSON worker log (tests/fleet/test_sleep.py, test_debounce.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers.services import ROOT

# Loops until its first batch, where it stops at fault point `die`: "committed" (woken and
# committed, not sent: SIGKILL) or "woken" (moved, not committed, its rows locked:
# SIGSTOP; the test continues it). It writes the batch to `out` first, and after a SIGCONT
# sends it as a pass does and writes "sent".
WAKER = """
import json, os, signal, sys, time
from cairn.client.client import Client
from cairn.workers.wake import Waker

die, out, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])

def hook(point, ids):
    if point == die:
        with open(out, "w") as f:
            json.dump(ids, f)
        os.kill(os.getpid(), signal.SIGKILL if die == "committed" else signal.SIGSTOP)

with Client() as client:
    waker = Waker(store=client.store, send=client.send, batch=batch, hook=hook)
    until = time.monotonic() + 60
    while time.monotonic() < until:
        if waker.wake():
            break
        time.sleep(0.005)
with open(out + ".sent", "w") as f:
    f.write("sent")
"""


def spawn_waker(
    env: dict[str, str], tmp_path: Path, die: str, batch: int = 5
) -> tuple[subprocess.Popen[bytes], Path]:
    """The wake pass's process, and the file its batch is written to (log: waker-<die>.log)."""
    script = tmp_path / "waker.py"
    script.write_text(WAKER)
    out = tmp_path / f"woken-{die}.json"
    with (tmp_path / f"waker-{die}.log").open("ab") as log:  # the child keeps its copy
        proc = subprocess.Popen(
            [sys.executable, str(script), die, str(out), str(batch)],
            env={**env, "PYTHONPATH": str(ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, out


def beat_wakes(text: str) -> list[str]:
    """The runs beat's wake passes woke, from its JSON log lines."""
    woken: list[str] = []
    for line in text.splitlines():
        if line.startswith("{") and '"wake"' in line:
            entry = json.loads(line)
            woken += entry["runs"] if entry.get("action") == "wake" else []
    return woken
