"""Durable sleep at scale: `python -m bench.sleep [--sleeping N] [--due D] [--reps R]`.

N runs sleep (waiting, their wake time days ahead) and D more are due: the time of beat's
wake pass (PgStore.wake: the D moved out of waiting and committed, what a tick costs
Postgres), of a pass with none due (every other tick), and of the reaper's `stalled` beside
them (it must not read the sleepers either), each the median of R, on a fresh database.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import psycopg

from bench.common import Databases, progress
from bench.internals import Database, PgStore, upgrade

GENERATE = (
    """
INSERT INTO runs (run_id, workflow, input, created_at)
SELECT 'sleep-' || lpad(g::text, 8, '0'), 'follow-up', '{}', now() - interval '1 hour'
  FROM generate_series(1, %(total)s) g
""",
    # The first `due` runs' time has come; the rest wake days from now, spread over a week.
    """
INSERT INTO checkpoints (run_id, seq, cursor, state, version, status, epoch, updated_at,
                         wait_until)
SELECT run_id, 1, 'check_in', '{}', 1, 'waiting', 1, now() - interval '1 hour',
       CASE WHEN g <= %(due)s THEN now() - interval '1 second'
            ELSE now() + interval '1 day' + (g * interval '6 days') / %(total)s END
  FROM runs r CROSS JOIN LATERAL (SELECT substr(r.run_id, 7)::int AS g) n
""",
)
# Puts the woken runs back to sleep, due, for the next repetition.
RESET = "UPDATE checkpoints SET status = 'waiting' WHERE run_id <= %s AND status = 'pending'"


def _median_ms(samples: list[float]) -> float:
    return round(1000 * statistics.median(samples), 2)


def sleep_bench(sleeping: int, due: int, reps: int) -> dict[str, Any]:
    """The wake pass and the reaper's look, timed among `sleeping` runs with `due` due."""
    dbs = Databases()
    url = dbs.fresh("sleep")
    out: dict[str, Any] = {"sleeping": sleeping, "due": due}
    try:
        upgrade(url)
        progress(f"sleep: generating {sleeping:,} sleeping runs + {due:,} due")
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in GENERATE:
                conn.execute(statement, {"total": sleeping + due, "due": due})
            conn.execute("VACUUM ANALYZE")
            last_due = f"sleep-{due:08d}"
            store = PgStore(Database(url, max_size=2))
            woken, idle, stalled = [], [], []
            for _ in range(reps):
                conn.execute(RESET, (last_due,))
                t0 = time.perf_counter()
                ids = store.wake()
                woken.append(time.perf_counter() - t0)
                assert len(ids) == due, (len(ids), due)
                t0 = time.perf_counter()
                assert store.wake() == []
                idle.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                store.stalled(300.0, 7.5)
                stalled.append(time.perf_counter() - t0)
            store.db.close()
        out.update(
            wake_ms=_median_ms(woken), wake_none_due_ms=_median_ms(idle),
            stalled_ms=_median_ms(stalled),
        )  # fmt: skip
    finally:
        dbs.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sleeping", type=int, default=1_000_000)
    parser.add_argument("--due", type=int, default=1_000)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    print(json.dumps(sleep_bench(args.sleeping, args.due, args.reps)))


if __name__ == "__main__":
    main()
