"""Durable sleep at scale: `python -m bench --only sleep`, or alone `python -m bench.sleep
[--sleeping N] [--due D] [--reps R]`.

N runs sleep (waiting, their wake time days ahead) and D more are due: the time of beat's
wake pass (PgStore.wake: the D moved out of waiting and committed, what a tick costs
Postgres), of a pass with none due (every other tick), and of the reaper's `stalled` beside
them (it must not read the sleepers either), each the median of R, on a fresh database;
then whether the status counts still equal a GROUP BY (the pass counts its own moves).
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


# beat's pass at 1,000,000 sleeping runs with 1,000 due: a tick's cost to Postgres
TARGET_MS = 20.0
COUNTED = "SELECT status, count(*) FROM checkpoints GROUP BY status"


def sleep_bench(sleeping: int, due: int, reps: int, dbs: Databases | None = None) -> dict[str, Any]:
    """The wake pass and the reaper's look, timed among `sleeping` runs with `due` due."""
    mine = dbs is None
    dbs = dbs or Databases()
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
                store.stalled(7.5)  # the walk's first page
                stalled.append(time.perf_counter() - t0)
            counts = {s: int(r["n"]) for s, r in store.counts().items()}
            out["counts_exact"] = counts == dict(conn.execute(COUNTED).fetchall())
            store.db.close()
        out.update(
            wake_ms=_median_ms(woken), wake_none_due_ms=_median_ms(idle),
            stalled_ms=_median_ms(stalled), reps=reps,
        )  # fmt: skip
    finally:
        if mine:
            dbs.close()
        else:
            dbs.drop(url)
    return out


def section(dbs: Databases, redis_url: str, sz: Any) -> dict[str, Any]:
    """`python -m bench --only sleep`."""
    del redis_url  # Postgres only
    return sleep_bench(sz.sleep_sleeping, sz.sleep_due, sz.sleep_reps, dbs)


def targets(results: dict[str, Any], add: Any) -> None:
    sec = results.get("sleep")
    if not isinstance(sec, dict) or "wake_ms" not in sec:
        return
    add(
        f"beat's wake pass ≤ {TARGET_MS:g} ms with {sec['due']:,} due among "
        f"{sec['sleeping']:,} sleeping (median)",
        sec["wake_ms"] <= TARGET_MS and sec["counts_exact"],
        f"{sec['wake_ms']:.1f} ms; none due {sec['wake_none_due_ms']:.2f} ms; the reaper's "
        f"stalled {sec['stalled_ms']:.2f} ms; counts exact: {sec['counts_exact']}",
    )


def render(results: dict[str, Any], c: Any) -> None:
    from rich.table import Table

    sec = results.get("sleep")
    if not isinstance(sec, dict) or "wake_ms" not in sec:
        return
    t = Table(
        title=f"16. Durable sleep: {sec['sleeping']:,} sleeping runs, {sec['due']:,} due; "
        f"median of {sec['reps']} passes"
    )
    for col in ("what", "ms"):
        t.add_column(col, justify="left" if col == "what" else "right")
    t.add_row(f"wake pass, {sec['due']:,} due", f"{sec['wake_ms']:.2f}")
    t.add_row("wake pass, none due", f"{sec['wake_none_due_ms']:.2f}")
    t.add_row("the reaper's stalled", f"{sec['stalled_ms']:.2f}")
    c.print(t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sleeping", type=int, default=1_000_000)
    parser.add_argument("--due", type=int, default=1_000)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    print(json.dumps(sleep_bench(args.sleeping, args.due, args.reps)))


if __name__ == "__main__":
    main()
