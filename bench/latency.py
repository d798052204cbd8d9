"""Enqueue to the first step: `python -m bench --only latency`.

What a web app's user feels first: the time from `Client.enqueue` returning control to
the first line of the run's first step. One real worker (`celery worker`, prefork,
concurrency 1, as `cairn worker` starts it), on each broker (Redis; RabbitMQ when
scripts/services.sh's server answers), two ways interleaved one for one:

  floor  a bare Celery task (bench.stamp) sent with Celery's own send_task, configured as
         cairn's client configures Celery; its first line stamps the wall clock. Publish
         to start: the least any system on this queue can do.
  cairn  `Client.enqueue(bench_latency)`: the run's row written in Postgres, then its
         message sent; its first step's first line stamps. Enqueue to first step: the
         floor plus cairn's part (the insert, and in the worker the lease, the claim, the
         load, the middleware, the events).

Then, with no worker: what `enqueue(..., connection=conn)` adds to the caller's own
transaction (an order row and its commit, alone and with the run enqueued inside).

Idle: one at a time, each sent once the one before stamped and the worker sat idle for
a moment. Loaded: sent at a steady rate (a message every `gap` seconds, about half of
what the worker carries), each way's latencies matched to their stamps. Reported per
broker and load: p50/p95/p99/max in ms of each way. Targets (issue 42): cairn's p50 ≤
1.3× the floor's, cairn's p99 ≤ 25 ms, idle on loopback.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import TYPE_CHECKING, Any

import redis

import cairn
from bench import cairn_sys, flows
from bench.common import median, progress
from bench.procs import Fleet, worker_env
from bench.sections import QUICK, _rabbitmq

if TYPE_CHECKING:
    from bench.common import Databases
    from bench.sections import Sizes

TARGET_P50 = 1.3  # cairn's p50 over the floor's
TARGET_P99_MS = 25.0


@dataclasses.dataclass(frozen=True)
class LatencySizes:
    idle: int = 300  # of each way, idle
    loaded: int = 600  # of each way, at the steady rate
    gap: float = 0.006  # seconds between two sends when loaded (both ways together)


QUICK_SIZES = LatencySizes(idle=20, loaded=30, gap=0.01)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def _summary(ms: list[float]) -> dict[str, float]:
    return {
        "n": len(ms),
        "p50": median(ms),
        "p95": _pct(ms, 95),
        "p99": _pct(ms, 99),
        "max": max(ms),
    }


class _Ways:
    """Sends of both ways to one worker, and their stamps read back from Redis."""

    def __init__(self, url: str, redis_url: str, amqp_url: str | None) -> None:
        self.redis = redis.Redis.from_url(redis_url)
        self.celery = cairn_sys.Client(redis_url, amqp_url)
        settings = cairn.Settings(database_url=url, redis_url=redis_url)
        self.client = cairn.Client(url, amqp_url or redis_url, settings=settings)
        self.sent: dict[str, tuple[str, float]] = {}  # tag: way, when sent
        self.began: dict[str, float] = {}  # run id: when its task began
        # cairn's latency in parts (ms): the enqueue call (its insert, then the send), to
        # the task's start (the queue), and from there to the step (lease, claim, load).
        self.parts: dict[str, list[float]] = {
            "Client.enqueue call": [],
            "enqueue → task began": [],
            "task began → first step": [],
        }

    def send(self, way: str) -> None:
        if way == "floor":
            tag = f"task-{uuid.uuid4().hex[:12]}"
            t0 = time.time()
            self.celery.app.send_task("bench.stamp", args=[tag])
        else:
            tag = f"{flows.LATENCY_IDS}{uuid.uuid4().hex[:12]}"
            t0 = time.time()
            self.client.enqueue(flows.LATENCY, {}, run_id=tag)
            self.parts["Client.enqueue call"].append((time.time() - t0) * 1000)
        self.sent[tag] = (way, t0)

    def stamps(self, wanted: int, timeout: float = 60.0) -> dict[str, list[float]]:
        """Wait for `wanted` stamps; ms from each send to its stamp, per way."""
        got: dict[str, list[float]] = {"floor": [], "cairn": []}
        deadline = time.monotonic() + timeout
        while sum(map(len, got.values())) < wanted:
            item = self.redis.blpop([flows.STAMPS], timeout=1)
            if item is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"latency: {wanted - sum(map(len, got.values()))} lost")
                continue
            tag, at = item[1].decode().split()
            if tag.startswith("task:"):  # a run's task began: its step's stamp follows
                self.began[tag[5:]] = float(at)
                continue
            way, t0 = self.sent.pop(tag)
            if tag in self.began:
                began = self.began.pop(tag)
                self.parts["enqueue → task began"].append((began - t0) * 1000)
                self.parts["task began → first step"].append((float(at) - began) * 1000)
            got[way].append((float(at) - t0) * 1000)
        return got

    def close(self) -> None:
        self.client.close()
        self.celery.close()
        self.redis.close()


def _idle(ways: _Ways, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"floor": [], "cairn": []}
    for i in range(2 * n):
        way = ("floor", "cairn")[(i + i // 2) % 2]  # floor, cairn, cairn, floor, ...
        ways.send(way)
        for k, v in ways.stamps(1).items():
            out[k] += v
        time.sleep(0.02)  # the worker back to waiting on the broker
    return out


def _loaded(ways: _Ways, n: int, gap: float) -> dict[str, list[float]]:
    start = time.monotonic()
    for i in range(2 * n):
        ways.send(("floor", "cairn")[i % 2])
        time.sleep(max(0.0, start + (i + 1) * gap - time.monotonic()))
    return ways.stamps(2 * n, timeout=120)


def _in_transaction(url: str, redis_url: str, n: int) -> dict[str, Any]:
    """What `enqueue(..., connection=conn)` adds to the caller's own transaction: an order
    row inserted and committed (the floor), and the same with the run enqueued inside it
    (its row and its outbox notice, sent by beat's dispatcher after the commit), timed
    from BEGIN to the end of COMMIT, interleaved."""
    import psycopg

    settings = cairn.Settings(database_url=url, redis_url=redis_url)
    client = cairn.Client(url, redis_url, settings=settings)
    got: dict[str, list[float]] = {"floor": [], "cairn": []}
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS bench_orders (id text PRIMARY KEY, n int)")
            for i in range(2 * n + 20):  # the first 20: warm-up
                way = ("floor", "cairn")[i % 2]
                order = f"order-{uuid.uuid4().hex[:12]}"
                t0 = time.perf_counter()
                with conn.transaction():
                    conn.execute("INSERT INTO bench_orders VALUES (%s, %s)", (order, i))
                    if way == "cairn":
                        client.enqueue(flows.LATENCY, {}, run_id=f"tx-{order}", connection=conn)
                if i >= 20:
                    got[way].append((time.perf_counter() - t0) * 1000)
    finally:
        client.close()
    floor, run = _summary(got["floor"]), _summary(got["cairn"])
    return {"floor": floor, "cairn": run, "added_p50_ms": run["p50"] - floor["p50"]}


def section(dbs: Databases, redis_url: str, sz: Sizes) -> dict[str, Any]:
    size = QUICK_SIZES if sz == QUICK else LatencySizes()
    amqp_url = _rabbitmq()
    rows: list[dict[str, Any]] = []
    url = dbs.fresh("latency_tx")
    cairn_sys.cairn_setup(url)
    progress(f"latency: {size.idle} transactions of each way, the run enqueued inside or not")
    try:
        in_tx = _in_transaction(url, redis_url, size.idle)
    finally:
        dbs.drop(url)
    for name, amqp in (("redis", None), *((("rabbitmq", amqp_url),) if amqp_url else ())):
        url = dbs.fresh(f"latency_{name}")
        cairn_sys.cairn_setup(url)
        extra = {"CAIRN_BROKER_URL": amqp} if amqp else {}
        fleet = Fleet(worker_env(url, redis_url, **extra))
        ways = _Ways(url, redis_url, amqp)
        try:
            ways.redis.delete(flows.STAMPS)
            fleet.worker(1)
            _idle(ways, 10)  # warm-up: imports, connections, prepared statements
            progress(f"latency on {name}: {size.idle} of each way, idle")
            for v in ways.parts.values():
                v.clear()
            idle = _idle(ways, size.idle)
            parts = {k: median(v) for k, v in ways.parts.items() if v}
            progress(f"latency on {name}: {size.loaded} of each way, one every {size.gap}s")
            loaded = _loaded(ways, size.loaded, size.gap)
        finally:
            ways.close()
            fleet.stop()
            dbs.drop(url)
        for load, got in (("idle", idle), ("loaded", loaded)):
            floor, run = _summary(got["floor"]), _summary(got["cairn"])
            rows.append(
                {
                    "broker": name,
                    "load": load,
                    "floor": floor,
                    "cairn": run,
                    "p50_ratio": run["p50"] / floor["p50"],
                    "added_p50_ms": run["p50"] - floor["p50"],
                    "parts_p50_ms": parts if load == "idle" else {},
                }
            )
    return {"sizes": dataclasses.asdict(size), "rows": rows, "in_transaction": in_tx}


def targets(results: dict[str, Any], add: Any) -> None:
    sec = results.get("latency") or {}
    tx = sec.get("in_transaction")
    if tx:
        add(
            "transactional enqueue's added latency to the caller's commit (stated)",
            True,
            f"an order row's transaction {tx['floor']['p50']:.2f} ms p50 alone, "
            f"{tx['cairn']['p50']:.2f} ms with the run enqueued inside: "
            f"+{tx['added_p50_ms']:.2f} ms (p99 {tx['floor']['p99']:.2f} / "
            f"{tx['cairn']['p99']:.2f} ms)",
            stated=True,
        )
    for r in sec.get("rows", []):
        if r["load"] != "idle":
            continue
        f, c = r["floor"], r["cairn"]
        add(
            f"enqueue → first step p50 ≤ {TARGET_P50:g}× a bare Celery task's publish → "
            f"start ({r['broker']}, idle)",
            r["p50_ratio"] <= TARGET_P50,
            f"{c['p50']:.2f} ms vs {f['p50']:.2f} ms = {r['p50_ratio']:.2f}× "
            f"(+{r['added_p50_ms']:.2f} ms; cairn's p50 parts: "
            + ", ".join(f"{k} {v:.2f} ms" for k, v in r["parts_p50_ms"].items())
            + ")",
        )
        add(
            f"enqueue → first step p99 ≤ {TARGET_P99_MS:g} ms ({r['broker']}, idle)",
            c["p99"] <= TARGET_P99_MS,
            f"p99 {c['p99']:.2f} ms (floor {f['p99']:.2f} ms), max {c['max']:.2f} ms",
        )


def render(results: dict[str, Any], c: Any) -> None:
    from rich.table import Table

    sec = results.get("latency") or {}
    if not sec.get("rows"):
        return
    t = Table(
        title="13. Enqueue to first step, one worker (prefork, 1): floor = a bare Celery "
        "task's publish → start; cairn = Client.enqueue → the first step's first line (ms)"
    )
    for col in ("broker", "load", "way", "p50", "p95", "p99", "max", "p50 × floor"):
        t.add_column(col, justify="right" if col not in ("broker", "load", "way") else "left")
    for r in sec["rows"]:
        for way in ("floor", "cairn"):
            s = r[way]
            ratio = f"{r['p50_ratio']:.2f}×" if way == "cairn" else ""
            t.add_row(
                r["broker"],
                r["load"],
                way,
                *(f"{s[k]:.2f}" for k in ("p50", "p95", "p99", "max")),
                ratio,
            )
    c.print(t)
