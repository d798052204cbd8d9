"""A backlog after an outage drains at the fleet's normal rate: `python -m bench --only
backlog`, or alone `python -m bench.backlog [--runs N]`.

N one-step runs are enqueued while no worker runs (their messages wait in Redis), then
made stale past CAIRN_PENDING_AFTER (their rows' times set back by it, as an outage that
long leaves them), and a fleet is started: beat (the reaper, every 0.5 s) first, then 2
workers × 2 processes. The runs/s they drain at (from the first step's start to the last
save) is compared with the floor: the same N enqueued the same way and drained at once,
measured in the same run. Issue 51 saw 30,000 such runs none done in minutes: the
reaper listed every one each pass and sent each again, its ticks, served before the runs,
queued up on the workers. Duplicates: run deliveries beyond one per run, counted as the
workers begin each task (bench.flows), after the queues are empty. Then the reaper's pass
time per batch over M stalled runs (a fleet lost whole: M runs running, no lease), in
process.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import psycopg

from bench import cairn_sys, flows
from bench.common import Databases, progress
from bench.internals import Database, Leases, PgStore, Reaper, fleet
from bench.procs import Fleet, worker_env

if TYPE_CHECKING:
    from bench.sections import Sizes

RATIO = 0.8  # the stale backlog's runs/s over the fresh one's, at least (issue 51)
PENDING_AFTER = 300.0  # the product's default: the backlog is made older than this
WORKERS, CONCURRENCY = 2, 2
SENDERS = 4  # threads enqueueing


def _enqueue(url: str, redis_url: str, runs: int) -> list[str]:
    """runs one-step bench runs written (the first by create_run, the others copied from
    it in one statement) and sent, SENDERS at a time, no worker running."""
    ids = [f"{flows.BACKLOG_IDS}{i:07d}" for i in range(runs)]
    db = Database(url, max_size=1)
    try:
        PgStore(db).create_run(ids[0], flows.NOOP, {"steps": 1, "append_bytes": 0}, "tick")
    finally:
        db.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(COPY_RUNS, {"first": ids[0], "prefix": flows.BACKLOG_IDS, "runs": runs})
        conn.execute(COPY_CHECKPOINTS, {"first": ids[0], "prefix": flows.BACKLOG_IDS})

    def part(k: int) -> None:
        client = cairn_sys.Client(redis_url)
        try:
            for run_id in ids[k::SENDERS]:
                client.send_run(run_id)
        finally:
            client.close()

    with ThreadPoolExecutor(SENDERS) as pool:
        list(pool.map(part, range(SENDERS)))
    return ids


# The backlog's other runs, copies of its first as create_run wrote it (the status counts'
# triggers count them as they go in).
COPY_RUNS = """
INSERT INTO runs (run_id, workflow, input, max_cost_usd, priority, traceparent, tenant, budgets)
SELECT %(prefix)s || lpad(g::text, 7, '0'), workflow, input, max_cost_usd, priority,
       traceparent, tenant, budgets
  FROM runs, generate_series(1, %(runs)s - 1) g
 WHERE run_id = %(first)s
"""
COPY_CHECKPOINTS = """
INSERT INTO checkpoints (run_id, seq, cursor, state, version, status)
SELECT r.run_id, 0, c.cursor, c.state, c.version, 'pending'
  FROM runs r, checkpoints c
 WHERE c.run_id = %(first)s AND r.run_id LIKE %(prefix)s || '%%' AND r.run_id <> %(first)s
"""


def _queued(client: cairn_sys.Client) -> int:
    r = client.redis
    ready = sum(int(r.llen(q) or 0) for q in ("celery", "cairn.resume", "cairn.runs.high"))
    return ready + int(r.hlen("unacked") or 0)


def drain(dbs: Databases, redis_url: str, runs: int, stale: bool) -> dict[str, Any]:
    """Enqueue runs with no worker running, make them stale (or not), start beat and the
    workers, and time the drain; the deliveries beyond one per run; beat's reaper passes."""
    from bench.sections import _flush

    _flush(redis_url)
    url = dbs.fresh("backlog")
    cairn_sys.cairn_setup(url)
    client = cairn_sys.Client(redis_url)
    env = worker_env(
        url,
        redis_url,
        CAIRN_REAPER_INTERVAL="0.5",
        CAIRN_PENDING_AFTER=f"{PENDING_AFTER:g}",
        CAIRN_LOGLEVEL="INFO",
    )
    fl = Fleet(env)
    try:
        progress(f"backlog ({'stale' if stale else 'fresh'}): enqueueing {runs:,} runs, no worker")
        t0 = time.monotonic()
        ids = _enqueue(url, redis_url, runs)
        enqueue_s = time.monotonic() - t0
        if stale:
            # An outage longer than CAIRN_PENDING_AFTER (and CAIRN_LOST_AFTER): as old as
            # that, their messages still queued.
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    "UPDATE checkpoints SET updated_at = updated_at - make_interval(secs => %s),"
                    " created_at = created_at - make_interval(secs => %s)",
                    (PENDING_AFTER + 60, PENDING_AFTER + 60),
                )
        client.redis.delete(flows.BACKLOG_DELIVERIES)
        beat = fleet.start_beat(
            {**env, "CAIRN_LOGLEVEL": "DEBUG"}, fl.dir / "beat.log", fl.dir / "sched", wait=90
        )
        fl.procs.append(beat)
        for _ in range(WORKERS):
            fl.worker(CONCURRENCY, wait=False)
        for p in fl.procs[1:]:
            fl.wait_ready(p)
        progress(f"backlog ({'stale' if stale else 'fresh'}): draining")
        cairn_sys.wait_done(url, ids, max(600.0, runs / 5), every=1.0)
        # The messages beyond one per run are delivered too (a no-op each) once the runs
        # are done: wait for the queues to empty before counting deliveries.
        deadline = time.monotonic() + 120
        while _queued(client) and time.monotonic() < deadline:
            time.sleep(0.5)
        deliveries = int(client.redis.get(flows.BACKLOG_DELIVERIES) or 0)
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM max(c.updated_at) - min(h.started_at))"
                "  FROM checkpoints c JOIN step_history h USING (run_id)"
            ).fetchone()
        seconds = float(row[0]) if row and row[0] else float("nan")
        passes = _passes(beat.text())
    finally:
        fl.stop()
        client.close()
        dbs.drop(url)
    return {
        "stale": stale,
        "runs": runs,
        "enqueue_s": enqueue_s,
        "seconds": seconds,
        "runs_per_s": runs / seconds,
        "deliveries": deliveries,
        "duplicates": deliveries - runs,
        "reaper_sent": sum(p["sent"] for p in passes),
        "reaper_passes": len(passes),
        "reaper_pass_ms_max": max((p["ms"] for p in passes), default=0.0),
        "reaper_pass_ms_median": sorted(p["ms"] for p in passes)[len(passes) // 2]
        if passes
        else 0.0,
    }


PASS = re.compile(r"reaper pass: (\d+) sent, (\d+) listed in (\d+) batches, ([\d.]+)s")


def _passes(log: str) -> list[dict[str, Any]]:
    return [
        {"sent": int(m[1]), "listed": int(m[2]), "batches": int(m[3]), "ms": 1000 * float(m[4])}
        for m in PASS.finditer(log)
    ]


def reaper_pass(dbs: Databases, redis_url: str, stalled: int) -> dict[str, Any]:
    """One reaper pass over `stalled` runs left running with no lease (a fleet lost whole),
    in process, its sends counted not sent: seconds per batch; then a second pass, which
    must send none (their messages are out)."""
    from bench.sections import _flush
    from cairn import Settings

    _flush(redis_url)
    url = dbs.fresh("backlog_pass")
    cairn_sys.cairn_setup(url)
    db = Database(url)
    leases = Leases.from_url(redis_url)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO runs (run_id, workflow, input)"
                " SELECT 'lost-' || lpad(g::text, 7, '0'), %s, '{}' FROM generate_series(1, %s) g",
                (flows.NOOP, stalled),
            )
            conn.execute(
                "INSERT INTO checkpoints (run_id, seq, cursor, state, version, status, epoch,"
                " updated_at) SELECT run_id, 1, 'tick', '{}', 1, 'running', 1,"
                " now() - interval '1 minute' FROM runs"
            )
            conn.execute("VACUUM ANALYZE checkpoints")
        sent: list[str] = []
        settings = Settings(database_url=url, redis_url=redis_url, reaper_interval=3600.0)
        reaper = Reaper(
            store=PgStore(db),
            leases=leases,
            settings=settings,
            in_flight=lambda _: len(sent),
            send=sent.append,
        )
        first = reaper.reap()
        stats = dict(reaper.stats)
        second = reaper.reap()
        return {
            "stalled": stalled,
            "sent": first,
            "sent_again": second,
            "batches": stats["batches"],
            "seconds": stats["seconds"],
            "ms_per_batch": 1000 * stats["seconds"] / max(stats["batches"], 1),
            "batch": reaper.batch,
        }
    finally:
        leases.client.close()
        db.close()
        dbs.drop(url)


def measure(dbs: Databases, redis_url: str, runs: int, stalled: int) -> dict[str, Any]:
    fresh = drain(dbs, redis_url, runs, stale=False)
    stale = drain(dbs, redis_url, runs, stale=True)
    return {
        "runs": runs,
        "fresh": fresh,
        "stale": stale,
        "ratio": stale["runs_per_s"] / fresh["runs_per_s"],
        "pass": reaper_pass(dbs, redis_url, stalled),
    }


def section(dbs: Databases, redis_url: str, sz: Sizes) -> dict[str, Any]:
    return measure(dbs, redis_url, sz.backlog_runs, sz.backlog_stalled)


def targets(results: dict[str, Any], add: Any) -> None:
    sec = results.get("backlog") or {}
    if not sec.get("ratio"):
        return
    fresh, stale, p = sec["fresh"], sec["stale"], sec["pass"]
    add(
        f"a backlog stale past CAIRN_PENDING_AFTER drains at ≥ {RATIO:g}× a fresh one's "
        "runs/s, no message beyond one per run",
        sec["ratio"] >= RATIO and stale["duplicates"] <= sec["runs"],
        f"{sec['runs']:,} runs: {stale['runs_per_s']:.1f} vs {fresh['runs_per_s']:.1f} runs/s = "
        f"{sec['ratio']:.2f}×; {stale['duplicates']} deliveries beyond one per run (fresh: "
        f"{fresh['duplicates']}), the reaper sent {stale['reaper_sent']}; its passes "
        f"{stale['reaper_pass_ms_median']:.1f} ms median, {stale['reaper_pass_ms_max']:.0f} ms "
        f"max; a pass over {p['stalled']:,} stalled runs: {p['ms_per_batch']:.1f} ms a batch "
        f"of {p['batch']}, {p['sent_again']} sent again by the next",
    )


def render(results: dict[str, Any], c: Any) -> None:
    from rich.table import Table

    sec = results.get("backlog") or {}
    if not sec.get("ratio"):
        return
    t = Table(
        title=f"17. A backlog after an outage: {sec['runs']:,} one-step runs enqueued with no "
        f"worker, drained by beat + {WORKERS} workers × {CONCURRENCY}; stale = older than "
        "CAIRN_PENDING_AFTER"
    )
    for col in ("backlog", "runs/s", "× fresh", "duplicates", "reaper sent", "passes", "pass ms"):
        t.add_column(col, justify="left" if col == "backlog" else "right")
    for name in ("fresh", "stale"):
        r = sec[name]
        t.add_row(
            name,
            f"{r['runs_per_s']:.1f}",
            f"{r['runs_per_s'] / sec['fresh']['runs_per_s']:.2f}×",
            str(r["duplicates"]),
            str(r["reaper_sent"]),
            str(r["reaper_passes"]),
            f"{r['reaper_pass_ms_median']:.1f} (max {r['reaper_pass_ms_max']:.0f})",
        )
    c.print(t)
    p = sec["pass"]
    c.print(
        f"  a reaper pass over {p['stalled']:,} stalled runs: {p['batches']} batches of "
        f"{p['batch']} in {p['seconds']:.2f}s = {p['ms_per_batch']:.1f} ms a batch; the next "
        f"pass sent {p['sent_again']} again"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.backlog", description=__doc__)
    p.add_argument("--runs", type=int, default=100_000)
    p.add_argument("--stalled", type=int, default=20_000)
    args = p.parse_args(argv)
    from rich.console import Console

    from bench.common import bench_redis

    dbs = Databases()
    try:
        results = {"backlog": measure(dbs, bench_redis(), args.runs, args.stalled)}
    finally:
        dbs.close()
    render(results, Console(width=160, stderr=True))
    print(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
