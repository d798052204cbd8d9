"""Live token streaming: `python -m bench --only stream`.

1. Latency, token emitted → received. A producer process (`python -m bench.stream
   produce SPEC`) holds N runs' leases and emits `token` events through a real Outbox
   at `rate` a second each (starts jittered) for `seconds`; one asyncio process (`consume`)
   reads every run's `GET /runs/{id}/events` with httpx from a real `cairn serve`. Latency
   is the receive wall time minus the event's `ts` (one host, one clock). Beside it, in
   the same run and at the same N and rate, the floor: raw XADDs (pipelined when several
   are due at once) read by one blocking XREAD over all N streams in another process.
   Every process's CPU over the window is read from /proc, so a saturated machine shows.
2. Worker CPU per token event: a real `cairn worker` (threads pool) runs one-step runs
   whose model call the Messages-API stand-in answers with `words` words, streamed
   (a `token` event a word) or not, in alternating batches: (CPU streamed − CPU plain) ÷
   tokens. A second worker with events off (CAIRN_EVENTS_MAXLEN=0) runs the same
   batches, which splits that into the SDK's streaming and cairn's events.
3. SSE memory: the server's RSS with no open stream, then with `idle` open idle ones.

The workers import this module (CAIRN_WORKFLOWS=bench.stream) for its two workflows.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from bench.common import ROOT, child_main, median, pct, progress, run_child
from bench.procs import model_standin
from cairn import DONE, Context, StepResult, text_of, workflow

if TYPE_CHECKING:
    from bench.common import Databases
    from bench.sections import Sizes

REDIS_DB = 40  # its own database: the tests and the other sections use theirs meanwhile
LOGS = ROOT / ".cairn" / "bench-stream"
TARGET_P95_MS, TARGET_RUNS = 50.0, 100
# How long after the producer's last event a consumer waits for the rest: past it, the
# missing events are reported as missing.
DRAIN_S = 30.0
# The server's keep-alive on an idle stream. The endpoint answers with its first event, so
# an idle stream's headers come with its first keep-alive: a short one lets the consumer
# know every stream is open before the producer starts (busy streams never send one).
KEEPALIVE_S = 1
CONCURRENCY = 8  # the CPU section's worker threads

# -- the CPU section's workflows --------------------------------------------------------
STREAMED, PLAIN = "bench_stream_on", "bench_stream_off"
streamed_flow, plain_flow = workflow(STREAMED), workflow(PLAIN)


def _answer(ctx: Context, stream: bool) -> StepResult:
    ask = {"role": "user", "content": "REPLY: " + ctx.input["reply"]}
    reply = ctx.model(stream=stream, messages=[ask], max_tokens=4096)
    return StepResult(cursor=DONE, state={"chars": len(text_of(reply))})


@streamed_flow.step()
def answer_streamed(ctx: Context) -> StepResult:
    return _answer(ctx, True)


@plain_flow.step()
def answer_plain(ctx: Context) -> StepResult:
    return _answer(ctx, False)


# -- children ---------------------------------------------------------------------------
def _redis(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


def _plan(runs: int, rate: float, seconds: float, seed: int) -> list[tuple[float, int]]:
    """(offset s, run index) of every event, in time order: each run starts at a random
    point of its first interval, then emits every 1/rate s."""
    rnd, each = random.Random(seed), max(1, round(rate * seconds))
    plan = [
        (start + k / rate, i)
        for i, start in enumerate(rnd.uniform(0, 1 / rate) for _ in range(runs))
        for k in range(each)
    ]
    plan.sort()
    return plan


def _paced(plan: list[tuple[float, int]], t0: float) -> Any:
    """Lists of run indices as their events fall due (plan offsets from t0, monotonic)."""
    i = 0
    while i < len(plan):
        now = time.monotonic() - t0
        if plan[i][0] > now:
            time.sleep(plan[i][0] - now)
            continue
        j = i
        while j < len(plan) and plan[j][0] <= now:
            j += 1
        yield [run for _, run in plan[i:j]]
        i = j


ABORT = b"abort"  # the ready key's value when the consumer failed: the producer gives up


def _await_ready(r: Any, key: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = r.get(key)
        if value == ABORT:
            raise RuntimeError("the consumer failed before the window")
        if value is not None:
            return
        time.sleep(0.01)
    raise TimeoutError(f"no {key} after {timeout:.0f}s")


def produce(spec: dict[str, Any]) -> dict[str, Any]:
    """As a worker does: each run's lease held, its token events through the Outbox."""
    from bench.internals import Leases, Outbox, RedisEvents, encode
    from cairn import Settings

    leases = Leases.from_url(spec["redis_url"])
    outbox = Outbox(RedisEvents(leases.client), Settings.from_env())
    runs = spec["runs"]
    held = []
    for run_id in runs:
        lease = leases.acquire(run_id, ttl=600)
        assert lease is not None, run_id
        held.append((str(lease.token), lease.token.epoch))
    plan = _plan(len(runs), spec["rate"], spec["seconds"], spec["seed"])
    _await_ready(leases.client, spec["ready_key"])
    cpu0, t0 = time.process_time(), time.monotonic()
    for due in _paced(plan, t0):
        for i in due:
            token, epoch = held[i]
            event = encode(
                "token", {"call": 0, "text": " word"}, cursor="answer", visit=0, attempt=epoch
            )
            outbox.put(runs[i], token, event)
    emitting = time.monotonic() - t0
    flushed = outbox.flush(60)
    leases.client.set(spec["sent_key"], outbox.sent)
    return {
        "put": len(plan),
        "sent": outbox.sent,
        "flushed": flushed,
        "emit_s": emitting,
        "cpu_s": time.process_time() - cpu0,
    }


def floor_produce(spec: dict[str, Any]) -> dict[str, Any]:
    """The least a producer does: XADD {text, ts}, what is due at once in one pipeline."""
    r = _redis(spec["redis_url"])
    streams = [f"bench:floor:{spec['tag']}:{i}" for i in range(spec["n"])]
    plan = _plan(spec["n"], spec["rate"], spec["seconds"], spec["seed"])
    _await_ready(r, spec["ready_key"])
    cpu0, t0 = time.process_time(), time.monotonic()
    for due in _paced(plan, t0):
        pipe = r.pipeline(transaction=False)
        for i in due:
            pipe.xadd(streams[i], {"e": json.dumps({"text": " word", "ts": time.time()})})
        pipe.execute()
    emitting = time.monotonic() - t0
    r.set(spec["sent_key"], len(plan))
    return {
        "put": len(plan),
        "sent": len(plan),
        "flushed": True,
        "emit_s": emitting,
        "cpu_s": time.process_time() - cpu0,
    }


class _Tally:
    """What a consumer received: latencies by emit second, counts, order per stream."""

    def __init__(self, n: int) -> None:
        self.lat: list[float] = []
        self.emitted: list[float] = []
        self.written: list[float] = []  # emit → the XADD (the entry id's ms: Redis's clock)
        self.per_run = [0] * n
        self.last: list[tuple[int, int]] = [(0, 0)] * n
        self.out_of_order = 0
        self.other: dict[str, int] = {}

    def token(self, i: int, entry_id: str, ts: float, now: float) -> None:
        self.lat.append(now - ts)
        self.emitted.append(ts)
        self.per_run[i] += 1
        ms, _, seq = entry_id.partition("-")
        key = (int(ms), int(seq or 0))
        self.written.append(key[0] / 1000 - ts)
        if key <= self.last[i]:
            self.out_of_order += 1
        self.last[i] = key

    @property
    def received(self) -> int:
        return sum(self.per_run)

    def summary(self, expected_each: int) -> dict[str, Any]:
        lat = [1000 * x for x in self.lat]
        t0 = min(self.emitted, default=0.0)
        by_second: dict[int, list[float]] = {}
        for ts, ms in zip(self.emitted, lat, strict=True):
            by_second.setdefault(int(ts - t0), []).append(ms)
        return {
            "received": self.received,
            "p50_ms": median(lat),
            "p95_ms": pct(lat, 95),
            "p99_ms": pct(lat, 99),
            "max_ms": max(lat, default=0.0),
            # where the time went: emit → in Redis (ms resolution), then Redis → received
            "to_redis_p50_ms": 1000 * median(self.written),
            "to_redis_p95_ms": 1000 * pct(self.written, 95),
            # p95 of the events emitted in each second: a backlog grows along the window
            "p95_ms_by_second": [pct(v, 95) for _, v in sorted(by_second.items())],
            "runs_short": sum(1 for c in self.per_run if c < expected_each),
            "runs_over": sum(1 for c in self.per_run if c > expected_each),
            "out_of_order": self.out_of_order,
            "other_events": self.other,
        }


def _meter(spec: dict[str, Any]) -> Any:
    from bench.procs import CpuMeter

    return CpuMeter(
        {k: (lambda p=p: p, False) for k, p in spec["pids"].items()}
        | {"consumer": (lambda: [os.getpid()], False)}
    )


def _kicks(r: Any) -> int:
    """XADDs to every cairn serve hub's wake stream so far (a kick restarts its XREAD)."""
    from bench.internals import keys

    total = 0
    for key in r.scan_iter(keys.events("hub:*")):  # Hub._wake: "hub:<pid>:<id>"
        total += int(r.xinfo_stream(key)["entries-added"])
    return total


def _drain(r: Any, spec: dict[str, Any], received: Any, t_ready: float) -> float:
    """Block until the consumer has what the producer sent, or DRAIN_S after it said so;
    the seconds from ready to the last event in."""
    sent_at: float | None = None
    sent = 0
    while True:
        if sent_at is None:
            value = r.get(spec["sent_key"])
            if value is not None:
                sent, sent_at = int(value), time.monotonic()
        if sent_at is not None and (received() >= sent or time.monotonic() - sent_at > DRAIN_S):
            return time.monotonic() - t_ready
        if time.monotonic() - t_ready > 600:
            raise TimeoutError("the producer never finished")
        time.sleep(0.02)


class _Streams:
    """Every run's GET /runs/{id}/events held open by one httpx client: a stream is open
    at its first byte (an event or a keep-alive: the endpoint answers with the first);
    on_event(i, raw SSE event, receive time) for each event after that."""

    def __init__(self, spec: dict[str, Any], on_event: Any = None) -> None:
        self.spec, self.on_event = spec, on_event
        self.runs: list[str] = spec["runs"]
        self.opened = 0
        self.ended: list[str] = []  # streams the server closed or broke, and how
        self.all_open, self.trouble = asyncio.Event(), asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def _one(self, client: Any, i: int) -> None:
        try:
            async with client.stream("GET", f"/runs/{self.runs[i]}/events") as resp:
                resp.raise_for_status()
                buf, first = b"", True
                async for chunk in resp.aiter_raw():
                    now = time.time()
                    if first:
                        first = False
                        self.opened += 1
                        if self.opened == len(self.runs):
                            self.all_open.set()
                    if self.on_event is None:
                        continue
                    buf += chunk
                    *events, buf = buf.split(b"\n\n")
                    for ev in events:
                        if ev.startswith(b"event: "):  # not a keep-alive comment
                            self.on_event(i, ev, now)
            self.ended.append(f"{self.runs[i]}: the server ended the stream")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 (counted and reported: a broken stream)
            self.ended.append(f"{self.runs[i]}: {type(exc).__name__}: {exc}")
        self.trouble.set()

    async def open(self, client: Any) -> float:
        """Seconds until every stream is open; RuntimeError if one ends before."""
        t0 = time.monotonic()
        self.tasks = [asyncio.create_task(self._one(client, i)) for i in range(len(self.runs))]
        waits = [asyncio.create_task(e.wait()) for e in (self.all_open, self.trouble)]
        await asyncio.wait(waits, timeout=300, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        if self.ended or not self.all_open.is_set():
            why = self.ended[0] if self.ended else "timed out after 300 s"
            raise RuntimeError(f"{self.opened} of {len(self.runs)} streams opened: {why}")
        return time.monotonic() - t0

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def _client(spec: dict[str, Any]) -> Any:
    import httpx

    return httpx.AsyncClient(
        base_url=spec["base_url"],
        headers={"Authorization": f"Bearer {spec['token']}"},
        timeout=httpx.Timeout(None, connect=60),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
    )


def consume(spec: dict[str, Any]) -> dict[str, Any]:
    """Every run's SSE stream at once from one asyncio process; the latency of each token."""
    return asyncio.run(_consume(spec))


async def _consume(spec: dict[str, Any]) -> dict[str, Any]:
    r = _redis(spec["redis_url"])
    tally = _Tally(len(spec["runs"]))

    def on_event(i: int, ev: bytes, now: float) -> None:
        data = ev[ev.index(b"\ndata: ") + 7 :].split(b"\n", 1)[0]
        e = json.loads(data)
        if e["kind"] == "token":
            tally.token(i, e["id"], e["ts"], now)
        else:
            tally.other[e["kind"]] = tally.other.get(e["kind"], 0) + 1

    streams = _Streams(spec, on_event)
    async with _client(spec) as client:
        open_s = await streams.open(client)
        meter, kicks0 = _meter(spec), _kicks(r)
        meter.start()
        t_ready = time.monotonic()
        r.set(spec["ready_key"], 1)
        window = await asyncio.to_thread(_drain, r, spec, lambda: tally.received, t_ready)
        cpu, kicks = meter.stop(), _kicks(r) - kicks0
        await streams.close()
    return {
        "open_s": open_s,
        "window_s": window,
        "cpu": cpu,
        "hub_kicks": kicks,
        "streams_ended": len(streams.ended),
        "stream_errors": streams.ended[:3],
        **tally.summary(spec["each"]),
    }


def floor_consume(spec: dict[str, Any]) -> dict[str, Any]:
    """One blocking XREAD over all N streams, in a loop."""
    n, r = spec["n"], _redis(spec["redis_url"])
    index = {f"bench:floor:{spec['tag']}:{i}".encode(): i for i in range(n)}
    after: dict[bytes, bytes | str] = dict.fromkeys(index, "0-0")
    tally = _Tally(n)
    meter = _meter(spec)
    meter.start()
    t_ready = time.monotonic()
    r.set(spec["ready_key"], 1)
    sent: int | None = None
    sent_at = look_at = 0.0
    while sent is None or (tally.received < sent and time.monotonic() - sent_at < DRAIN_S):
        got = r.xread(after, block=100)
        now = time.time()
        for key, entries in got or ():
            i = index[key]
            for entry_id, fields in entries:
                tally.token(i, entry_id.decode(), json.loads(fields[b"e"])["ts"], now)
            after[key] = entries[-1][0]
        if sent is None and time.monotonic() >= look_at:  # the producer's count, 10 times a s
            look_at = time.monotonic() + 0.1
            value = r.get(spec["sent_key"])
            if value is not None:
                sent, sent_at = int(value), time.monotonic()
    return {
        "open_s": 0.0,
        "window_s": time.monotonic() - t_ready,
        "cpu": meter.stop(),
        "hub_kicks": None,
        **tally.summary(spec["each"]),
    }


def idle(spec: dict[str, Any]) -> dict[str, Any]:
    """The server's RSS with no stream open, then with every run's (idle) stream open."""
    return asyncio.run(_idle(spec))


async def _idle(spec: dict[str, Any]) -> dict[str, Any]:
    from bench.procs import rss_mb

    server = spec["server_pid"]
    async with _client(spec) as client:
        # The first requests import and allocate what every later one reuses: not a stream's.
        warm = _Streams({**spec, "runs": spec["warm"]})
        await warm.open(client)
        await warm.close()
        await asyncio.sleep(2 * KEEPALIVE_S + 1)  # the server sees them gone at a keep-alive
        before = rss_mb([server])
        streams = _Streams(spec)
        open_s = await streams.open(client)
        await asyncio.sleep(2 * KEEPALIVE_S)
        during = rss_mb([server])
        if streams.ended:
            raise RuntimeError(f"{len(streams.ended)} idle streams ended: {streams.ended[0]}")
        await streams.close()
    return {
        "streams": len(spec["runs"]),
        "rss_before_mb": before,
        "rss_open_mb": during,
        "open_s": open_s,
    }


CHILDREN = {
    "produce": produce,
    "floor-produce": floor_produce,
    "consume": consume,
    "floor-consume": floor_consume,
    "idle": idle,
}


def main(argv: list[str]) -> int:
    which, spec = argv[0], json.loads(argv[1])
    return child_main(lambda: CHILDREN[which](spec))


# -- the driver ---------------------------------------------------------------------------
def _child(which: str, spec: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    got = run_child("bench.stream", [which, json.dumps(spec)], f"stream {which}", timeout)
    if isinstance(got, str):
        raise RuntimeError(f"bench.stream {which}: {got}")  # noqa: TRY004 (a child failed)
    return dict(got)


def _pair(
    producer: tuple[str, dict[str, Any]], consumer: tuple[str, dict[str, Any]], r: Any
) -> Any:
    """Both children at once (the producer waits for the consumer's ready key, which
    says ABORT when the consumer failed)."""
    made: list[Any] = []

    def run() -> None:
        try:
            made.append(_child(*producer))
        except Exception as exc:  # noqa: BLE001 (raised below, in the driver's thread)
            made.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        got = _child(*consumer)
    except Exception:
        r.set(consumer[1]["ready_key"], ABORT)
        raise
    finally:
        thread.join(660)
    sent = made[0] if made else RuntimeError("the producer did not finish")
    if isinstance(sent, Exception):
        raise sent
    return sent, got


def _row(system: str, n: int, sz: Sizes, sent: dict[str, Any], got: dict[str, Any]) -> Any:
    events = max(got["received"], 1)
    cpu = got["cpu"]
    # The producer is not one of the meter's groups (it has exited by the time the row is
    # made): its own CPU count over its window, taken out of what "other" processes spent.
    spent = cpu["cpu_s"] | {"producer": sent["cpu_s"]}
    other = max(cpu["other_s"] - sent["cpu_s"], 0.0)
    return {
        "system": system,
        "runs": n,
        "rate": sz.stream_rate,
        "seconds": sz.stream_seconds,
        "put": sent["put"],
        "sent": sent["sent"],
        "producer_flushed": sent["flushed"],
        "all_received": got["received"] == sent["sent"] == sent["put"],
        "emitted_per_s": sent["put"] / sent["emit_s"] if sent["emit_s"] else None,
        "delivered_per_s": got["received"] / got["window_s"] if got["window_s"] else None,
        "cpu_ms_per_event": {k: 1000 * v / events for k, v in spent.items()}
        | {"other processes": 1000 * other / events, "idle": 1000 * cpu["idle_s"] / events},
        "machine_busy": 1 - cpu["idle_s"] / (cpu["wall_s"] * (cpu["cores"] or 1)),
        "hub_kicks_per_event": got["hub_kicks"] / events if got["hub_kicks"] is not None else None,
        **{k: v for k, v in got.items() if k != "cpu"},
        "cpu": cpu,
    }


def latency(
    sz: Sizes, redis_url: str, server: Any, base_url: str, token: str, client: Any
) -> list[dict[str, Any]]:
    from bench.procs import redis_pids

    rows = []
    r = _redis(redis_url)
    redis_pid = redis_pids(redis_url)
    each = max(1, round(sz.stream_rate * sz.stream_seconds))
    for n in sz.stream_runs:
        for system in ("cairn", "floor"):
            tag = uuid.uuid4().hex[:8]
            ready, sent_key = f"bench:stream:{tag}:ready", f"bench:stream:{tag}:sent"
            base = {
                "redis_url": redis_url,
                "rate": sz.stream_rate,
                "seconds": sz.stream_seconds,
                "seed": n,
                "ready_key": ready,
                "sent_key": sent_key,
                "each": each,
            }
            progress(
                f"stream latency {system}: {n} runs × {sz.stream_rate:g} tokens/s for "
                f"{sz.stream_seconds:g} s"
            )
            if system == "cairn":
                runs = [f"lat{n}-{tag}-{i:04d}" for i in range(n)]
                for run_id in runs:
                    client.store.create_run(run_id, "chat", {"prompt": "x"})
                pids = {"cairn serve": [server.pid], "redis": redis_pid}
                producer = ("produce", {**base, "runs": runs})
                consumer = (
                    "consume",
                    {**base, "runs": runs, "base_url": base_url, "token": token, "pids": pids},
                )
            else:
                pids = {"redis": redis_pid}
                producer = ("floor-produce", {**base, "n": n, "tag": tag})
                consumer = ("floor-consume", {**base, "n": n, "tag": tag, "pids": pids})
            try:
                sent, got = _pair(producer, consumer, r)
                rows.append(_row(system, n, sz, sent, got))
            except Exception as exc:  # noqa: BLE001 (the other measurements still run)
                rows.append({"system": system, "runs": n, "error": f"{exc}"})
            r.delete(ready, sent_key)
    r.close()
    return rows


def _batch(client: Any, flow: str, runs: int, words: str, worker: Any) -> tuple[float, list[str]]:
    """The worker's CPU seconds while it does `runs` runs of flow; their ids."""
    from bench.procs import cpu_seconds
    from cairn import RunStatus

    tag = uuid.uuid4().hex[:8]
    ids = [f"{flow}-{tag}-{i}" for i in range(runs)]
    before = cpu_seconds([worker.pid])
    for run_id in ids:
        client.enqueue(flow, {"reply": words}, run_id=run_id)
    deadline = time.monotonic() + 300
    left = set(ids)
    while left:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(left)} {flow} runs not done after 300 s")
        for run_id in list(left):
            run = client.get(run_id)
            if run is not None and run.status == RunStatus.DONE:
                left.discard(run_id)
            elif run is not None and run.status == RunStatus.FAILED:
                raise RuntimeError(f"{run_id} failed: {run.error}")
        time.sleep(0.05)
    return cpu_seconds([worker.pid]) - before, ids


def _tokens(redis_url: str, ids: list[str]) -> int:
    """The model's text deltas (one a word here) that reached these runs' streams, counted
    in the text of their token events: deltas that came while the run's last one was still
    queued share its event."""
    from bench.internals import keys

    r = _redis(redis_url)
    try:
        return sum(
            len(e["data"]["text"].split())
            for run_id in ids
            for _, fields in r.xrange(keys.events(run_id))
            if (e := json.loads(fields[b"e"]))["kind"] == "token"
        )
    finally:
        r.close()


def worker_cpu(dbs: Databases, redis_url: str, sz: Sizes) -> dict[str, Any]:
    """CPU of a threads worker per token event: streamed batches against plain ones."""
    from bench.internals import fleet, upgrade
    from bench.procs import worker_env
    from cairn import Client, Settings

    db_url = dbs.fresh("stream_cpu")
    upgrade(db_url)
    model, model_url = model_standin(LOGS / "model.log")
    words = " ".join(f"w{i}" for i in range(sz.stream_words))
    settings = Settings.from_env().with_options(
        database_url=db_url, redis_url=redis_url, broker_url=None
    )
    out: dict[str, Any] = {"runs": sz.stream_chat_runs, "words": sz.stream_words, "rows": []}
    try:
        with Client(settings=settings) as client:
            for label, extra in (("events on", {}), ("events off", {"CAIRN_EVENTS_MAXLEN": "0"})):
                env = worker_env(
                    db_url,
                    redis_url,
                    CAIRN_WORKFLOWS="bench.stream",
                    ANTHROPIC_BASE_URL=model_url,
                    **extra,
                )
                log = LOGS / f"worker-{label.replace(' ', '-')}.log"
                log.unlink(missing_ok=True)
                progress(f"stream cpu ({label}): a threads worker × {CONCURRENCY}")
                worker = fleet.start_worker(
                    env, log, f"stream-{label[-3:].strip()}", CONCURRENCY, wait=120, pool="threads"
                )
                try:
                    for flow in (PLAIN, STREAMED):  # warm-up: SDK, connections, pages
                        _batch(client, flow, CONCURRENCY, words, worker)
                    plain, streamed, tokens = [], [], 0
                    for rep in range(sz.stream_cpu_reps):
                        progress(
                            f"stream cpu ({label}) rep {rep + 1}/{sz.stream_cpu_reps}: "
                            f"{sz.stream_chat_runs} plain runs, {sz.stream_chat_runs} streamed"
                        )
                        plain.append(_batch(client, PLAIN, sz.stream_chat_runs, words, worker)[0])
                        cpu, ids = _batch(client, STREAMED, sz.stream_chat_runs, words, worker)
                        streamed.append(cpu)
                        if label == "events on":
                            tokens += _tokens(redis_url, ids)
                finally:
                    worker.kill()
                expected = sz.stream_words * sz.stream_chat_runs * sz.stream_cpu_reps
                per = sz.stream_words * sz.stream_chat_runs
                out["rows"].append(
                    {
                        "variant": label,
                        "plain_cpu_s": plain,
                        "streamed_cpu_s": streamed,
                        "plain_ms_per_run": 1000 * median(plain) / sz.stream_chat_runs,
                        "streamed_ms_per_run": 1000 * median(streamed) / sz.stream_chat_runs,
                        # paired: each rep's streamed batch over its own plain batch
                        "ms_per_token": 1000
                        * median([s - p for s, p in zip(streamed, plain, strict=True)])
                        / per,
                        "token_events": tokens if label == "events on" else None,
                        "token_events_expected": expected if label == "events on" else None,
                    }
                )
    finally:
        model.kill()
        dbs.drop(db_url)
    on, off = out["rows"]
    out["events_ms_per_token"] = on["ms_per_token"] - off["ms_per_token"]
    return out


def _memory(client: Any, sz: Sizes, base_url: str, token: str, server: Any) -> dict[str, Any]:
    idle_runs = [f"idle-{i:05d}" for i in range(sz.stream_idle)]
    warm = [f"warm-{i:02d}" for i in range(10)]
    for run_id in warm + idle_runs:
        client.store.create_run(run_id, "chat", {"prompt": "x"})
    progress(f"stream memory: {sz.stream_idle:,} idle open streams")
    spec = {"runs": idle_runs, "warm": warm, "base_url": base_url, "token": token}
    m = _child("idle", {**spec, "server_pid": server.pid})
    return m | {"kb_per_stream": 1024 * (m["rss_open_mb"] - m["rss_before_mb"]) / m["streams"]}


def section(dbs: Databases, redis_url: str, sz: Sizes) -> dict[str, Any]:
    """`python -m bench --only stream`: memory, latency against its floor, worker CPU.
    A part that fails leaves the others to run; the section then carries an `error`."""
    from bench.internals import admin, fleet, upgrade
    from bench.procs import worker_env
    from cairn import Client, Settings

    redis_url = redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    admin.RedisDatabase(redis_url).flush()
    LOGS.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {
        "rows": [],
        "target_p95_ms": TARGET_P95_MS,
        "target_runs": TARGET_RUNS,
        "rate": sz.stream_rate,
        "seconds": sz.stream_seconds,
        "keepalive_s": KEEPALIVE_S,
        "cores": os.cpu_count(),
    }
    errors: list[str] = []

    def part(name: str, work: Any) -> Any:
        try:
            return work()
        except Exception as exc:  # noqa: BLE001 (reported as the section's error)
            progress(f"stream {name} failed: {exc}")
            errors.append(f"{name}: {exc}")
            return None

    db_url = dbs.fresh("stream")
    upgrade(db_url)
    token = uuid.uuid4().hex
    port = fleet.free_port()
    env = worker_env(db_url, redis_url, CAIRN_API_TOKEN=token, CAIRN_SSE_KEEPALIVE=str(KEEPALIVE_S))
    settings = Settings.from_env().with_options(
        database_url=db_url, redis_url=redis_url, broker_url=None
    )
    (LOGS / "serve.log").unlink(missing_ok=True)
    progress("stream: starting cairn serve")
    server = fleet.start_server(env, LOGS / "serve.log", port)
    base_url = f"http://127.0.0.1:{port}"
    try:
        with Client(settings=settings) as client:
            out["memory"] = part("memory", lambda: _memory(client, sz, base_url, token, server))
            out["rows"] = latency(sz, redis_url, server, base_url, token, client)
    finally:
        server.kill()
        dbs.drop(db_url)
    out["cpu"] = part("worker cpu", lambda: worker_cpu(dbs, redis_url, sz))
    admin.RedisDatabase(redis_url).flush()
    by = {(r["system"], r["runs"]): r for r in out["rows"] if "error" not in r}
    out["ratios"] = [
        {
            "runs": n,
            "p50": by["cairn", n]["p50_ms"] / by["floor", n]["p50_ms"],
            "p95": by["cairn", n]["p95_ms"] / by["floor", n]["p95_ms"],
        }
        for n in sz.stream_runs
        if ("cairn", n) in by and ("floor", n) in by
    ]
    errors += [f"{r['system']} at {r['runs']}: {r['error']}" for r in out["rows"] if "error" in r]
    if errors:
        out["error"] = "; ".join(errors)
    return out


# -- report -------------------------------------------------------------------------------
def _measured(sec: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in sec.get("rows", []) if "error" not in r]


def targets(results: dict[str, Any], add: Any) -> None:
    """The p95 target at 100 runs, and every event delivered at every N."""
    sec = results.get("stream")
    if not isinstance(sec, dict):
        return
    rows = _measured(sec)
    for r in sec.get("rows", []):
        if r["system"] != "cairn":
            continue
        if "error" in r:
            add(f"stream: token events delivered at {r['runs']} runs", False, r["error"])
            continue
        floor = next((f for f in rows if f["system"] == "floor" and f["runs"] == r["runs"]), None)
        vs = f" (floor p95 {floor['p95_ms']:.1f} ms)" if floor else ""
        if r["runs"] == sec["target_runs"]:
            add(
                f"stream: token → SSE client p95 ≤ {sec['target_p95_ms']:g} ms at "
                f"{r['runs']} streaming runs",
                r["p95_ms"] <= sec["target_p95_ms"],
                f"p50 {r['p50_ms']:.1f}, p95 {r['p95_ms']:.1f}, p99 {r['p99_ms']:.1f} ms{vs}",
            )
        add(
            f"stream: every token event delivered, once, in order, at {r['runs']} runs",
            r["all_received"]
            and not r["out_of_order"]
            and not r["runs_over"]
            and not r.get("streams_ended"),
            _delivery(r),
        )


def _delivery(r: dict[str, Any]) -> str:
    text = (
        f"{r['received']:,} received of {r['sent']:,} sent ({r['put']:,} emitted); "
        f"{r['runs_short']} runs short, {r['runs_over']} over, {r['out_of_order']} out of order"
    )
    if r["other_events"].get("dropped"):
        text += f"; {r['other_events']['dropped']:,} `dropped` events (the outbox was full)"
    if not r["producer_flushed"]:
        text += "; the producer's outbox was not empty after 60 s"
    if r.get("streams_ended"):
        text += f"; {r['streams_ended']} streams ended early ({r['stream_errors'][0]})"
    return text


def render(results: dict[str, Any], c: Any) -> None:
    sec = results.get("stream")
    if not isinstance(sec, dict) or "rows" not in sec:
        return
    _render_latency(sec, c)
    if sec.get("cpu"):
        _render_cpu(sec["cpu"], c)
    m = sec.get("memory")
    if m:
        c.print(
            f"  cairn serve RSS: {m['rss_before_mb']:.1f} MB with no stream, "
            f"{m['rss_open_mb']:.1f} MB with {m['streams']:,} idle open streams = "
            f"{m['kb_per_stream']:.1f} KB a stream (opened in {m['open_s']:.1f} s)"
        )
    c.print(
        f"[dim]latency = receive time − the event's ts (time.time() at emit, same host); emit "
        "→ Redis = the entry id's ms (Redis's clock, 1 ms steps) − ts; p95 first s → last s: "
        "of the events emitted in the window's first and last second (a growing backlog); "
        "busy = the machine's non-idle share over the window; other processes = the rest of "
        f"the machine's CPU meanwhile (not this bench's); the server's keep-alive was "
        f"{sec['keepalive_s']} s so idle streams open at once (the endpoint answers with its "
        "first event); hub kicks = XADDs to the server's wake stream (each restarts its XREAD)[/]"
    )


def _render_latency(sec: dict[str, Any], c: Any) -> None:
    from rich.table import Table

    t = Table(
        title=f"9. Token streaming: emit → SSE client over loopback, {sec['rate']:g} tokens/s "
        f"a run for {sec['seconds']:g} s (jittered starts); cairn = Outbox → emit.lua → cairn "
        "serve (one shared XREAD) → httpx; floor = raw XADD → one blocking XREAD, "
        "same N and rate"
    )
    for col in (
        "system",
        "runs",
        "received / sent",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "max ms",
        "p95 first s → last s",
        "emit → Redis p50/p95",
        "events/s",
        "hub kicks/event",
    ):
        t.add_column(col, justify="left" if col == "system" else "right")
    for r in sec["rows"]:
        if "error" in r:
            t.add_row(r["system"], f"{r['runs']:,}", f"[red]failed: {r['error'][:200]}[/]")
            continue
        trend = r["p95_ms_by_second"]
        t.add_row(
            r["system"],
            f"{r['runs']:,}",
            f"{'' if r['all_received'] else '[red]'}{r['received']:,} / {r['sent']:,}",
            f"{r['p50_ms']:.1f}",
            f"{r['p95_ms']:.1f}",
            f"{r['p99_ms']:.1f}",
            f"{r['max_ms']:.0f}",
            f"{trend[0]:.0f} → {trend[-1]:.0f}" if trend else "–",
            f"{r['to_redis_p50_ms']:.1f} / {r['to_redis_p95_ms']:.1f}",
            f"{r['delivered_per_s']:,.0f}" if r["delivered_per_s"] else "–",
            f"{r['hub_kicks_per_event']:.2f}" if r["hub_kicks_per_event"] is not None else "–",
        )
    c.print(t)
    rows = _measured(sec)
    groups = list(dict.fromkeys(g for r in rows for g in r["cpu_ms_per_event"]))
    t = Table(
        title=f"Where the {sec['cores']} cores went over each window: CPU ms per event delivered"
    )
    for col in ("system", "runs", *groups, "machine busy"):
        t.add_column(col, justify="left" if col == "system" else "right")
    for r in rows:
        per = r["cpu_ms_per_event"]
        t.add_row(
            r["system"],
            f"{r['runs']:,}",
            *(f"{per[g]:.3f}" if g in per else "–" for g in groups),
            f"{r['machine_busy']:.0%}",
        )
    if rows:
        c.print(t)
    for q in sec.get("ratios", []):
        c.print(f"  cairn ÷ floor at {q['runs']:,} runs: p50 {q['p50']:.2f}×, p95 {q['p95']:.2f}×")
    for r in rows:
        if r["system"] == "cairn" and r["runs"] == sec["target_runs"]:
            mark = "[green]PASS[/]" if r["p95_ms"] <= sec["target_p95_ms"] else "[red]MISS[/]"
            c.print(
                f"  {mark} p95 {r['p95_ms']:.1f} ms at {r['runs']} runs "
                f"(target ≤ {sec['target_p95_ms']:g} ms)"
            )
    for r in rows:
        verdict = "all received" if r["all_received"] else "[red]MISSING EVENTS: a failure[/]"
        c.print(f"  {r['system']} at {r['runs']:,}: {verdict}; {_delivery(r)}")


def _render_cpu(cpu: dict[str, Any], c: Any) -> None:
    from rich.table import Table

    t = Table(
        title=f"Worker CPU per token event: a threads worker × {CONCURRENCY}, batches of "
        f"{cpu['runs']} one-step runs answered with {cpu['words']} words by the model stand-in "
        "(own process), streamed or not; worker process CPU, median of paired reps"
    )
    for col in ("worker", "plain ms/run", "streamed ms/run", "ms per token", "deltas delivered"):
        t.add_column(col, justify="left" if col == "worker" else "right")
    for r in cpu["rows"]:
        t.add_row(
            r["variant"],
            f"{r['plain_ms_per_run']:.2f}",
            f"{r['streamed_ms_per_run']:.2f}",
            f"{r['ms_per_token']:.4f}",
            f"{r['token_events']:,} of {r['token_events_expected']:,}"
            if r["token_events"] is not None
            else "–",
        )
    c.print(t)
    on, off = cpu["rows"]
    c.print(
        f"  CPU per token event (streamed − plain, events on): {on['ms_per_token'] * 1000:.0f} "
        f"µs; of it cairn's events {cpu['events_ms_per_token'] * 1000:.0f} µs, the SDK's "
        f"streaming {off['ms_per_token'] * 1000:.0f} µs"
    )


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
