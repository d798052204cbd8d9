"""Real `celery worker` / `celery beat` processes, started as tests/conftest.py does."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT


def worker_env(db_url: str, redis_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "ANTHROPIC_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        CAIRN_DATABASE_URL=db_url,
        CAIRN_REDIS_URL=redis_url,
        CAIRN_WORKFLOWS="bench.flows",
        ANTHROPIC_BASE_URL="http://127.0.0.1:9",  # never called: the bench's steps are no-ops
    )
    env.update(extra)
    return env


class Proc:
    def __init__(self, cmd: list[str], env: dict[str, str], log: Path, name: str) -> None:
        self.log, self.name = log, name
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group (parent and pool children): a lost node."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def children(self) -> list[int]:
        try:
            raw = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in raw.split()]


class Fleet:
    """Workers and beat for one bench phase; logs in a temp dir; stop() kills them all."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.dir = Path(tempfile.mkdtemp(prefix="cairn-bench-"))
        self.procs: list[Proc] = []
        self._n = 0

    def worker(self, concurrency: int = 1, wait: bool = True) -> Proc:
        name = f"bw{self._n}"
        self._n += 1
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "workers.app",
            "worker",
            f"--concurrency={concurrency}",
            "--loglevel=INFO",
            "-n",
            f"{name}@%h",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
        ]
        p = Proc(cmd, self.env, self.dir / f"{name}.log", name)
        self.procs.append(p)
        if wait:
            self.wait_ready(p)
        return p

    def wait_ready(self, p: Proc, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "ready." in p.text():
                return
            if not p.alive():
                break
            time.sleep(0.05)
        raise RuntimeError(f"worker {p.name} did not start:\n{p.text()[-3000:]}")

    def beat(self) -> Proc:
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "workers.app",
            "beat",
            "--loglevel=INFO",
            f"--schedule={self.dir / 'beat-schedule'}",
        ]
        p = Proc(cmd, self.env, self.dir / "beat.log", "beat")
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
        self.procs.clear()
        if not os.environ.get("CAIRN_BENCH_KEEP_LOGS"):
            shutil.rmtree(self.dir, ignore_errors=True)
