"""`python -m bench.waiting`: a fleet of runs that wait on the model, as LLM agents do.

N runs of S steps each; every step makes one model call that the local Messages-API
stand-in answers after `--wait` seconds. W workers drive them with the threads pool (many
runs per process) and, beside it, with prefork at the largest concurrency asked for.
Reports runs/s, steps/s, each step's overhead beyond the model's wait (p50/p95, from the
step history), peak worker memory (RSS of every worker process) and peak Postgres
connections, with PASS/MISS against the targets of the fleet.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from bench.common import ROOT, Databases, bench_redis, median, pct, progress
from cairn.store import admin, upgrade
from cairn.testing import fleet
from cairn.testing.standins import ModelServer
from cairn.workers.client import Client
from cairn.workers.settings import Settings

LOGS = ROOT / ".cairn" / "bench-waiting"


def _tree(pids: list[int]) -> Iterator[int]:
    """These processes and all their live descendants (from /proc)."""
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


def _rss_mb(pids: list[int]) -> float:
    """Resident memory of these processes and their descendants, in MB."""
    kb = 0
    for pid in _tree(pids):
        for line in _read(f"/proc/{pid}/status").splitlines():
            if line.startswith("VmRSS:"):
                kb += int(line.split()[1])
    return kb / 1024


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes and their live descendants."""
    ticks = 0
    for pid in _tree(pids):
        stat = _read(f"/proc/{pid}/stat")
        if stat:
            fields = stat.rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _connections(base: str, db: str) -> int:
    with psycopg.connect(base, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (db,)
        ).fetchone()
    return int(row[0]) if row else 0


def one(
    pool: str,
    concurrency: int,
    runs: int,
    steps: int,
    wait: float,
    workers: int,
    pool_size: int,
    dbs: Databases,
) -> dict[str, Any]:
    db_url = dbs.fresh(f"waiting_{pool}")
    upgrade(db_url)
    redis_url = bench_redis()
    admin.RedisDatabase(redis_url).flush()
    model = ModelServer(delay_ms=int(wait * 1000)).start()
    env = fleet.child_env(
        CAIRN_DATABASE_URL=db_url,
        CAIRN_REDIS_URL=redis_url,
        ANTHROPIC_BASE_URL=model.url,
        CAIRN_WORKFLOWS="bench.flows",
        CAIRN_DATABASE_POOL_SIZE=str(pool_size),
        PYTHONPATH=str(ROOT),
    )
    LOGS.mkdir(parents=True, exist_ok=True)
    procs: list[fleet.Proc] = []
    peak_rss = peak_conns = 0.0
    sampling = True

    def sample() -> None:
        nonlocal peak_rss, peak_conns
        name = db_url.rsplit("/", 1)[1]
        while sampling:
            peak_rss = max(peak_rss, _rss_mb([p.pid for p in procs]))
            peak_conns = max(peak_conns, _connections(dbs.base, name))
            time.sleep(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    settings = Settings.from_env().with_options(database_url=db_url, redis_url=redis_url)
    try:
        progress(f"{pool}: starting {workers} workers x {concurrency}")
        for i in range(workers):
            procs.append(
                fleet.spawn_worker(
                    env, LOGS / f"{pool}-{i}.log", f"wait{i}", concurrency, pool=pool
                )
            )
        for p in procs:
            fleet.wait_ready(p, 120)
        sampler.start()
        cpu_before = _cpu_seconds([p.pid for p in procs])
        with Client(settings=settings) as client:
            progress(f"{pool}: enqueueing {runs} runs of {steps} model calls of {wait}s")
            started = time.monotonic()
            ids = [
                client.enqueue("bench_waiting", {"steps": steps}, run_id=f"w{i:05d}")
                for i in range(runs)
            ]
            enqueued = time.monotonic() - started
            done = 0
            while time.monotonic() - started < 60 + 3 * runs * steps * wait / workers:
                counts = client.counts()
                done = counts.get("done", 0)
                if done + counts.get("failed", 0) >= runs:
                    break
                time.sleep(0.5)
            took = time.monotonic() - started
            cpu = _cpu_seconds([p.pid for p in procs]) - cpu_before
            with psycopg.connect(db_url) as conn:
                overhead = [
                    r[0]
                    for r in conn.execute(
                        "SELECT extract(epoch FROM ended_at - started_at) - %s "
                        "FROM step_history WHERE outcome = 'saved'",
                        (wait,),
                    )
                ]
            failed = client.counts().get("failed", 0)
        del ids
    finally:
        sampling = False
        for p in procs:
            p.kill()
        model.stop()
        dbs.drop(db_url)
    return {
        "pool": pool,
        "workers": workers,
        "concurrency": concurrency,
        "runs": runs,
        "done": done,
        "failed": failed,
        "seconds": round(took, 1),
        "enqueue_seconds": round(enqueued, 1),
        "runs_per_s": round(done / took, 1),
        "steps_per_s": round(len(overhead) / took, 1),
        "overhead_p50_ms": round(1000 * median(overhead), 1) if overhead else None,
        "overhead_p95_ms": round(1000 * pct(overhead, 95), 1) if overhead else None,
        "worker_cpu_ms_per_step": round(1000 * cpu / max(len(overhead), 1), 2),
        "peak_rss_mb": round(peak_rss),
        "peak_pg_connections": int(peak_conns),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.waiting", description=__doc__)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--wait", type=float, default=1.0, help="the model's seconds per call")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=500, help="threads per worker")
    parser.add_argument("--pool-size", type=int, default=10, help="Postgres connections/worker")
    parser.add_argument("--prefork", type=int, default=8, help="prefork processes per worker")
    parser.add_argument("--prefork-runs", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    dbs = Databases()
    rows = []
    try:
        rows.append(one("threads", args.concurrency, args.runs, args.steps, args.wait,
                        args.workers, args.pool_size, dbs))  # fmt: skip
        if args.prefork:
            rows.append(one("prefork", args.prefork, args.prefork_runs, args.steps, args.wait,
                            args.workers, args.pool_size, dbs))  # fmt: skip
    finally:
        dbs.close()
    threads = rows[0]
    ideal = args.steps * args.wait
    checks = [
        ("all runs done", threads["done"] == args.runs),
        (f"total close to {ideal:.0f} s plus overhead (under {2 * ideal:.0f} s)",
         threads["seconds"] < 2 * ideal),
        ("worker memory under 2 GB", threads["peak_rss_mb"] < 2048),
        ("Postgres connections under 50", threads["peak_pg_connections"] < 50),
    ]  # fmt: skip
    if args.json:
        print(json.dumps({"rows": rows, "checks": dict(checks)}))
        return 0
    cols = ["pool", "workers", "concurrency", "runs", "done", "seconds", "runs_per_s",
            "steps_per_s", "overhead_p50_ms", "overhead_p95_ms", "worker_cpu_ms_per_step",
            "peak_rss_mb",
            "peak_pg_connections"]  # fmt: skip
    print(f"Fleet of waiting runs: {args.steps} steps, each a {args.wait:g} s model call")
    print("  " + " ".join(f"{c:>12}" for c in cols))
    for r in rows:
        print("  " + " ".join(f"{r[c]!s:>12}" for c in cols))
    for what, ok in checks:
        print(f"  {'PASS' if ok else 'MISS'}  threads: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
