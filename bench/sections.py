"""The four measurements: per-step overhead, growth, recovery, fleet."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import redis

from bench import cairn_sys, flows, peers
from bench.common import (
    INSTALL_HINT,
    Databases,
    bench_amqp,
    median,
    message,
    missing_module,
    pct,
    progress,
    run_child,
    window,
)
from bench.internals import Database, LeaseToken, PgStore
from bench.procs import Fleet, worker_env


@dataclasses.dataclass(frozen=True)
class Sizes:
    steps: int = 300
    windows: tuple[int, ...] = (4096, 40960)
    reps: int = 5
    growth: tuple[int, ...] = (100, 200, 400)
    growth_reps: int = 2
    msg_bytes: int = 1024
    kills: int = 10
    lease_ttl: float = 5.0
    fleet_workers: tuple[int, ...] = (1, 2, 4)
    fleet_runs: int = 120
    fleet_steps: int = 10
    noop_tasks: int = 1000
    pgbench_seconds: int = 5
    per_run_runs: int = 200
    per_run_reps: int = 5
    # fleet of waiting runs (bench/waiting.py): runs × steps model calls of `wait` seconds
    waiting_runs: int = 1000
    waiting_steps: int = 10
    waiting_wait: float = 1.0
    waiting_workers: int = 2
    waiting_threads: int = 500  # threads per worker
    waiting_pool_size: int = 10  # Postgres connections per worker process
    waiting_prefork: int = 0  # processes per worker; 0: the most this machine holds
    # bench/million.py: finished runs, active ones, calls timed per query
    million_runs: int = 1_000_000
    million_active: int = 5_000
    million_reps: int = 7
    # bench/stream.py: streaming runs at each N, their token rate and seconds; idle open
    # streams (server memory); the CPU section's batches of runs, words a reply, reps
    stream_runs: tuple[int, ...] = (100, 1000)
    stream_rate: float = 20.0
    stream_seconds: float = 10.0
    stream_idle: int = 1000
    stream_chat_runs: int = 40
    stream_words: int = 200
    stream_cpu_reps: int = 5
    # tracing's overhead, judged on short untraced/traced runs back to back: pairs, steps
    tracing_pairs: int = 40
    tracing_pair_steps: int = 100
    # bench/waits.py: runs waited for at once on one AsyncClient; those stopped one by one
    waits: int = 1000
    waits_samples: int = 300
    # bench/sleep.py: sleeping runs, how many of them are due, passes timed
    sleep_sleeping: int = 1_000_000
    sleep_due: int = 1_000
    sleep_reps: int = 7
    # bench/backlog.py: runs enqueued with no worker and drained, fresh and stale; runs
    # stalled under the reaper's timed pass
    backlog_runs: int = 100_000
    backlog_stalled: int = 20_000


QUICK = Sizes(
    steps=30,
    windows=(4096, 40960),
    reps=1,
    growth=(10, 20, 40),
    growth_reps=1,
    kills=1,
    lease_ttl=2.0,
    fleet_workers=(1, 2),
    fleet_runs=8,
    noop_tasks=40,
    pgbench_seconds=1,
    per_run_runs=10,
    per_run_reps=1,
    waiting_runs=12,
    waiting_steps=2,
    waiting_wait=0.2,
    waiting_threads=6,
    waiting_prefork=2,
    million_runs=10_000,
    million_active=200,
    million_reps=3,
    stream_runs=(20,),
    stream_seconds=2.0,
    stream_idle=20,
    stream_chat_runs=4,
    stream_words=50,
    stream_cpu_reps=1,
    tracing_pairs=4,
    tracing_pair_steps=10,
    waits=100,
    waits_samples=50,
    sleep_sleeping=10_000,
    sleep_due=100,
    sleep_reps=3,
    backlog_runs=200,
    backlog_stalled=1_200,
)

# A budget no bench window reaches, so cairn carries the whole window like every peer
# (the default budget would compact a 400-message window; compaction is its own feature).
NO_COMPACTION = {"window_budget_tokens": 10**9, "max_window_bytes": 10**9}


def _row(
    system: str, elapsed: list[float], wal: list[int], steps: int, **extra: Any
) -> dict[str, Any]:
    t = median(elapsed) if elapsed else 0.0
    w = min(wal) if wal else 0
    return {
        "system": system,
        "steps": steps,
        "seconds": t,
        "steps_per_s": steps / t if t else 0.0,
        "ms_per_step": 1000 * t / steps if steps else 0.0,
        "best_ms_per_step": 1000 * min(elapsed) / steps if steps and elapsed else 0.0,
        "wal_bytes": w,
        "wal_bytes_per_step": w / steps if steps else 0.0,
        "samples_s": elapsed,
        "samples_wal": wal,
        **extra,
    }


def _skip(system: str, note: str, **extra: Any) -> dict[str, Any]:
    return {"system": system, "skipped": note, **extra}


def _peer_rows(
    system: str,
    url: str,
    tasks: list[dict[str, Any]],
    labels: dict[str, str],
    row_of: Callable[[str, dict[str, Any]], dict[str, Any]],
) -> list[dict[str, Any]]:
    """One row per peer result, or one skip row per label when the peer cannot run."""
    got = run_peer(system, url, tasks)
    if isinstance(got, str):
        return [_skip(label, got, key=key) for key, label in labels.items()]
    return [row_of(labels[r["key"]], r) for r in got]


def run_peer(
    system: str, url: str, tasks: list[dict[str, Any]], timeout: float = 600.0
) -> list[dict[str, Any]] | str:
    """The peer's results, or a note saying why it did not run."""
    gone = peers.missing(system)
    if gone is not None:
        return f"{INSTALL_HINT} ({gone} not importable)"
    got = run_child(
        "bench.peers", [system, json.dumps({"url": url, "tasks": tasks})], system, timeout
    )
    return got if isinstance(got, str) else list(got)


def _flush(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    client.close()


# -- 1. per-step overhead ------------------------------------------------------------------
def per_step(dbs: Databases, redis_url: str, sz: Sizes) -> dict[str, Any]:
    n, rows = sz.steps, []
    floor_url = dbs.fresh("floor")
    cairn_sys.floor_setup(floor_url)
    cairn_url = dbs.fresh("cairn")
    cairn_sys.cairn_setup(cairn_url)
    inproc = cairn_sys.InProcess(cairn_url, redis_url, **NO_COMPACTION)
    # The same loop without run events (CAIRN_EVENTS_MAXLEN=0): what they cost a step.
    quiet = cairn_sys.InProcess(cairn_url, redis_url, events_maxlen=0, **NO_COMPACTION)
    runners = [inproc, quiet]
    # The same loop traced (the otel extra): spans into an exporter that drops them, and
    # through the batch processor and OTLP/HTTP exporter to a local sink. One provider
    # each for the section; the batch one is flushed after each of its runs (timed apart,
    # export_s) so its export never lands in another row's timing.
    gone = missing_module(cairn_sys.OTEL_MODULES)
    tracers: cairn_sys.Tracers | None = None
    exported: dict[int, list[float]] = {}  # W -> seconds to flush each traced-batch run
    samples: dict[tuple[str, int | None], tuple[list[float], list[int]]] = {}
    neighbour: dict[int, list[float]] = {}  # W -> the tiny floor measured beside it, per rep
    traced: cairn_sys.InProcess | None = None
    traced_batch: cairn_sys.InProcess | None = None
    pairs: dict[str, Any] | None = None
    batch_pairs: dict[str, Any] | None = None
    try:
        if gone is None:
            tracers = cairn_sys.Tracers()
            traced = cairn_sys.InProcess(
                cairn_url, redis_url, tracer=tracers.noop_tracer, **NO_COMPACTION
            )
            runners.append(traced)
            traced_batch = cairn_sys.InProcess(
                cairn_url, redis_url, tracer=tracers.batch_tracer, **NO_COMPACTION
            )
            runners.append(traced_batch)
        # warm-up (imports, prepared statements, first pages), not measured
        cairn_sys.tiny_run(floor_url, 10)
        cairn_sys.floor_run(floor_url, 10, window(4096))
        inproc.run(10, window(4096))
        if tracers is not None and traced is not None and traced_batch is not None:
            traced.run(10, window(4096))  # the SDK's first spans
            traced_batch.run(10, window(4096))
            tracers.flush_batch()  # the exporter's first connection and encoding

        def batch_run(win: list[dict[str, Any]], w: int) -> tuple[float, int]:
            assert tracers is not None and traced_batch is not None
            got = traced_batch.run(n, win)
            exported.setdefault(w, []).append(tracers.flush_batch())
            return got

        for rep in range(sz.reps):
            for w in sz.windows:
                win = window(w)
                progress(
                    f"per-step rep {rep + 1}/{sz.reps} W={w // 1024}KB: tiny floor, "
                    "window floor, cairn in-process"
                )
                # The tiny floor is measured next to every cairn sample (it does not
                # depend on W), so drift in the machine's load hits both alike. The traced
                # runs go beside the untraced one, for their paired ratio to it, in an
                # order that turns with each rep so none of the three always goes first.
                same: list[tuple[str, Callable[[], tuple[float, int]]]] = [
                    ("cairn", lambda win=win: inproc.run(n, win))
                ]
                if traced is not None:
                    same += [
                        ("cairn-traced", lambda win=win: traced.run(n, win)),
                        ("cairn-traced-batch", lambda win=win, w=w: batch_run(win, w)),
                    ]
                turn = rep % len(same)
                fns: list[tuple[str, Callable[[], tuple[float, int]]]] = [
                    ("tiny", lambda: cairn_sys.tiny_run(floor_url, n)),
                    ("floor", lambda win=win: cairn_sys.floor_run(floor_url, n, win)),
                    *same[turn:],
                    *same[:turn],
                ]
                fns += [
                    ("cairn-events", lambda win=win: quiet.run(n, win)),
                    ("cairn+msg", lambda win=win: inproc.run(n, win, append_bytes=sz.msg_bytes)),
                    ("cairn+call", lambda win=win: inproc.run(n, win, calls=1)),
                ]
                for key, fn in fns:
                    e, b = fn()
                    el, wl = samples.setdefault((key, None if key == "tiny" else w), ([], []))
                    el.append(e)
                    wl.append(b)
                    if key == "tiny":
                        neighbour.setdefault(w, []).append(e)
        if tracers is not None and traced is not None and traced_batch is not None:
            pairs = _tracing_pairs(inproc, traced, sz)
            batch_pairs = _tracing_pairs(inproc, traced_batch, sz, flush=tracers.flush_batch)
    finally:
        for runner in runners:
            runner.close()
        sink = None
        if tracers is not None:
            tracers.close()
            sink = {"requests": tracers.sink.requests, "bytes": tracers.sink.bytes}
    names = {
        "tiny": "floor: tiny seq+epoch-guarded upsert (small row)",
        "floor": "reference: bare seq-guarded upsert (whole window)",
        "cairn": "cairn in-process (window unchanged)",
        "cairn-traced": "cairn in-process, traced (no-op exporter)",
        "cairn-traced-batch": "cairn in-process, traced (batch OTLP exporter)",
        "cairn-events": "cairn in-process, run events off (window unchanged)",
        "cairn+msg": f"cairn in-process (+1 msg of {sz.msg_bytes} B/step)",
        "cairn+call": "cairn in-process (+1 journaled ctx.call/step)",
    }
    for (key, w), (el, wl) in samples.items():
        rows.append(
            _row(
                names[key],
                el,
                wl,
                n,
                key=key,
                window_bytes=w,
                paired_floor_s=neighbour[w] if w is not None else [],
                **({"export_s": exported[w]} if key == "cairn-traced-batch" else {}),
            )
        )
    if gone is not None:
        rows += [
            _skip(names[key], f"{cairn_sys.OTEL_HINT} ({gone} not importable)", key=key)
            for key in TRACED
        ]

    # (c) through a real Celery worker
    progress("per-step: starting a celery worker (concurrency 1)")
    _flush(redis_url)
    celery_url = dbs.fresh("cairn_celery")
    cairn_sys.cairn_setup(celery_url)
    fleet = Fleet(worker_env(celery_url, redis_url))
    client = cairn_sys.Client(redis_url)
    db = Database(celery_url)
    store = PgStore(db)
    try:
        fleet.worker(1)
        cairn_sys.through_celery(celery_url, client, store, 10, window(4096))  # warm-up
        for w in sz.windows:
            progress(f"per-step W={w // 1024}KB: cairn through celery ×{sz.reps}")
            el, wl, fl = [], [], []
            for _ in range(sz.reps):
                fl.append(cairn_sys.tiny_run(floor_url, n)[0])  # its neighbour floor
                e, b = cairn_sys.through_celery(celery_url, client, store, n, window(w))
                el.append(e)
                wl.append(b)
            rows.append(
                _row(
                    "cairn through celery (enqueue → done)",
                    el,
                    wl,
                    n,
                    key="celery",
                    window_bytes=w,
                    paired_floor_s=fl,
                )
            )
    finally:
        fleet.stop()
        client.close()
        db.close()

    # (d) DBOS, (e) LangGraph
    for system, key_tasks in (
        ("dbos", [("dbos", {"kind": "noop"})]),
        (
            "langgraph",
            [
                ("langgraph-async", {"kind": "noop", "durability": "async"}),
                ("langgraph-sync", {"kind": "noop", "durability": "sync"}),
            ],
        ),
    ):
        progress(f"per-step: {system} (own process, fresh database)")
        url = dbs.fresh(system)
        tasks = [
            {**spec, "key": key, "steps": n, "window_bytes": w, "reps": sz.reps}
            for w in sz.windows
            for key, spec in key_tasks
        ]
        labels = {
            "dbos": "DBOS (@DBOS.step per step)",
            "langgraph-async": "LangGraph PostgresSaver, durability=async",
            "langgraph-sync": "LangGraph PostgresSaver, durability=sync",
        }
        rows += _peer_rows(
            system,
            url,
            tasks,
            {key: labels[key] for key, _ in key_tasks},
            lambda label, r: _row(
                label, r["elapsed"], r["wal"], n, key=r["key"], window_bytes=r["window_bytes"]
            ),
        )
        dbs.drop(url)

    # Ratios on the best repetition of each (on a noisy machine noise only adds time, so
    # the fastest run is the least disturbed one): to the tiny floor, the least a durable
    # step can write, and to the whole-window upsert at the same W, a second reference.
    # paired_ratio: the median over repetitions of each sample over its neighbour floor.
    tiny = next(r for r in rows if r.get("key") == "tiny")
    whole = {r["window_bytes"]: r for r in rows if r.get("key") == "floor"}
    for r in rows:
        if "skipped" in r:
            continue
        r["time_vs_floor"] = r["best_ms_per_step"] / tiny["best_ms_per_step"]
        r["wal_vs_floor"] = (
            r["wal_bytes_per_step"] / tiny["wal_bytes_per_step"]
            if tiny["wal_bytes_per_step"]
            else None
        )
        if r.get("paired_floor_s"):
            r["paired_ratio"] = median(
                [e / f for e, f in zip(r["samples_s"], r["paired_floor_s"], strict=False)]
            )
        w = whole.get(r.get("window_bytes"))
        if w:
            r["time_vs_window_floor"] = r["best_ms_per_step"] / w["best_ms_per_step"]
    _tracing_ratios(rows, n)
    return {
        "steps": n,
        "windows": list(sz.windows),
        "reps": sz.reps,
        "rows": rows,
        "trace_sink": sink,
        "tracing_pairs": pairs,
        "tracing_pairs_batch": batch_pairs,
    }


TRACED = ("cairn-traced", "cairn-traced-batch")


def _tracing_pairs(
    untraced: cairn_sys.InProcess,
    traced: cairn_sys.InProcess,
    sz: Sizes,
    flush: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """Tracing's overhead on a no-op step (W=4 KB), judged on short runs back to back,
    untraced and traced, the order turning each pair: each pair sees the same moment of
    the machine, so the median of their ratios holds still where best-of-reps over
    whole runs moved ±15% with the load (Postgres round trips, other processes). With
    each pair's CPU in this process, the CPU tracing adds a step. With `flush` (the
    batch processor's), its export of the traced run's spans is timed after the run,
    apart: the batch thread's work, not the loop's."""
    n, win = sz.tracing_pair_steps, window(4096)
    progress(f"per-step: tracing overhead, {sz.tracing_pairs} pairs of {n}-step runs")
    ratios, added, base, exported = [], [], [], []
    for i in range(sz.tracing_pairs):
        order = [(untraced, "u"), (traced, "t")]
        got: dict[str, tuple[float, float]] = {}
        for runner, name in order if i % 2 == 0 else order[::-1]:
            elapsed, _ = runner.run(n, win)
            got[name] = (elapsed, runner.last_cpu_s)
            if flush is not None and name == "t":
                exported.append(flush())
        ratios.append(got["t"][0] / got["u"][0])
        added.append((got["t"][1] - got["u"][1]) / n)
        base.append(got["u"][0] / n)
    return {
        "pairs": sz.tracing_pairs,
        "steps": n,
        "ratios": ratios,
        "median": median(ratios),
        "added_cpu_us_per_step": 1e6 * median(added),
        "untraced_ms_per_step": 1000 * median(base),
        **({"export_us_per_step": 1e6 * median(exported) / n} if exported else {}),
    }


def _tracing_ratios(rows: list[dict[str, Any]], n: int) -> None:
    """Each traced row over the untraced cairn row at the same W: best over best
    (vs_untraced) and the median over reps of each traced sample over the untraced one
    measured beside it (paired_vs_untraced). The batch row also with the flush of its
    run's spans added (with_export_*: the export's whole cost, paid on the processor's
    thread in production)."""
    base = {r["window_bytes"]: r for r in rows if r.get("key") == "cairn" and "skipped" not in r}
    for r in rows:
        c = base.get(r.get("window_bytes"))
        if r.get("key") not in TRACED or "skipped" in r or c is None:
            continue
        r["vs_untraced"] = r["best_ms_per_step"] / c["best_ms_per_step"]
        r["paired_vs_untraced"] = median(
            [t / u for t, u in zip(r["samples_s"], c["samples_s"], strict=True)]
        )
        if "export_s" in r:
            both = [e + x for e, x in zip(r["samples_s"], r["export_s"], strict=True)]
            r["export_ms_per_step"] = 1000 * median(r["export_s"]) / n
            r["with_export_vs_untraced"] = min(both) / min(c["samples_s"])
            r["paired_with_export_vs_untraced"] = median(
                [b / u for b, u in zip(both, c["samples_s"], strict=True)]
            )


# -- 2. growth -----------------------------------------------------------------------------
def growth(dbs: Databases, redis_url: str, sz: Sizes) -> dict[str, Any]:
    rows = []
    b = sz.msg_bytes
    cairn_url = dbs.fresh("grow_cairn")
    cairn_sys.cairn_setup(cairn_url)
    naive_url = dbs.fresh("grow_naive")
    cairn_sys.floor_setup(naive_url)
    inproc = cairn_sys.InProcess(cairn_url, redis_url, **NO_COMPACTION)
    try:
        inproc.run(5, [], append_bytes=b)  # warm-up
        for n in sz.growth:
            progress(f"growth N={n}: cairn, naive full-window upsert")
            el, wl = [], []
            for _ in range(sz.growth_reps):
                e, w = inproc.run(n, [], append_bytes=b)
                el.append(e)
                wl.append(w)
            rows.append(_row("cairn (append-only window rows)", el, wl, n, key="cairn", n=n))
            e, w = cairn_sys.floor_run(naive_url, n, [], append=lambda i: message(b, i))
            rows.append(_row("naive full-window upsert", [e], [w], n, key="naive", n=n))
    finally:
        inproc.close()
    for system, specs in (
        (
            "langgraph",
            [("langgraph-list", {"channel": "list"}), ("langgraph-delta", {"channel": "delta"})],
        ),
        # The same list-channel graph on cairn's own LangGraph checkpointer.
        ("cairn_saver", [("cairn-saver", {"channel": "list"})]),
        ("dbos", [("dbos", {})]),
    ):
        progress(f"growth: {system} (own process, fresh database)")
        url = dbs.fresh(f"grow_{system}")
        if system == "cairn_saver":
            cairn_sys.cairn_setup(url)  # CairnSaver's graph_* tables: cairn's migrations
        tasks = [
            {
                "kind": "grow",
                "key": key,
                "steps": n,
                "msg_bytes": b,
                "durability": "async",
                "reps": 1 if key == "langgraph-list" else sz.growth_reps,
                **spec,
            }
            for n in sz.growth
            for key, spec in specs
        ]
        labels = {
            "langgraph-list": "LangGraph PostgresSaver, list channel (operator.add), async",
            "langgraph-delta": "LangGraph PostgresSaver, DeltaChannel (beta), async",
            "cairn-saver": "LangGraph CairnSaver (cairn), list channel (operator.add), async",
            "dbos": "DBOS (step returns the message)",
        }
        rows += _peer_rows(
            system,
            url,
            tasks,
            {key: labels[key] for key, _ in specs},
            lambda label, r: _row(
                label, r["elapsed"], r["wal"], r["steps"], key=r["key"], n=r["steps"]
            ),
        )
        dbs.drop(url)
    # The two savers side by side: LangGraph's rows grouped by N (PostgresSaver list,
    # CairnSaver list, PostgresSaver delta), where the CairnSaver rows were.
    order = {"langgraph-list": 0, "cairn-saver": 1, "langgraph-delta": 2}
    lg = [r for r in rows if r.get("key") in order]
    if lg:
        at = rows.index(lg[0])
        lg.sort(key=lambda r: (r.get("n", float("inf")), order[r["key"]]))
        rest = [r for r in rows if r.get("key") not in order]
        rows = rest[:at] + lg + rest[at:]
    return {
        "ns": list(sz.growth),
        "msg_bytes": b,
        "rows": rows,
        "note": "cairn runs with window_budget_tokens=1e9 so it keeps the whole window, as the "
        "peers do; the LangGraph rows run one graph (one `tick` node a super-step) in their own "
        "process, on PostgresSaver and on cairn's CairnSaver, each checked against its last "
        "checkpoint read back",
    }


# -- 3. recovery ---------------------------------------------------------------------------
def _lease(r: redis.Redis, run_id: str) -> tuple[int, int] | None:
    raw = r.get(f"cairn:lease:{run_id}")
    if not raw:
        return None
    token = LeaseToken.parse(raw.decode())
    return token.pid, token.epoch


def _position(conn: psycopg.Connection[Any], run_id: str) -> tuple[int, int, float, str]:
    row = conn.execute(
        "SELECT seq, epoch, extract(epoch from updated_at), status FROM checkpoints WHERE run_id = %s",
        (run_id,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), float(row[2]), str(row[3])


def _wait(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.01)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")


def _rabbitmq() -> str | None:
    """The bench's RabbitMQ vhost emptied of cairn's queues, or None if not reachable."""
    from bench.internals import reset_broker

    url = bench_amqp()
    try:
        reset_broker(url)
    except Exception as exc:  # noqa: BLE001 (kombu raises the transport's own errors)
        progress(f"recovery on RabbitMQ skipped: {url.split('@')[-1]} not reachable ({exc})")
        return None
    return url


def recovery(dbs: Databases, redis_url: str, sz: Sizes) -> dict[str, Any]:
    ttl = sz.lease_ttl
    out: dict[str, Any] = {"lease_ttl": ttl, "kills": sz.kills, "modes": []}
    amqp_url = _rabbitmq()
    # A whole worker lost: on Redis its message waits for the visibility timeout, so the
    # reaper sends the run again; on RabbitMQ the message comes back when the dead
    # worker's connection drops, and the next worker defers until the lease expires.
    for mode in ("child", "worker", *(["worker_amqp"] if amqp_url else [])):
        _flush(redis_url)
        url = dbs.fresh(f"recover_{mode}")
        cairn_sys.cairn_setup(url)
        on_amqp = mode == "worker_amqp"
        extra = {"CAIRN_BROKER_URL": amqp_url} if on_amqp and amqp_url else {}
        env = worker_env(url, redis_url, CAIRN_LEASE_TTL=str(ttl), **extra)
        fleet = Fleet(env)
        client = cairn_sys.Client(redis_url, amqp_url if on_amqp else None)
        r = redis.Redis.from_url(redis_url)
        db = Database(url)
        store = PgStore(db)
        conn = psycopg.connect(url, autocommit=True)
        times: list[float] = []
        events: list[dict[str, Any]] = []
        try:
            workers = [fleet.worker(1), fleet.worker(1)]
            if mode != "child":  # production runs beat with either broker
                fleet.beat()
            run_id = cairn_sys.create_run(
                store, 10**6, [], workflow=flows.SLOW, extra={"sleep": 0.02}
            )
            client.send_run(run_id)
            for k in range(sz.kills):
                # a running run, a few steps past its last recovery
                seq0 = _position(conn, run_id)[0]
                held = _wait(lambda: _lease(r, run_id), 60, "a lease holder")  # noqa: B023
                _wait(
                    lambda: _position(conn, run_id)[0] >= seq0 + 5,  # noqa: B023
                    60,
                    "the run to make progress",
                )
                pid, epoch = _lease(r, run_id) or held
                if mode == "child":
                    t_kill = time.time()
                    os.kill(pid, signal.SIGKILL)
                else:
                    victim = next(w for w in workers if os.getpgid(pid) == w.pid)
                    t_kill = time.time()
                    victim.kill()
                    workers.remove(victim)
                time.sleep(0.1)  # let a commit in flight at the kill land first
                seq_k = _position(conn, run_id)[0]

                def moved() -> float | None:
                    seq, ep, at, _ = _position(conn, run_id)  # noqa: B023
                    return at if ep > epoch and seq > seq_k else None  # noqa: B023

                saved_at = _wait(moved, 10 * ttl + 60, f"recovery #{k + 1}")
                seen_at = time.time()
                times.append(saved_at - t_kill)
                events.append(
                    {
                        "killed_pid": pid,
                        "epoch": epoch,
                        "seq_at_kill": seq_k,
                        "t_kill": t_kill,
                        "saved_at": saved_at,
                        "seen_at": seen_at,
                    }
                )
                progress(f"recovery ({mode} killed) #{k + 1}/{sz.kills}: {saved_at - t_kill:.2f}s")
                if mode != "child" and k + 1 < sz.kills:
                    workers.append(fleet.worker(1))  # replace the lost node
        finally:
            fleet.stop()
            client.close()
            r.close()
            db.close()
            conn.close()
            dbs.drop(url)
        label = {
            "child": "pool child SIGKILLed (broker redelivery)",
            "worker": "whole worker SIGKILLed (reaper via beat)",
            "worker_amqp": "whole worker SIGKILLed, RabbitMQ broker (redelivery + reaper)",
        }[mode]
        out["modes"].append(
            {
                "mode": mode,
                "label": label,
                "seconds": times,
                "events": events,
                "p50": median(times),
                "p95": pct(times, 95),
                "max": max(times) if times else 0.0,
            }
        )
    return out


# -- 4. fleet ------------------------------------------------------------------------------
PGBENCH_DDL = """
CREATE TABLE IF NOT EXISTS pgb_checkpoints (
    run_id text PRIMARY KEY, seq bigint NOT NULL, state jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 70)
"""
PGBENCH_SCRIPT = """\\set rid :client_id
INSERT INTO pgb_checkpoints AS c (run_id, seq, state, updated_at)
VALUES ('r' || :rid, (extract(epoch from clock_timestamp()) * 1000000)::bigint,
        '{"n": 1, "note": "a small checkpoint state, like a no-op step writes"}'::jsonb, now())
ON CONFLICT (run_id) DO UPDATE SET seq = EXCLUDED.seq, state = EXCLUDED.state, updated_at = now()
WHERE c.seq < EXCLUDED.seq;
"""


def pgbench_path() -> str | None:
    try:
        bindir = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=True
        ).stdout.strip()
        p = Path(bindir) / "pgbench"
        if p.exists():
            return str(p)
    except (OSError, subprocess.CalledProcessError):
        pass
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / "pgbench").exists():
            return str(d / "pgbench")
    return shutil.which("pgbench")


def pgbench(url: str, clients: int, seconds: int) -> float | str:
    exe = pgbench_path()
    if exe is None:
        return "pgbench not found"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(PGBENCH_DDL)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(PGBENCH_SCRIPT)
        script = f.name
    try:
        proc = subprocess.run(
            [
                exe,
                "-n",
                "-M",
                "prepared",
                "-c",
                str(clients),
                "-j",
                str(clients),
                "-T",
                str(seconds),
                "-f",
                script,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            check=False,
        )
    finally:
        os.unlink(script)
    m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", proc.stdout)
    if not m:
        return f"pgbench failed: {(proc.stderr or proc.stdout)[-400:]}"
    return float(m.group(1))


def _hold(client: cairn_sys.Client, sends: list[Any], queue: str = "bench_hold") -> None:
    client.redis.delete(queue)
    for send in sends:
        send(queue)


def fleet(dbs: Databases, redis_url: str, sz: Sizes) -> dict[str, Any]:
    import resource

    from bench.procs import CpuMeter, postgres_pids, redis_pids

    _flush(redis_url)
    url = dbs.fresh("fleet")
    cairn_sys.cairn_setup(url)
    fl = Fleet(worker_env(url, redis_url))
    client = cairn_sys.Client(redis_url)
    db = Database(url)
    store = PgStore(db)
    rows = []
    # Where the cores go: CPU of each process group over each timed window (/proc).
    pg, rd = postgres_pids(url), redis_pids(redis_url)
    meter = CpuMeter(
        {
            "celery workers": (lambda: [p.pid for p in fl.procs], True),
            "postgres": (lambda: pg, True),
            "redis": (lambda: rd, False),
            "bench driver": (lambda: [os.getpid()], False),
        }
    )

    def per(cpu: dict[str, Any], n: int) -> dict[str, float]:
        ms = {k: 1000 * v / n for k, v in cpu["cpu_s"].items()}
        return ms | {"other processes": 1000 * cpu["other_s"] / n, "idle": 1000 * cpu["idle_s"] / n}

    try:
        for k in sz.fleet_workers:
            while len(fl.procs) < k:
                fl.worker(1, wait=False)
            for p in fl.procs:
                fl.wait_ready(p)
            # warm every worker's connections
            warm = [cairn_sys.create_run(store, 2, []) for _ in range(2 * k)]
            for rid in warm:
                client.send_run(rid)
            cairn_sys.wait_done(url, warm, 120)

            progress(f"fleet K={k}: {sz.noop_tasks} celery no-op tasks")
            client.redis.delete(flows.NOOP_COUNTER)
            _hold(client, [client.send_noop] * sz.noop_tasks)
            meter.start()
            t0 = time.time()
            client.release("bench_hold")
            _wait(
                lambda: int(client.redis.get(flows.NOOP_COUNTER) or 0) >= sz.noop_tasks,
                300,
                "no-op tasks",
            )
            noop_s = time.time() - t0
            noop_cpu = meter.stop()

            progress(f"fleet K={k}: {sz.fleet_runs} runs × {sz.fleet_steps} no-op steps")
            ids = [cairn_sys.create_run(store, sz.fleet_steps, []) for _ in range(sz.fleet_runs)]
            _hold(client, [lambda q, rid=rid: client.send_run(rid, q) for rid in ids])
            meter.start()
            t0 = time.time()
            client.release("bench_hold")
            runs_s = cairn_sys.wait_done(url, ids, 600) - t0
            runs_cpu = meter.stop()

            progress(f"fleet K={k}: pgbench upsert, {k} client(s), {sz.pgbench_seconds}s")
            pg_url = dbs.fresh("pgbench")
            meter.start()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            tps = pgbench(pg_url, k, sz.pgbench_seconds)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)  # pgbench, reaped by now
            pgb_cpu = meter.stop()
            dbs.drop(pg_url)
            txs = tps * sz.pgbench_seconds if isinstance(tps, float) else 0.0
            pgb_client = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            steps_per_s = sz.fleet_runs * sz.fleet_steps / runs_s
            rows.append(
                {
                    "workers": k,
                    "runs": sz.fleet_runs,
                    "steps_per_run": sz.fleet_steps,
                    "seconds": runs_s,
                    "runs_per_s": sz.fleet_runs / runs_s,
                    "steps_per_s": steps_per_s,
                    "noop_tasks": sz.noop_tasks,
                    "noop_tasks_per_s": sz.noop_tasks / noop_s,
                    "pgbench_tps": tps if isinstance(tps, float) else None,
                    "pgbench_note": None if isinstance(tps, float) else tps,
                    "steps_vs_pgbench": steps_per_s / tps
                    if isinstance(tps, float) and tps
                    else None,
                    "runs_vs_noop": (sz.fleet_runs / runs_s) / (sz.noop_tasks / noop_s),
                    "cpu": runs_cpu,
                    "cpu_ms_per_step": per(runs_cpu, sz.fleet_runs * sz.fleet_steps),
                    "noop_cpu_ms_per_task": per(noop_cpu, sz.noop_tasks),
                    "pgbench_cpu_ms_per_tx": {
                        "postgres": 1000 * pgb_cpu["cpu_s"]["postgres"] / txs,
                        "pgbench client": 1000 * pgb_client / txs,
                    }
                    if txs
                    else None,
                }
            )
    finally:
        fl.stop()
        client.close()
        db.close()
    return {"rows": rows, "prediction": _fleet_ceiling(rows)}


SERVICES = ("celery workers", "postgres", "redis")  # what a deployment runs; not the bench


def _fleet_ceiling(
    rows: list[dict[str, Any]], cores: tuple[int, ...] = (2, 4, 8, 16)
) -> list[dict[str, Any]]:
    """Steps/s the fleet's measured costs predict on more cores, one concurrency-1 worker
    (and one pgbench client) per core. Three bounds, the lowest wins: all the CPU a step
    costs (workers + Postgres + Redis, at the most workers measured, contention included)
    spread over the cores; Redis's single thread; and K workers each as fast as the lone
    worker was (a concurrency-1 worker drives one step at a time). pgbench likewise: K
    clients at its one-client rate, or the cores over its CPU per transaction."""
    if not rows or not rows[-1].get("pgbench_cpu_ms_per_tx") or not rows[0].get("pgbench_tps"):
        return []
    one, most = rows[0], rows[-1]
    ms = most["cpu_ms_per_step"]
    step_cost = sum(ms[g] for g in SERVICES)
    tx_cost = sum(most["pgbench_cpu_ms_per_tx"].values())
    out = []
    for n in cores:
        bounds = {
            f"{n} cores (CPU of all groups)": n * 1000 / step_cost,
            "redis (one thread)": 1000 / ms["redis"] if ms["redis"] else float("inf"),
            f"{n} serial workers (at 1 worker's rate)": n * one["steps_per_s"],
        }
        bound = min(bounds, key=bounds.__getitem__)
        tps = min(n * one["pgbench_tps"], n * 1000 / tx_cost)
        out.append(
            {
                "cores": n,
                "workers": n,
                "steps_per_s": bounds[bound],
                "bound_by": bound,
                "pgbench_tps": tps,
                "steps_vs_pgbench": bounds[bound] / tps,
                "step_cpu_ms": step_cost,
                "pgbench_cpu_ms_per_tx": tx_cost,
            }
        )
    return out


# -- 5. per-run fixed cost -----------------------------------------------------------------
def _batch(client: cairn_sys.Client, sends: list[Any], done: Callable[[float], float]) -> float:
    """Seconds from releasing the held messages at once to done(t0)'s answer."""
    _hold(client, sends)
    t0 = time.time()
    client.release("bench_hold")
    return done(t0)


def per_run(dbs: Databases, redis_url: str, sz: Sizes) -> dict[str, Any]:
    """Batches of one-step runs against batches of Celery no-op tasks, alternated on one
    concurrency-1 worker: what a run costs beyond its steps (dispatch, lease, claim,
    release), next to what the queue itself costs per task. Then the same runs in process,
    timed phase by phase."""
    _flush(redis_url)
    url = dbs.fresh("per_run")
    cairn_sys.cairn_setup(url)
    cairn_sys.floor_setup(url)
    fl = Fleet(worker_env(url, redis_url))
    client = cairn_sys.Client(redis_url)
    db = Database(url)
    store = PgStore(db)
    k = sz.per_run_runs

    def noops(t0: float) -> float:
        _wait(lambda: int(client.redis.get(flows.NOOP_COUNTER) or 0) >= k, 300, "no-op tasks")
        return time.time() - t0

    run_s: list[float] = []
    noop_s: list[float] = []
    try:
        fl.worker(1)
        for rep in range(sz.per_run_reps + 1):  # the first round warms the worker up
            progress(f"per-run rep {rep}/{sz.per_run_reps}: {k} no-op tasks, {k} one-step runs")
            client.redis.delete(flows.NOOP_COUNTER)
            noop = _batch(client, [client.send_noop] * k, noops)
            ids = [cairn_sys.create_run(store, 1, []) for _ in range(k)]
            sends = [lambda q, rid=rid: client.send_run(rid, q) for rid in ids]
            runs = _batch(
                client, sends, lambda t0, ids=ids: cairn_sys.wait_done(url, ids, 300) - t0
            )
            if rep:
                noop_s.append(noop)
                run_s.append(runs)
    finally:
        fl.stop()
        client.close()
        db.close()

    progress(f"per-run: {k} one-step runs in process, phase by phase")
    inproc = cairn_sys.InProcess(url, redis_url)
    try:
        inproc.phases(min(k, 20))  # warm-up
        best: dict[str, float] | None = None
        for _ in range(sz.per_run_reps):
            got = inproc.phases(k)
            if best is None or got["run"] < best["run"]:
                best = got
    finally:
        inproc.close()
    assert best is not None
    cairn_sys.fenced_runs(url, min(k, 20))  # warm-up
    fenced_ms = 1000 * min(cairn_sys.fenced_runs(url, k) for _ in range(sz.per_run_reps)) / k
    run_ms, noop_ms = 1000 * min(run_s) / k, 1000 * min(noop_s) / k
    inproc_ms = {name: 1000 * v / k for name, v in best.items()}
    rows = [
        {"what": "Celery no-op task (one Redis INCR), through the worker", "ms": noop_ms},
        {"what": "cairn one-step run, enqueue → done through the worker", "ms": run_ms},
        {"what": "cairn one-step run in process (no broker)", "ms": inproc_ms["run"]},
    ]
    for name in ("lease acquire", "claim", "heartbeat start", "save", "release"):
        rows.append({"what": f"  in process: {name}", "ms": inproc_ms[name]})
    other = inproc_ms["run"] - sum(v for n, v in inproc_ms.items() if n != "run")
    rows.append({"what": "  in process: the rest (step, context, checks, metrics)", "ms": other})
    rows.append(
        {"what": "dispatch + ack: through the worker − in process", "ms": run_ms - inproc_ms["run"]}
    )
    # What durability alone costs a run, whoever implements it: the 2x target's room.
    rows.append(
        {"what": "floor: a fenced run's 2 commits (2 tiny guarded upserts)", "ms": fenced_ms}
    )
    for r in rows:
        r["vs_noop"] = r["ms"] / noop_ms if noop_ms else None
    return {
        "runs": k,
        "reps": sz.per_run_reps,
        "run_ms": run_ms,
        "noop_ms": noop_ms,
        "ratio": run_ms / noop_ms if noop_ms else None,
        "paired_ratio": median([r / n for r, n in zip(run_s, noop_s, strict=True)]),
        "samples_run_s": run_s,
        "samples_noop_s": noop_s,
        "in_process_ms": inproc_ms,
        "fenced_floor_ms": fenced_ms,
        "rows": rows,
    }
