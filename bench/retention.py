"""Retention's cost, a month dropped whole against rows deleted: `python -m bench.retention`.

`runs` finished runs past the horizon, each with `steps` history rows and `calls` journal
rows, swept as the beat sweeps them (PgStore.sweep, 1,000 runs a transaction) twice, on
two fresh databases alike but for the runs' month: created this month (their history and
journal deleted row by row, as every sweep did before migration 0018), and created three
months back (the runs' own rows deleted, their month's partitions then dropped whole).
Reported: seconds, WAL bytes and Postgres CPU (/proc) of each sweep, per history row, and
the VACUUM of the two tables after it (what autovacuum would do next).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import Databases, Wal, progress
from bench.internals import Database, PgStore, upgrade
from bench.procs import CpuMeter, postgres_pids

GENERATE = """
WITH r AS (
    INSERT INTO runs (run_id, workflow, input, created_at)
    SELECT 'run-' || i, 'bench', '{}', now() - make_interval(months => %(months)s)
      FROM generate_series(1, %(runs)s) i
    RETURNING run_id, created_at
), c AS (
    INSERT INTO checkpoints (run_id, seq, cursor, state, version, status, updated_at,
                             created_at)
    SELECT run_id, %(steps)s, 'done', '{"n": 1}', 1, 'done', now() - interval '2 days',
           created_at
      FROM r
), h AS (
    INSERT INTO step_history (run_id, seq, cursor, visit, outcome, started_at, worker, epoch,
                              next_cursor, state, run_created)
    SELECT run_id, k - 1, 'step' || k, 0, 'saved', now(), 'bench:1:0', 1, 'step' || (k + 1),
           '{"n": 1}', created_at
      FROM r, generate_series(1, %(steps)s) k
)
INSERT INTO journal (run_id, cursor, visit, pos, name, seq, epoch, result, run_created)
SELECT run_id, 'step1', 0, k, 'tool', 0, 1, '{"ok": true}', created_at
  FROM r, generate_series(0, %(calls)s - 1) k
"""


def sweep_once(dbs: Databases, runs: int, steps: int, calls: int, months: int) -> dict[str, Any]:
    url = dbs.fresh("retention")
    upgrade(url)
    wal = Wal(url)
    db = Database(url, max_size=1)
    try:
        with wal.conn.transaction():
            wal.conn.execute("SELECT cairn_partitions(now() - interval '4 months', 3)")
            wal.conn.execute(
                GENERATE, {"runs": runs, "steps": steps, "calls": calls, "months": months}
            )
        wal.conn.execute("VACUUM ANALYZE")
        wal.conn.execute("CHECKPOINT")  # full-page images count against the sweep alike
        pg = postgres_pids(url)
        meter = CpuMeter({"postgres": (lambda: pg, True)})
        meter.start()
        lsn = wal.lsn()
        t0 = time.perf_counter()
        swept = PgStore(db).sweep(86400, batch=1000)
        seconds = time.perf_counter() - t0
        wal_bytes = wal.diff(lsn, wal.lsn())
        cpu = meter.stop()["cpu_s"]["postgres"]
        left = wal.conn.execute("SELECT count(*) FROM step_history").fetchone()
        assert swept == runs and left is not None and left[0] == 0, (swept, left)
        # What autovacuum does next to the rows deleted (a dropped month left none).
        lsn = wal.lsn()
        t0 = time.perf_counter()
        wal.conn.execute("VACUUM step_history, journal")
        vacuum = time.perf_counter() - t0
        return {
            "seconds": seconds,
            "wal_bytes": wal_bytes,
            "cpu_s": cpu,
            "vacuum_s": vacuum,
            "vacuum_wal": wal.diff(lsn, wal.lsn()),
        }
    finally:
        db.close()
        wal.close()
        dbs.drop(url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.retention", description=__doc__)
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=10, help="history rows a run")
    parser.add_argument("--calls", type=int, default=10, help="journal rows a run")
    args = parser.parse_args(argv)
    dbs = Databases()
    rows = args.runs * args.steps
    try:
        for label, months in (("rows deleted (this month)", 0), ("month dropped", 3)):
            progress(f"retention: {args.runs} runs, {rows} history rows, {label}")
            r = sweep_once(dbs, args.runs, args.steps, args.calls, months)
            print(
                f"{label:28} {r['seconds']:7.2f} s  {r['wal_bytes'] / 2**20:8.1f} MB WAL"
                f"  {r['cpu_s']:6.2f} s PG CPU  {1e6 * r['seconds'] / rows:6.2f} µs"
                f" and {r['wal_bytes'] / rows:6.0f} B WAL a history row; then VACUUM"
                f" of the two tables {r['vacuum_s']:.2f} s, {r['vacuum_wal'] / 2**20:.1f} MB WAL"
            )
    finally:
        dbs.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
