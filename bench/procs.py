"""Real `celery worker` / `celery beat` processes, started as tests/conftest.py does."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from bench.common import ROOT
from cairn.testing import fleet


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


class Fleet:
    """Workers and beat for one bench phase; logs in a temp dir; stop() kills them all."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.dir = Path(tempfile.mkdtemp(prefix="cairn-bench-"))
        self.procs: list[fleet.Proc] = []
        self._n = 0

    def worker(self, concurrency: int = 1, wait: bool = True) -> fleet.Proc:
        name = f"bw{self._n}"
        self._n += 1
        p = fleet.spawn_worker(self.env, self.dir / f"{name}.log", name, concurrency)
        self.procs.append(p)
        if wait:
            self.wait_ready(p)
        return p

    def wait_ready(self, p: fleet.Proc, timeout: float = 90.0) -> None:
        fleet.wait_ready(p, timeout)

    def beat(self) -> fleet.Proc:
        p = fleet.start_beat(self.env, self.dir / "beat.log", self.dir / "beat-schedule")
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
        self.procs.clear()
        if not os.environ.get("CAIRN_BENCH_KEEP_LOGS"):
            shutil.rmtree(self.dir, ignore_errors=True)
