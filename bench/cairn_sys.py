"""cairn itself (in process and through Celery) and the floor it is measured against."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import redis
from celery import Celery
from psycopg.types.json import Jsonb

from bench import flows
from bench.common import measure
from bench.internals import (
    Chain,
    Database,
    Leases,
    Metrics,
    Outbox,
    PgStore,
    RedisEvents,
    Tracing,
    broker,
    loop,
    tracing,
    upgrade,
)
from cairn import Settings

# -- the floor -----------------------------------------------------------------------------
FLOOR_DDL = """
CREATE TABLE IF NOT EXISTS floor_checkpoints (
    run_id     text PRIMARY KEY,
    seq        bigint NOT NULL,
    state      jsonb NOT NULL,
    win        jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)
"""
FLOOR_UPSERT = """
INSERT INTO floor_checkpoints AS c (run_id, seq, state, win, updated_at)
VALUES (%s, %s, %s, %s, now())
ON CONFLICT (run_id) DO UPDATE
   SET seq = EXCLUDED.seq, state = EXCLUDED.state, win = EXCLUDED.win, updated_at = now()
 WHERE c.seq < EXCLUDED.seq
"""


# The tiny floor: the least a durable step can write. One small row per run, guarded by
# seq and fencing epoch as cairn's save is, its RETURNING row telling a landed write from
# a fenced one. What cairn adds beyond it (history, window tail, signals) is its cost.
TINY_DDL = """
CREATE TABLE IF NOT EXISTS tiny_checkpoints (
    run_id     text PRIMARY KEY,
    seq        bigint NOT NULL,
    epoch      bigint NOT NULL,
    state      jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)
"""
TINY_UPSERT = """
INSERT INTO tiny_checkpoints AS c (run_id, seq, epoch, state, updated_at)
VALUES (%s, %s, %s, %s, now())
ON CONFLICT (run_id) DO UPDATE
   SET seq = EXCLUDED.seq, epoch = EXCLUDED.epoch, state = EXCLUDED.state, updated_at = now()
 WHERE c.seq < EXCLUDED.seq AND c.epoch <= EXCLUDED.epoch
RETURNING c.run_id
"""


def floor_setup(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(FLOOR_DDL)
        conn.execute(TINY_DDL)


def _tiny_write(conn: psycopg.Connection[Any], run_id: str, seq: int, epoch: int) -> None:
    """One tiny guarded upsert ({"n": seq} as state); a fenced write raises, as cairn's."""
    cur = conn.execute(TINY_UPSERT, (run_id, seq, epoch, Jsonb({"n": seq})), prepare=True)
    if cur.fetchone() is None:
        raise RuntimeError(f"tiny floor {run_id}: write {seq} was fenced")


def tiny_run(url: str, steps: int, epoch: int = 1) -> tuple[float, int]:
    """One tiny guarded upsert per step ({"n": i} as state), prepared, autocommit, one
    connection: what a no-op step must at least cost. A fenced write raises, as cairn's."""
    run_id = f"tiny-{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:

        def go() -> None:
            for i in range(1, steps + 1):
                _tiny_write(conn, run_id, i, epoch)

        conn.execute(TINY_UPSERT, (run_id, 0, epoch, Jsonb({})), prepare=True)
        elapsed, wal, _ = measure(url, go)
    return elapsed, wal


def fenced_runs(url: str, runs: int) -> float:
    """Seconds for `runs` runs of the least a fenced durable run writes, on one prepared
    connection: two tiny guarded upserts, each its own commit (the claim's fence, the
    step's save). No lease, no broker: what durability alone costs a run."""
    with psycopg.connect(url, autocommit=True) as conn:
        ids = [f"fenced-{uuid.uuid4().hex[:10]}" for _ in range(runs)]
        t0 = time.perf_counter()
        for run_id in ids:
            for seq in (1, 2):
                _tiny_write(conn, run_id, seq, 1)
        return time.perf_counter() - t0


def floor_run(
    url: str, steps: int, win: list[dict[str, Any]], append: Callable[[int], Any] | None = None
) -> tuple[float, int]:
    """One bare seq-guarded upsert per step on one connection, the whole window each time.

    With append, each step adds append(i) to the window first (the naive growing row).
    """
    run_id = f"floor-{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:
        window = list(win)

        def go() -> None:
            for i in range(1, steps + 1):
                if append is not None:
                    window.append(append(i))
                conn.execute(
                    FLOOR_UPSERT, (run_id, i, Jsonb({"n": i}), Jsonb(window)), prepare=True
                )

        elapsed, wal, _ = measure(url, go)
    return elapsed, wal


# -- cairn ---------------------------------------------------------------------------------
def cairn_setup(url: str) -> None:
    upgrade(url)


def create_run(
    store: PgStore,
    steps: int,
    win: list[dict[str, Any]],
    append_bytes: int = 0,
    workflow: str = flows.NOOP,
    extra: dict[str, Any] | None = None,
) -> str:
    """A run of the bench workflow whose checkpoint starts with win as its model window."""
    run_id = f"{workflow}-{uuid.uuid4().hex[:10]}"
    data = {"steps": steps, "append_bytes": append_bytes, **(extra or {})}
    store.create_run(run_id, workflow, data, "nap" if workflow == flows.SLOW else "tick")
    if win:
        with store.db.connection() as conn, conn.transaction():
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO window_messages (run_id, idx, message) VALUES (%s, %s, %s)",
                    [(run_id, i, Jsonb(m)) for i, m in enumerate(win)],
                )
            conn.execute(
                "UPDATE checkpoints SET win_start = 0, win_end = %s WHERE run_id = %s",
                (len(win), run_id),
            )
    return run_id


# What a worker states by default (a 12-hex-digit hash), so each history row carries one.
CODE_VERSION = "0123456789ab"


def settings_for(url: str, redis_url: str, **over: Any) -> Settings:
    return Settings(database_url=url, redis_url=redis_url, **{"code_version": CODE_VERSION, **over})


class InProcess:
    """workers.loop.run with the real PgStore and Leases, no broker. With a tracer, the
    worker's tracing middleware first in the chain (as workers/app.py puts it) and cairn
    tracing with it during each run() only, so other runners stay untraced."""

    def __init__(self, url: str, redis_url: str, tracer: Any = None, **settings: Any) -> None:
        self.tracer = tracer
        traced = [Tracing()] if tracer is not None else []
        self.settings = settings_for(url, redis_url, **settings)
        self.db = Database(url, give_up_after=self.settings.store_give_up_after)
        self.store = PgStore(self.db)
        self.leases = Leases.from_url(redis_url)
        # The metrics middleware and the run events a worker has too: the loop measured
        # is the production one.
        self.deps = loop.Deps(
            settings=self.settings,
            store=self.store,
            leases=self.leases,
            model=None,
            middleware=Chain([*traced, Metrics(self.settings.code_version)]),
            events=Outbox(RedisEvents(self.leases.client), self.settings)
            if self.settings.events_maxlen
            else None,
        )
        self.url = url
        self.last_cpu_s = 0.0  # the last run()'s CPU seconds in this process

    def run(
        self, steps: int, win: list[dict[str, Any]], append_bytes: int = 0, calls: int = 0
    ) -> tuple[float, int]:
        if calls:
            run_id = create_run(self.store, steps, win, 0, flows.CALLS, {"calls": calls})
        else:
            run_id = create_run(self.store, steps, win, append_bytes)
        # warm the pool's connection so the timing is the loop, not the first connect
        self.db.one("position", {"run_id": run_id})
        if self.tracer is not None:
            tracing.use(self.tracer)

        def go() -> str:
            # This process's CPU (all its threads) during the run: what tracing adds to a
            # step is CPU here, which Postgres' round-trip jitter does not blur.
            c0 = time.process_time()
            try:
                return loop.run(run_id, self.deps)
            finally:
                self.last_cpu_s = time.process_time() - c0

        try:
            elapsed, wal, status = measure(self.url, go)
        finally:
            if self.tracer is not None:
                tracing.use(None)
        if status != "done":
            raise RuntimeError(f"cairn run {run_id} ended {status}")
        return elapsed, wal

    def phases(self, runs: int) -> dict[str, float]:
        """Seconds per phase, summed over `runs` one-step runs driven in process: where a
        run's fixed cost goes (lease, claim, the step and its save, release)."""
        spent: dict[str, float] = dict.fromkeys(
            ("run", "lease acquire", "claim", "heartbeat start", "save", "release"),
            0.0,
        )

        def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    spent[name] += time.perf_counter() - t0

            return call

        def acquire(*args: Any, **kwargs: Any) -> Any:
            lease = acquire_raw(*args, **kwargs)
            if lease is not None:
                lease.start_heartbeat = timed("heartbeat start", lease.start_heartbeat)
                lease.release = timed("release", lease.release)
            return lease

        ids = [create_run(self.store, 1, []) for _ in range(runs)]
        self.db.one("position", {"run_id": ids[0]})  # a warm connection
        store, acquire_raw = self.store, timed("lease acquire", self.leases.acquire)
        store.claim = timed("claim", store.claim)  # type: ignore[method-assign]
        store.save = timed("save", store.save)  # type: ignore[method-assign]
        self.leases.acquire = acquire  # type: ignore[method-assign]
        try:
            for run_id in ids:
                t0 = time.perf_counter()
                if loop.run(run_id, self.deps) != "done":
                    raise RuntimeError(f"cairn run {run_id} did not finish")
                spent["run"] += time.perf_counter() - t0
        finally:
            for name in ("claim", "save"):
                delattr(store, name)
            del self.leases.acquire
        return spent

    def close(self) -> None:
        if self.deps.events is not None:
            self.deps.events.flush()
        self.db.close()
        self.leases.client.close()


# -- tracing (the otel extra) ---------------------------------------------------------------
OTEL_HINT = "not installed: pip install -e '.[otel]'"
OTEL_MODULES = (
    "opentelemetry.sdk.trace",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
)


class TraceSink:
    """A local stand-in for an OTLP/HTTP collector: 200 to POST /v1/traces, the body read
    and dropped (counted: requests, bytes). Threaded, on a free port of 127.0.0.1."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a collector does

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                ok = self.path == "/v1/traces"
                if ok:
                    sink.requests += 1
                    sink.bytes += len(body)
                self.send_response(200 if ok else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="bench-trace-sink", daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


class Tracers:
    """The per-step section's two tracer providers, made once for the section: spans ended
    through a SimpleSpanProcessor into an exporter that drops them (tracing's own cost),
    and through the SDK's BatchSpanProcessor into the OTLP/HTTP exporter, posting to a
    TraceSink (the production setup, defaults: 5 s or 512 spans a batch). Every span is
    sampled. close() shuts both down (the batch one flushes) and stops the sink."""

    def __init__(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SimpleSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON

        from cairn import __version__

        class Drop(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        resource = Resource.create({"service.name": "cairn-bench"})
        self.sink = TraceSink()
        self.noop = TracerProvider(resource=resource, sampler=ALWAYS_ON)
        self.noop.add_span_processor(SimpleSpanProcessor(Drop()))
        self.batch = TracerProvider(resource=resource, sampler=ALWAYS_ON)
        self.batch.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=self.sink.endpoint))
        )
        self.noop_tracer = self.noop.get_tracer("cairn", __version__)
        self.batch_tracer = self.batch.get_tracer("cairn", __version__)

    def flush_batch(self) -> float:
        """Seconds to export what the batch processor still holds (to the sink)."""
        t0 = time.perf_counter()
        if not self.batch.force_flush():
            raise RuntimeError("the batch span processor did not flush within 30 s")
        return time.perf_counter() - t0

    def close(self) -> None:
        try:
            self.noop.shutdown()
            self.batch.shutdown()
        finally:
            self.sink.close()


class Client:
    """Sends cairn.run / bench.noop messages to the bench broker (Redis, or with
    amqp_url RabbitMQ, configured as cairn configures it)."""

    def __init__(self, redis_url: str, amqp_url: str | None = None) -> None:
        self.app = Celery("cairn-bench", broker=redis_url)
        self.app.conf.broker_transport_options = {"visibility_timeout": 3600.0}
        if amqp_url:
            self.app.conf.update(broker.conf(settings_for("", redis_url, broker_url=amqp_url)))
        self.redis = redis.Redis.from_url(redis_url)

    def send_run(self, run_id: str, queue: str | None = None) -> None:
        self.app.send_task("cairn.run", args=[run_id], queue=queue)

    def send_noop(self, queue: str | None = None) -> None:
        self.app.send_task("bench.noop", queue=queue)

    def release(self, held: str, queue: str = "celery") -> None:
        """Move every message parked on list `held` onto the worker's queue at once."""
        self.redis.rename(held, queue)

    def close(self) -> None:
        self.app.close()
        self.redis.close()


def wait_done(url: str, run_ids: list[str], timeout: float, every: float = 0.02) -> float:
    """Wait until every run is done, looking every `every` seconds; returns the latest
    final save time (epoch seconds)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'done'),"
                " count(*) FILTER (WHERE status = 'failed'),"
                " extract(epoch from max(updated_at)) FROM checkpoints WHERE run_id = ANY(%s)",
                (run_ids,),
            ).fetchone()
            assert row is not None
            done, failed, last = row
            if failed:
                raise RuntimeError(f"{failed} bench run(s) failed")
            if done == len(run_ids):
                return float(last)
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out: {done}/{len(run_ids)} runs done")
            time.sleep(every)


def through_celery(
    url: str,
    client: Client,
    store: PgStore,
    steps: int,
    win: list[dict[str, Any]],
    timeout: float = 300.0,
) -> tuple[float, int]:
    """Enqueue one run on a live worker; seconds from enqueue to its final save."""
    run_id = create_run(store, steps, win)

    def go() -> float:
        t0 = time.time()
        client.send_run(run_id)
        return wait_done(url, [run_id], timeout) - t0

    _, wal, elapsed = measure(url, go)
    return float(elapsed), wal
