"""A web app's waits: `python -m bench --only waits`.

N runs, each waited for by one AsyncClient.wait on one client (N tasks in one event
loop, as N requests of a FastAPI app). While they wait: the Postgres connections the
database holds, the bench's own aside. Then runs stop one at a time, each by an UPDATE of
its status from another connection (what a worker's save does), timed from just before
that statement to the moment its wait returns. Two floors, timed alike in the same run: a
bare NOTIFY from one connection heard by another blocked in LISTEN, and the same UPDATE
of a run's status heard so (its commit and trigger, no client). Last, the runs left stop
in one statement: how long until every waiter woke.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from typing import Any

import psycopg

import cairn
from bench.common import Databases, pct, progress
from bench.internals import Database, PgStore, channel, upgrade

FLOOR_RUN = "waits-floor"  # stopped and started again, heard by a bare LISTEN
TARGET_MS = 20.0  # p99 from a run stopping to its waiter waking, on loopback
TARGET_CONNECTIONS = 2  # for every wait of one client, its pool's connection included
STOP = "UPDATE checkpoints SET status = 'done' WHERE run_id = ANY(%s)"
COUNT = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND pid <> pg_backend_pid()"
)


def _heard(
    url: str, samples: int, channel: str, send: str, reset: str | None = None
) -> list[float]:
    """Seconds from a statement that notifies channel (send) to the notification's
    delivery on a connection blocked in LISTEN; reset (not timed) undoes send between."""
    heard: list[float] = []
    ready, got = threading.Event(), threading.Semaphore(0)

    def listen() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
            ready.set()
            for _ in conn.notifies(stop_after=samples):
                heard.append(time.perf_counter())
                got.release()

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    ready.wait(10)
    sent = []
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(samples):
            sent.append(time.perf_counter())
            conn.execute(send)
            got.acquire(timeout=10)
            if reset:
                conn.execute(reset)
    thread.join(10)
    return [h - s for s, h in zip(sent, heard, strict=True)]


async def _waits(url: str, redis_url: str, ids: list[str], samples: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    stopper = psycopg.connect(url, autocommit=True)

    def stop(run_ids: list[str]) -> float:
        t0 = time.perf_counter()
        stopper.execute(STOP, (run_ids,))
        return t0

    async def timed(client: cairn.AsyncClient, run_id: str) -> float:
        run = await client.wait(run_id, timeout=120)
        woke = time.perf_counter()
        assert run.run_id == run_id and run.status == cairn.RunStatus.DONE, run
        return woke

    try:
        async with cairn.AsyncClient(database_url=url, broker_url=redis_url) as client:
            store = client.store
            assert isinstance(store, PgStore)
            # The pool's one connection, as an app's that has settled (a first call that
            # finds it still opening opens a second).
            await asyncio.to_thread(store.db.open().pool.wait, 10)
            assert await client.get(ids[0]) is not None
            t0 = time.perf_counter()
            tasks = {r: asyncio.create_task(timed(client, r)) for r in ids}
            while store.db.listener().looked() < len(ids):
                await asyncio.sleep(0.01)
            out["listening_s"] = round(time.perf_counter() - t0, 3)
            row = await asyncio.to_thread(lambda: stopper.execute(COUNT).fetchone())
            out["connections"] = int(row[0]) if row else -1
            progress(f"waits: {len(ids)} waiting on {out['connections']} connections")
            latencies = []
            for run_id in ids[:samples]:
                t0 = await asyncio.to_thread(stop, [run_id])
                latencies.append(await tasks[run_id] - t0)
            rest = ids[samples:]
            t0 = await asyncio.to_thread(stop, rest)
            woke = await asyncio.gather(*(tasks[r] for r in rest))
            out["burst"] = len(rest)
            out["burst_ms"] = round(1000 * (max(woke) - t0), 1) if woke else 0.0
    finally:
        stopper.close()
    out["wake_ms"] = _ms(latencies)
    return out


def _ms(seconds: list[float]) -> dict[str, float]:
    ms = sorted(1000 * s for s in seconds)
    return {"p50": round(statistics.median(ms), 2), "p99": round(pct(ms, 99), 2),
            "max": round(ms[-1], 2)}  # fmt: skip


def section(dbs: Databases, redis_url: str, sz: Any) -> dict[str, Any]:
    n, samples = sz.waits, min(sz.waits_samples, sz.waits)
    url = dbs.fresh("waits")
    upgrade(url)
    store = PgStore(Database(url))
    try:
        progress(f"waits: {n} runs")
        ids = [f"waits-{i:05d}" for i in range(n)]
        for run_id in [*ids, FLOOR_RUN]:
            store.create_run(run_id, "bench-waits", {})
    finally:
        store.db.close()  # from here every connection but the bench's is the client's
    floor = _ms(_heard(url, samples, "bench_floor", "NOTIFY bench_floor"))
    # The same stop as the waits', heard bare: what its commit and trigger cost.
    stop, reset = (
        f"UPDATE checkpoints SET status = '{status}' WHERE run_id = '{FLOOR_RUN}'"
        for status in ("done", "running")
    )
    update = _ms(_heard(url, samples, channel(FLOOR_RUN), stop, reset))
    out = asyncio.run(_waits(url, redis_url, ids, samples))
    out.update(waits=n, samples=samples, floor_ms=floor, update_heard_ms=update)
    out["p50_vs_floor"] = round(out["wake_ms"]["p50"] / floor["p50"], 2)
    out["p99_vs_floor"] = round(out["wake_ms"]["p99"] / floor["p99"], 2)
    return out


def targets(results: dict[str, Any], add: Any) -> None:
    """≤ TARGET_CONNECTIONS connections for every wait of one client; p99 ≤ TARGET_MS."""
    sec = results.get("waits")
    if not isinstance(sec, dict) or "wake_ms" not in sec:
        return
    add(
        f"{sec['waits']:,} concurrent AsyncClient waits hold ≤ {TARGET_CONNECTIONS} "
        "Postgres connections",
        sec["connections"] <= TARGET_CONNECTIONS,
        f"{sec['connections']} connections (the client's pool and its listening connection)",
    )
    w, f = sec["wake_ms"], sec["floor_ms"]
    add(
        f"a waiter wakes ≤ {TARGET_MS:g} ms (p99) after its run stops",
        w["p99"] <= TARGET_MS,
        f"p50 {w['p50']:.2f} ms, p99 {w['p99']:.2f} ms over {sec['samples']} runs among "
        f"{sec['waits']:,} waiting; a bare LISTEN/NOTIFY p50 {f['p50']:.2f} ms, p99 "
        f"{f['p99']:.2f} ms ({sec['p50_vs_floor']:.2f}× / {sec['p99_vs_floor']:.2f}×); the "
        f"same UPDATE heard bare p50 {sec['update_heard_ms']['p50']:.2f} ms",
    )


def render(results: dict[str, Any], c: Any) -> None:
    from rich.table import Table

    sec = results.get("waits")
    if not isinstance(sec, dict) or "wake_ms" not in sec:
        return
    t = Table(
        title=f"15. Waits: {sec['waits']:,} AsyncClient.wait on one client, "
        f"{sec['connections']} Postgres connections while they wait; {sec['samples']} runs "
        f"stopped one at a time, then {sec['burst']:,} in one statement "
        f"(all woken in {sec['burst_ms']:.1f} ms)"
    )
    for col in ("from a run's stop to", "p50 ms", "p99 ms", "max ms"):
        t.add_column(col, justify="left" if col.startswith("from") else "right")
    rows = (
        ("its waiter waking", "wake_ms"),
        ("its UPDATE heard by a bare LISTEN", "update_heard_ms"),
        ("a bare NOTIFY heard", "floor_ms"),
    )
    for what, key in rows:
        ms = sec[key]
        t.add_row(what, f"{ms['p50']:.2f}", f"{ms['p99']:.2f}", f"{ms['max']:.2f}")
    c.print(t)
