"""Fleet of waiting runs, as LLM agents are: `python -m bench --only waiting`, or
`python -m bench.waiting` with its own sizes.

N runs of S steps each; every step makes one model call that the local Messages-API
stand-in (its own process) answers after `wait` seconds. W workers drive them with the
threads pool (many runs per process) and, beside it, with prefork at the largest
concurrency this machine holds. Each row: runs/s, steps/s, each step's overhead beyond the
model's wait (p50/p95, from the step history), peak worker memory, peak Postgres
connections, and the CPU each process group spent per step (where the cores went).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from bench.common import ROOT, Databases, bench_redis, median, pct, progress
from bench.internals import admin, fleet, upgrade
from bench.procs import (
    CpuMeter,
    model_standin,
    postgres_pids,
    pss_mb,
    redis_pids,
    rss_mb,
)
from cairn import Client, Settings

if TYPE_CHECKING:
    from bench.sections import Sizes

LOGS = ROOT / ".cairn" / "bench-waiting"
# "Close to S × wait plus overhead": the target this section checks is at most 1.5 × the
# time one run spends waiting on the model (15 s for 10 steps of 1 s).
BOUND = 1.5
# What one prefork process costs, to size prefork to the machine: the estimate
# (a worker process with the SDK loaded); half the free memory is left to everything else.
PREFORK_PROCESS_MB = 100
# The process groups a deployment runs (the stand-in is the remote API, the driver the users).
SERVICES = ("workers", "postgres", "redis")
# Connections kept free for the bench itself, its sampler and anything else on the server.
SPARE_CONNECTIONS = 10
# A prefork process's pool opens a second connection within a step (seen: 110 processes
# ran a 200-connection server out).
CONNECTIONS_PER_PROCESS = 2


def _connections(base: str, db: str) -> int:
    with psycopg.connect(base, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (db,)
        ).fetchone()
    return int(row[0]) if row else 0


def largest_prefork(base: str, workers: int, runs: int) -> tuple[int, str]:
    """Prefork processes per worker: as many as Postgres connections and memory allow
    (each process is one run at a time and holds one connection), and no more than the
    runs need. Returns (processes, why)."""
    with psycopg.connect(base, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('max_connections')::int, "
            "current_setting('superuser_reserved_connections')::int, "
            "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
        ).fetchone()
    assert row is not None
    max_conns, reserved, used = (int(v) for v in row)
    free_conns = max_conns - reserved - used - SPARE_CONNECTIONS
    avail_mb = next(
        int(line.split()[1]) // 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemAvailable:")
    )
    by_conns = free_conns // CONNECTIONS_PER_PROCESS
    by_mem = avail_mb // 2 // PREFORK_PROCESS_MB
    n = max(1, min(by_conns, by_mem, runs) // workers)
    why = (
        f"{workers} × {n}, one run per process: Postgres has {free_conns} connections to spare "
        f"(max_connections {max_conns}, {used} in use, {SPARE_CONNECTIONS} kept), enough for "
        f"{by_conns} processes at {CONNECTIONS_PER_PROCESS} each; half of {avail_mb:,} MB free "
        f"holds {by_mem} at ~{PREFORK_PROCESS_MB} MB"
    )
    return n, why


def _finish(client: Client, total: int, timeout: float) -> tuple[int, int]:
    """(done, failed) once `total` runs have ended, or at the timeout."""
    deadline = time.monotonic() + timeout
    done = failed = 0
    while time.monotonic() < deadline:
        counts = client.counts()
        done, failed = counts.get("done", 0), counts.get("failed", 0)
        if done + failed >= total:
            break
        time.sleep(0.1)
    return done, failed


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
    """One fleet: `workers` workers of `pool` × `concurrency` drive `runs` runs."""
    db_url = dbs.fresh(f"waiting_{pool}")
    upgrade(db_url)
    redis_url = bench_redis()
    admin.RedisDatabase(redis_url).flush()
    model, model_url = model_standin(LOGS / "model.log", "--delay-ms", str(int(wait * 1000)))
    env = fleet.child_env(
        CAIRN_DATABASE_URL=db_url,
        CAIRN_REDIS_URL=redis_url,
        ANTHROPIC_BASE_URL=model_url,
        CAIRN_WORKFLOWS="bench.flows",
        CAIRN_DATABASE_POOL_SIZE=str(pool_size),
        PYTHONPATH=str(ROOT),
    )
    LOGS.mkdir(parents=True, exist_ok=True)
    procs: list[fleet.Proc] = []
    peak = {"rss": 0.0, "pss": 0.0, "conns": 0}
    sampling = threading.Event()

    def sample() -> None:
        name = db_url.rsplit("/", 1)[1]
        while not sampling.wait(0.5):
            roots = [p.pid for p in procs]
            peak["rss"] = max(peak["rss"], rss_mb(roots))
            peak["pss"] = max(peak["pss"], pss_mb(roots))
            try:
                peak["conns"] = max(peak["conns"], _connections(dbs.base, name))
            except psycopg.OperationalError as exc:  # e.g. no connection left for us
                progress(f"waiting {pool}: connections not sampled: {exc}")

    pg, rd = postgres_pids(dbs.base), redis_pids(redis_url)
    meter = CpuMeter(
        {
            "workers": (lambda: [p.pid for p in procs], True),
            "model stand-in": (lambda: [model.pid], True),
            "postgres": (lambda: pg, True),
            "redis": (lambda: rd, False),
            "bench driver": (lambda: [os.getpid()], False),
        }
    )
    sampler = threading.Thread(target=sample, daemon=True)
    beat: fleet.Proc | None = None
    settings = Settings.from_env().with_options(database_url=db_url, redis_url=redis_url)
    try:
        progress(f"waiting {pool}: starting {workers} workers × {concurrency}")
        for i in range(workers):
            (LOGS / f"{pool}-{i}.log").unlink(missing_ok=True)  # "ready." must be this run's
            procs.append(
                fleet.spawn_worker(
                    env, LOGS / f"{pool}-{i}.log", f"wait{i}", concurrency, pool=pool
                )
            )
        for p in procs:
            fleet.wait_ready(p, 300)
        # As deployed: beat's reaper sends a run whose worker lost it (its lease expired)
        # again; the row counts such runs.
        (LOGS / f"{pool}-beat.log").unlink(missing_ok=True)
        beat = fleet.start_beat(env, LOGS / f"{pool}-beat.log", LOGS / f"{pool}-beat-schedule")
        sampler.start()
        with Client(settings=settings) as client:
            # Every process's first run opens its connections and model client: a
            # one-step run per prefork process, and a few per threads process, first.
            warm = workers * (concurrency if pool == "prefork" else 2)
            progress(f"waiting {pool}: warming up with {warm} one-step runs")
            for i in range(warm):
                client.enqueue("bench_waiting", {"steps": 1}, run_id=f"warm{i:05d}")
            _finish(client, warm, 120)
            progress(f"waiting {pool}: {runs} runs of {steps} model calls of {wait:g} s")
            meter.start()
            started = time.monotonic()
            for i in range(runs):
                client.enqueue("bench_waiting", {"steps": steps}, run_id=f"w{i:05d}")
            enqueued = time.monotonic() - started
            # Generous: a machine shared with other work can take several times the ideal.
            limit = max(300.0, 10 * math.ceil(runs / (workers * concurrency)) * steps * wait)
            done, failed = _finish(client, warm + runs, limit)
            done -= warm
            took = time.monotonic() - started
            cpu = meter.stop()
        with psycopg.connect(db_url) as conn:
            overhead = [
                float(r[0])
                for r in conn.execute(
                    "SELECT extract(epoch FROM ended_at - started_at) - %s "
                    "FROM step_history WHERE outcome = 'saved' AND run_id NOT LIKE 'warm%%'",
                    (wait,),
                )
            ]
            # How long after the first run's first step the last run's first step began:
            # near 0 when every run progresses at once, about the whole bench when queued.
            row = conn.execute(
                "SELECT extract(epoch FROM max(first) - min(first)) FROM "
                "(SELECT min(started_at) AS first FROM step_history "
                "WHERE run_id NOT LIKE 'warm%' GROUP BY run_id) f"
            ).fetchone()
            spread = float(row[0]) if row and row[0] is not None else None
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE resumes > 0), count(*) FILTER (WHERE epoch > 1) "
                "FROM checkpoints WHERE run_id NOT LIKE 'warm%'"
            ).fetchone()
            resumed, reclaimed = (int(v) for v in row) if row else (0, 0)
    finally:
        sampling.set()
        for p in procs:
            p.kill()
        if beat is not None:
            beat.kill()
        model.kill()
        dbs.drop(db_url)
    n = max(len(overhead), 1)
    # What the deployment itself spends per step (the stand-in plays the remote API and
    # the driver plays the users): the cores this fleet needs to finish within the bound.
    own = sum(cpu["cpu_s"][g] for g in SERVICES) / n
    return {
        "pool": pool,
        "workers": workers,
        "concurrency": concurrency,
        "runs": runs,
        "steps_per_run": steps,
        "wait_s": wait,
        "done": done,
        "failed": failed,
        # runs a worker lost mid-way (lease not renewed in time) and another took over
        "resumed_runs": resumed,
        "reclaimed_runs": reclaimed,
        "seconds": took,
        "bound_s": BOUND * steps * wait,
        "enqueue_seconds": enqueued,
        "runs_per_s": done / took,
        "steps_per_s": len(overhead) / took,
        "overhead_p50_ms": 1000 * median(overhead) if overhead else None,
        "overhead_p95_ms": 1000 * pct(overhead, 95) if overhead else None,
        "first_step_spread_s": spread,
        "peak_rss_mb": peak["rss"],
        "peak_pss_mb": peak["pss"],
        "peak_pg_connections": peak["conns"],
        "cpu": cpu,
        "service_cpu_ms_per_step": 1000 * own,
        "cores_for_bound": own * runs * steps / (BOUND * steps * wait),
        "cpu_ms_per_step": {k: 1000 * v / n for k, v in cpu["cpu_s"].items()}
        | {"other processes": 1000 * cpu["other_s"] / n, "idle": 1000 * cpu["idle_s"] / n},
    }


def section(dbs: Databases, redis_url: str, sz: Sizes, prefork_too: bool = True) -> dict[str, Any]:
    """`python -m bench --only waiting`: the threads fleet, then prefork beside it."""
    del redis_url  # one() flushes and uses the bench's Redis database itself
    common = (sz.waiting_runs, sz.waiting_steps, sz.waiting_wait, sz.waiting_workers)
    rows = [one("threads", sz.waiting_threads, *common, sz.waiting_pool_size, dbs)]
    if not prefork_too:
        return {"rows": rows, "bound_factor": BOUND}
    prefork, why = sz.waiting_prefork, "set by the caller"
    if not prefork:
        prefork, why = largest_prefork(dbs.base, sz.waiting_workers, sz.waiting_runs)
    progress(f"waiting prefork: {why}")
    rows.append({**one("prefork", prefork, *common, sz.waiting_pool_size, dbs), "why": why})
    return {"rows": rows, "bound_factor": BOUND}


def main(argv: list[str] | None = None) -> int:
    from bench import report
    from bench.sections import Sizes

    parser = argparse.ArgumentParser(prog="python -m bench.waiting", description=__doc__)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--wait", type=float, default=1.0, help="the model's seconds per call")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=500, help="threads per worker")
    parser.add_argument("--pool-size", type=int, default=10, help="Postgres connections/worker")
    parser.add_argument(
        "--prefork",
        type=int,
        default=0,
        help="processes per worker (0: the most that fit; -1: no prefork row)",
    )
    args = parser.parse_args(argv)
    sz = dataclasses.replace(
        Sizes(),
        waiting_runs=args.runs,
        waiting_steps=args.steps,
        waiting_wait=args.wait,
        waiting_workers=args.workers,
        waiting_threads=args.concurrency,
        waiting_pool_size=args.pool_size,
        waiting_prefork=max(args.prefork, 0),
    )
    dbs = Databases()
    try:
        results = {"waiting": section(dbs, bench_redis(), sz, prefork_too=args.prefork >= 0)}
    finally:
        dbs.close()
    results["targets"] = report.targets(results)
    report.render(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
