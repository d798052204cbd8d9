"""The processes a test run starts die with it, however it dies (cairn.testing.leash): a
pytest session that started a worker is SIGTERMed or SIGKILLed, and no process of the
worker's is left, its pool neither."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers.runs import wait_for
from tests.helpers.services import ROOT

# The inner session: a worker started through fleet (what the start_worker fixture
# does), its pids written down, then a wait for the signal that ends the session.
INNER = textwrap.dedent(
    """
    import json, os, time
    from pathlib import Path

    from cairn.testing import fleet

    def test_a_worker_left_running() -> None:
        here = Path(os.environ["LEASH_DIR"])
        env = json.loads((here / "env.json").read_text())
        worker = fleet.start_worker(env, here / "w.log", "orphan", 2)
        pids = [worker.pid, *worker.children()]
        (here / "pids.json").write_text(json.dumps(pids))
        time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    """pid runs (a zombie, dead but not reaped by whoever adopted it, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _in_group(pgid: int) -> list[int]:
    """The live processes of process group pgid."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_a_worker_dies_with_the_test_session_that_started_it(
    sig: signal.Signals, worker_env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "env.json").write_text(json.dumps(worker_env))
    env = {**os.environ, "LEASH_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_inner.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids_file = tmp_path / "pids.json"
    try:
        wait_for(lambda: pids_file.exists() or session.poll() is not None, 90, "the worker")
        assert pids_file.exists(), (tmp_path / "w.log").read_text()[-3000:]
        pids = json.loads(pids_file.read_text())
        assert len(pids) == 3 and all(_alive(p) for p in pids)  # the worker and its pool
        session.send_signal(sig)
        assert session.wait(30) == -sig
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (_in_group(pids[0]) or any(map(_alive, pids))):
            time.sleep(0.1)
        assert [p for p in pids if _alive(p)] == [] and _in_group(pids[0]) == []
    finally:
        session.kill()
        session.wait()
        for pid in _in_group(json.loads(pids_file.read_text())[0]) if pids_file.exists() else []:
            os.kill(pid, signal.SIGKILL)  # what this test found left, not to leak it on
