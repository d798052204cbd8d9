"""Real `celery worker` / `celery beat` processes, started as tests/conftest.py does, and
what they cost (memory, CPU per process group) read from /proc."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.common import ROOT
from bench.internals import fleet


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


# -- what processes cost, from /proc (Linux; no psutil) -------------------------------------
TICK = os.sysconf("SC_CLK_TCK")


def tree(pids: list[int]) -> Iterator[int]:
    """These processes and all their live descendants."""
    seen: set[int] = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        yield pid
        todo += [int(c) for c in children]


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:  # exited since
        return ""


def rss_mb(pids: list[int]) -> float:
    """Resident memory of these processes and their descendants, in MB (shared pages
    counted in each process: a prefork fleet's sum overstates what it uses)."""
    kb = 0
    for pid in tree(pids):
        for line in _read(f"/proc/{pid}/status").splitlines():
            if line.startswith("VmRSS:"):
                kb += int(line.split()[1])
    return kb / 1024


def pss_mb(pids: list[int]) -> float:
    """Proportional memory (shared pages split between their users) of these processes
    and their descendants, in MB: what the fleet costs the machine."""
    kb = 0
    for pid in tree(pids):
        for line in _read(f"/proc/{pid}/smaps_rollup").splitlines():
            if line.startswith("Pss:"):
                kb += int(line.split()[1])
    return kb / 1024


def cpu_seconds(pids: list[int], descendants: bool = True) -> float:
    """User + system CPU of these processes. descendants: also of their live descendants
    and of the dead ones they reaped (cutime/cstime), so a Postgres backend that exits
    inside the window still counts; without, of these processes' own threads only."""
    ticks = 0
    for pid in tree(pids) if descendants else pids:
        stat = _read(f"/proc/{pid}/stat")
        if stat:
            f = stat.rsplit(")", 1)[1].split()
            ticks += int(f[11]) + int(f[12])  # utime, stime
            if descendants:
                ticks += int(f[13]) + int(f[14])  # cutime, cstime
    return ticks / TICK


def machine_cpu() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole machine since boot, summed over its cores."""
    f = [int(x) for x in _read("/proc/stat").split("\n", 1)[0].split()[1:]]
    idle = f[3] + f[4]  # idle, iowait
    return (sum(f[:8]) - idle) / TICK, idle / TICK


def postgres_pids(url: str) -> list[int]:
    """The postmaster of the server at url (its descendants are every backend)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    first = _read(f"{row[0]}/postmaster.pid").split("\n", 1)[0] if row else ""
    return [int(first)] if first.isdigit() else []


def redis_pids(url: str) -> list[int]:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return [int(client.info("server")["process_id"])]
    finally:
        client.close()


class CpuMeter:
    """CPU seconds each named group of processes spends over a window, beside the
    machine's idle time and what every other process spent (other benches, the kernel).

    groups: name -> (a function giving the group's root pids, with descendants or not).
    The functions are called at start and at stop, so a group may grow meanwhile.
    """

    def __init__(self, groups: dict[str, tuple[Callable[[], list[int]], bool]]) -> None:
        self.groups = groups
        self._t0 = 0.0
        self._before: dict[str, float] = {}
        self._machine: tuple[float, float] = (0.0, 0.0)

    def _now(self) -> dict[str, float]:
        return {name: cpu_seconds(pids(), desc) for name, (pids, desc) in self.groups.items()}

    def start(self) -> None:
        self._before = self._now()
        self._machine = machine_cpu()
        self._t0 = time.monotonic()

    def stop(self) -> dict[str, Any]:
        """{"wall_s", "cores", "cpu_s": {group: s}, "other_s", "idle_s"}."""
        wall = time.monotonic() - self._t0
        after = self._now()
        busy, idle = machine_cpu()
        spent = {k: max(after[k] - self._before.get(k, 0.0), 0.0) for k in after}
        return {
            "wall_s": wall,
            "cores": os.cpu_count(),
            "cpu_s": spent,
            "other_s": max(busy - self._machine[0] - sum(spent.values()), 0.0),
            "idle_s": idle - self._machine[1],
        }


def model_standin(log: Path, *args: str) -> tuple[fleet.Proc, str]:
    """The Messages-API stand-in in its own process (its CPU counted apart), and its URL."""
    import sys

    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "cairn.testing.standins", "model", "--quiet", *args]
    proc = fleet.Proc(cmd, fleet.child_env(), log, "model")
    url = fleet.wait_for(
        lambda: (
            next((ln for ln in proc.text().splitlines() if ln.startswith("http")), None)
            or (not proc.alive() and "dead")
        ),
        30,
        "the model stand-in",
    )
    if url == "dead":
        raise RuntimeError(f"model stand-in exited:\n{proc.text()[-2000:]}")
    return proc, url
