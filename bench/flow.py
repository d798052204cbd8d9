"""Concurrency keys, the model rate limit and child runs: `python -m bench --only flow`.

One fleet (2 threads workers × 8, and beat) on one database does parts 1, 2 and 4; every
number is read from the step history (a run's start: its first step's started_at, the
worker's clock; its end: its last step's ended_at, Postgres's clock on the same host).

1. Keys. A burst: `runs` one-step runs over `keys` concurrency keys at limit 1 (10,000
   over 1,000), enqueued round-robin over the keys by 4 client threads, then `lone` new
   keys of one run each, all while the workers are paused (SIGSTOP, idle), so the fleet
   finds the whole backlog when it goes on (enqueued with the fleet running, the burst
   is drained as fast as it comes and nothing waits). Checked: no two runs of one key
   ever overlap (the most running at once per key, by a sweep over each key's runs).
   Measured: runs/s (resume → last end), the slot hand-off under load (a key's next
   run's start − its previous run's end) and each lone run's wait (resume → start):
   fairness, a lone key waits behind one run per busy key, not behind their backlogs.
   Baseline, same fleet, same run: the same runs and lone runs without keys (plain FIFO:
   a lone run waits behind the whole backlog).
2. The hand-off alone, on an idle fleet: one key's chain of `chain` runs enqueued while
   the workers are paused, each admitted when the previous stops (stop commit → the next
   run's message → claim → start). Floor: one plain run enqueued on the idle fleet → its
   start (a commit, a message, a claim: the least any hand-off does), one at a time.
3. The model rate limit: bench.ratelimit.run, `rpm` a minute across 4 processes against
   the Messages-API stand-in (which answers 429 past it): observed ÷ rpm, and its 429s.
4. Fan-out: a parent spawns `fanout` one-step children and waits, holding no worker.
   Measured: the last child's end → the parent's next step's start (against the floor of
   2), and the children's span (the spawning step's start → the last child's end) against
   the same runs enqueued by the client (4 threads; first enqueue → last end), paired.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import os
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg

from bench import ratelimit
from bench.common import ROOT, median, pct, progress
from bench.flows import FANOUT, KEYED
from bench.procs import CpuMeter, postgres_pids, redis_pids, worker_env

if TYPE_CHECKING:
    from bench.common import Databases
    from bench.sections import Sizes
    from cairn import Client

# Its own database: 1-12 and 17-44 are the test slots', 13-15 chaos', the demo's and the
# bench's, 40 stream's.
REDIS_DB = 46
LOGS = ROOT / ".cairn" / "bench-flow"
WORKERS, THREADS = 2, 8  # threads pool: many runs per process, as agents are run
ENQUEUERS = 4  # client threads (each its own Client): a burst of 10,000 takes seconds
FLOOR_GAP = 0.05  # seconds between the floor's runs: each finds the fleet idle
TIMEOUT = 600.0


@dataclasses.dataclass(frozen=True)
class FlowSizes:
    runs: int = 10_000
    keys: int = 1_000
    lone: int = 20
    chain: int = 101  # 100 hand-offs
    floor: int = 100
    fanout: int = 1_000
    fanout_reps: int = 5
    rpm: int = 600
    rate_seconds: float = 60.0  # a whole minute: its busiest 60 s is counted too


QUICK = FlowSizes(
    runs=1_000, keys=100, lone=10, chain=31, floor=30, fanout=200, fanout_reps=3, rate_seconds=10.0
)


def sizes(sz: Sizes) -> FlowSizes:
    """The flow sizes of `python -m bench` (QUICK with --quick)."""
    from bench import sections

    return QUICK if sz == sections.QUICK else FlowSizes()


# -- driving the fleet ------------------------------------------------------------------------
def _enqueue(clients: list[Client], items: list[tuple[str, str | None]], inp: Any = None) -> float:
    """Enqueue (run_id, key) items round-robin over the clients' threads, each thread in
    order (so the whole is near the list's order); seconds taken."""
    inp = inp or {}

    def one(client: Client, part: list[tuple[str, str | None]]) -> None:
        for run_id, key in part:
            client.enqueue(KEYED, inp, run_id=run_id, concurrency_key=key)

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(clients)) as pool:
        parts = [items[i :: len(clients)] for i in range(len(clients))]
        for f in [pool.submit(one, c, p) for c, p in zip(clients, parts, strict=True) if p]:
            f.result()
    return time.monotonic() - t0


def _stopped(db: psycopg.Connection[Any], pattern: str) -> tuple[int, int]:
    row = db.execute(
        "SELECT count(*) FILTER (WHERE status = 'done'), "
        "count(*) FILTER (WHERE status NOT IN ('done', 'pending', 'running', 'waiting', "
        "'queued')) FROM checkpoints WHERE run_id LIKE %s",
        (pattern,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _finish(db: psycopg.Connection[Any], pattern: str, total: int) -> tuple[int, int]:
    """(done, failed) once the `total` runs matching pattern have stopped."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        done, failed = _stopped(db, pattern)
        if done + failed >= total:
            return done, failed
        if time.monotonic() > deadline:
            raise TimeoutError(f"{total - done - failed} of {total} {pattern} runs not stopped")
        time.sleep(0.1)


def _spans(db: psycopg.Connection[Any], where: str, args: tuple[Any, ...]) -> list[Any]:
    """(run_id, key, created, start, end) of each run, epoch seconds."""
    return list(
        db.execute(
            "SELECT r.run_id, r.concurrency_key, extract(epoch FROM r.created_at)::float8, "
            "extract(epoch FROM min(h.started_at))::float8, "
            "extract(epoch FROM max(h.ended_at))::float8 "
            f"FROM runs r JOIN step_history h USING (run_id) WHERE {where} "
            "GROUP BY r.run_id",
            args,
        )
    )


def _per_key(spans: list[Any]) -> dict[str, Any]:
    """Each key's runs by start: the most running at once, overlapping pairs, and the
    hand-offs (next start − previous end) of runs already queued when the slot freed."""
    by: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for _, key, created, start, end in spans:
        by[key].append((start, end, created))
    most, overlaps, handoffs = 0, 0, []
    for runs in by.values():
        runs.sort()
        edges = sorted([(s, 1) for s, _, _ in runs] + [(e, -1) for _, e, _ in runs])
        now = 0
        for _, d in edges:  # at a tie the end (-1) sorts first: a hand-off is no overlap
            now += d
            most = max(most, now)
        for (_, prev_end, _), (start, _, created) in itertools.pairwise(runs):
            if start < prev_end:
                overlaps += 1
            elif created <= prev_end:
                handoffs.append(start - prev_end)
    return {"keys": len(by), "most_running": most, "overlaps": overlaps, "handoffs": handoffs}


def _ms(values: list[float], q: float) -> float | None:
    return 1000 * pct(values, q) if values else None


@contextlib.contextmanager
def _paused(workers: list[Any]) -> Iterator[list[float]]:
    """The workers stopped (SIGSTOP, idle: they hold no run and no lock) while a backlog is
    enqueued, so it is all there when they go on; yields [the time.time() they resumed]."""
    resumed: list[float] = []
    for w in workers:
        w.signal_all(signal.SIGSTOP)
    try:
        yield resumed
    finally:
        resumed.append(time.time())
        for w in workers:
            w.signal_all(signal.SIGCONT)


def backlog(
    clients: list[Client],
    workers: list[Any],
    db: psycopg.Connection[Any],
    fs: FlowSizes,
    keyed: bool,
    meter: CpuMeter,
) -> dict[str, Any]:
    """`runs` runs (over `keys` keys at limit 1, or none), then `lone` lone runs, all
    enqueued while the fleet is paused: a burst that finds the fleet busy. The fleet then
    drains it."""
    tag = "keyed" if keyed else "plain"
    items = [(f"{tag}-{i:05d}", f"key{i % fs.keys:04d}" if keyed else None) for i in range(fs.runs)]
    lone = [(f"lone-{tag}-{j:03d}", f"lone{j:03d}" if keyed else None) for j in range(fs.lone)]
    what = f"{fs.runs:,} runs over {fs.keys:,} keys at limit 1" if keyed else f"{fs.runs:,} runs"
    progress(f"flow keys: {what}, then {fs.lone} lone {'keys' if keyed else 'runs'}")
    with _paused(workers) as resumed:
        enqueue_s = _enqueue(clients, items)
        _enqueue(clients[:1], lone)  # one at a time, as a new user's run comes
    meter.start()
    done, failed = _finish(db, f"{tag}-%", fs.runs)
    lone_done, lone_failed = _finish(db, f"lone-{tag}-%", fs.lone)
    cpu = meter.stop()
    spans = _spans(db, "r.run_id LIKE %s", (f"{tag}-%",))
    lones = _spans(db, "r.run_id LIKE %s", (f"lone-{tag}-%",))
    last = max(s[4] for s in spans + lones)
    # A lone run waits from the fleet's resuming (it was enqueued before) to its start.
    waits = [start - max(created, resumed[0]) for _, _, created, start, _ in lones]
    last_lone = max(start for _, _, _, start, _ in lones)
    row: dict[str, Any] = {
        "system": "keys, limit 1" if keyed else "no keys (baseline)",
        "keyed": keyed,
        "runs": fs.runs,
        "keys": fs.keys if keyed else None,
        "done": done + lone_done,
        "failed": failed + lone_failed,
        "enqueue_s": enqueue_s,
        "enqueue_per_s": fs.runs / enqueue_s,
        "seconds": last - resumed[0],  # the fleet's drain of the burst
        "runs_per_s": (len(spans) + len(lones)) / (last - resumed[0]),
        # backlog runs started before the last lone run: what the lone runs waited behind
        "ahead_of_lone": sum(1 for s in spans if s[3] < last_lone),
        "lone": len(lones),
        "lone_wait_p50_s": median(waits),
        "lone_wait_max_s": max(waits),
        # where the cores went while the fleet drained the burst, per run
        "cpu": cpu,
        "cpu_ms_per_run": {k: 1000 * v / (done + lone_done) for k, v in cpu["cpu_s"].items()}
        | {"other processes": 1000 * cpu["other_s"] / (done + lone_done)},
    }
    if keyed:
        k = _per_key(spans)
        row |= {
            "keys_seen": k["keys"],
            "most_running_per_key": k["most_running"],
            "overlaps": k["overlaps"],
            "handoffs": len(k["handoffs"]),
            "handoff_p50_ms": _ms(k["handoffs"], 50),
            "handoff_p95_ms": _ms(k["handoffs"], 95),
            "handoff_max_ms": _ms(k["handoffs"], 100),
            # a freed slot's next run goes to the back of the broker's queue, behind one
            # run per busy key: about a cycle of the keys at the fleet's rate
            "key_cycle_s": fs.keys / row["runs_per_s"],
        }
    return row


def handoff(
    clients: list[Client], workers: list[Any], db: psycopg.Connection[Any], fs: FlowSizes
) -> dict[str, Any]:
    """One key's chain on the idle fleet, and its floor: single plain runs enqueue → start."""
    progress(f"flow hand-off: a chain of {fs.chain} runs of one key; {fs.floor} single runs")
    with _paused(workers):  # every run queued before the first starts: each a hand-off
        _enqueue(clients[:1], [(f"chain-{i:04d}", "chain") for i in range(fs.chain)])
    _finish(db, "chain-%", fs.chain)
    chain = _per_key(_spans(db, "r.run_id LIKE %s", ("chain-%",)))
    for i in range(fs.floor):
        clients[0].enqueue(KEYED, {}, run_id=f"floor-{i:04d}")
        time.sleep(FLOOR_GAP)
    _finish(db, "floor-%", fs.floor)
    floor = _spans(db, "r.run_id LIKE %s", ("floor-%",))
    starts = [start - created for _, _, created, start, _ in floor]
    out = {
        "chain": fs.chain,
        "handoffs": len(chain["handoffs"]),
        "overlaps": chain["overlaps"],
        "p50_ms": _ms(chain["handoffs"], 50),
        "p95_ms": _ms(chain["handoffs"], 95),
        "floor_runs": len(starts),
        "floor_p50_ms": _ms(starts, 50),
        "floor_p95_ms": _ms(starts, 95),
    }
    if out["p50_ms"] and out["floor_p50_ms"]:
        out["p50_vs_floor"] = out["p50_ms"] / out["floor_p50_ms"]
        out["p95_vs_floor"] = out["p95_ms"] / out["floor_p95_ms"]
    return out


def fanout(
    clients: list[Client], db: psycopg.Connection[Any], fs: FlowSizes, floor_ms: float | None
) -> dict[str, Any]:
    """Reps of: a parent spawning `fanout` children; the same runs enqueued by the client."""
    reps = []
    for rep in range(fs.fanout_reps):
        progress(f"flow fan-out {rep + 1}/{fs.fanout_reps}: {fs.fanout:,} children; baseline")
        parent = f"fan-{rep}"
        clients[0].enqueue(FANOUT, {"n": fs.fanout}, run_id=parent)
        _finish(db, parent, 1)
        row = db.execute(
            "SELECT extract(epoch FROM min(started_at) FILTER (WHERE cursor = 'spread'))::float8,"
            " extract(epoch FROM max(ended_at) FILTER (WHERE cursor = 'spread'))::float8,"
            " extract(epoch FROM min(started_at) FILTER (WHERE cursor = 'total'))::float8,"
            " (SELECT state->>'done' FROM checkpoints WHERE run_id = %s)"
            " FROM step_history WHERE run_id = %s",
            (parent, parent),
        ).fetchone()
        assert row is not None
        spread_start, spread_end, total_start, kids_done = row
        kids = _spans(db, "r.parent_id = %s", (parent,))
        last_end = max(k[4] for k in kids)
        _enqueue(clients, [(f"batch-{rep}-{i:05d}", None) for i in range(fs.fanout)])
        _finish(db, f"batch-{rep}-%", fs.fanout)
        plain = _spans(db, "r.run_id LIKE %s", (f"batch-{rep}-%",))
        reps.append(
            {
                "children_done": int(kids_done or 0),
                "spawn_step_ms": 1000 * (spread_end - spread_start),
                "first_child_after_ms": 1000 * (min(k[3] for k in kids) - spread_end),
                "children_span_s": last_end - spread_start,
                "handoff_ms": 1000 * (total_start - last_end),
                "enqueued_span_s": max(p[4] for p in plain) - min(p[2] for p in plain),
            }
        )
    handoffs = [r["handoff_ms"] for r in reps]
    ratios = [r["children_span_s"] / r["enqueued_span_s"] for r in reps]
    return {
        "children": fs.fanout,
        "reps": reps,
        "handoff_ms": median(handoffs),
        "handoff_max_ms": max(handoffs),
        "handoff_vs_floor": median(handoffs) / floor_ms if floor_ms else None,
        "children_span_s": median([r["children_span_s"] for r in reps]),
        "enqueued_span_s": median([r["enqueued_span_s"] for r in reps]),
        "span_vs_enqueued": median(ratios),  # paired: each rep's over its own baseline
        "all_done": all(r["children_done"] == fs.fanout for r in reps),
    }


def _fleet_parts(
    dbs: Databases, redis_url: str, fs: FlowSizes, out: dict[str, Any], part: Any
) -> None:
    from bench.internals import fleet, upgrade
    from cairn import Client, Settings

    db_url = dbs.fresh("flow")
    upgrade(db_url)
    env = worker_env(db_url, redis_url, CAIRN_DATABASE_POOL_SIZE=str(THREADS))
    settings = Settings.from_env().with_options(
        database_url=db_url, redis_url=redis_url, broker_url=None
    )
    LOGS.mkdir(parents=True, exist_ok=True)
    procs: list[fleet.Proc] = []  # the workers, then beat
    clients: list[Client] = []
    try:
        progress(f"flow: starting {WORKERS} workers × {THREADS} threads and beat")
        for i in range(WORKERS):
            (LOGS / f"worker-{i}.log").unlink(missing_ok=True)  # "ready." must be this run's
            procs.append(
                fleet.spawn_worker(
                    env, LOGS / f"worker-{i}.log", f"flow{i}", THREADS, pool="threads"
                )
            )
        for p in procs:
            fleet.wait_ready(p, 300)
        (LOGS / "beat.log").unlink(missing_ok=True)
        workers = list(procs)
        procs.append(fleet.start_beat(env, LOGS / "beat.log", LOGS / "beat-schedule"))
        clients = [Client(settings=settings, pool_size=1) for _ in range(ENQUEUERS)]
        with psycopg.connect(db_url, autocommit=True) as db:
            # Every thread's first run opens its connections: a few runs each first.
            _enqueue(clients, [(f"warm-{i:03d}", None) for i in range(4 * WORKERS * THREADS)])
            _finish(db, "warm-%", 4 * WORKERS * THREADS)
            out["handoff"] = part("hand-off", lambda: handoff(clients, workers, db, fs))
            pg, rd = postgres_pids(dbs.base), redis_pids(redis_url)
            meter = CpuMeter(
                {
                    "workers": (lambda: [w.pid for w in workers], True),
                    "postgres": (lambda: pg, True),
                    "redis": (lambda: rd, False),
                    "bench driver": (lambda: [os.getpid()], False),
                }
            )
            rows = []
            for keyed in (False, True):  # the baseline first: the keyed run finds no less warm
                row = part("keys", lambda k=keyed: backlog(clients, workers, db, fs, k, meter))
                if row:
                    rows.append(row)
            out["rows"] = rows
            floor = (out.get("handoff") or {}).get("floor_p50_ms")
            out["fanout"] = part("fan-out", lambda: fanout(clients, db, fs, floor))
    finally:
        for c in clients:
            c.close()
        for p in procs:
            p.kill()
        dbs.drop(db_url)


def section(dbs: Databases, redis_url: str, sz: Sizes) -> dict[str, Any]:
    """`python -m bench --only flow`: keys and fan-out on one fleet, then the rate limit.
    A part that fails leaves the others to run; the section then carries an `error`."""
    from bench.internals import admin

    fs = sizes(sz)
    redis_url = redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    admin.RedisDatabase(redis_url).flush()
    out: dict[str, Any] = {
        "rows": [],
        "workers": WORKERS,
        "threads": THREADS,
        "enqueuers": ENQUEUERS,
        "sizes": dataclasses.asdict(fs),
    }
    errors: list[str] = []

    def part(name: str, work: Any) -> Any:
        try:
            return work()
        except Exception as exc:  # noqa: BLE001 (reported as the section's error)
            progress(f"flow {name} failed: {type(exc).__name__}: {exc}")
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            return None

    part("fleet", lambda: _fleet_parts(dbs, redis_url, fs, out, part))
    rows = {r["keyed"]: r for r in out["rows"]}
    if True in rows and False in rows:
        k, p = rows[True], rows[False]
        out["ratios"] = {
            "runs_per_s": k["runs_per_s"] / p["runs_per_s"],
            "lone_wait_max": k["lone_wait_max_s"] / p["lone_wait_max_s"],
            "lone_wait_p50": k["lone_wait_p50_s"] / p["lone_wait_p50_s"],
        }
    # After the fleet is gone: the callers have the 2 cores to themselves.
    out["ratelimit"] = part(
        "rate limit",
        lambda: ratelimit.run(redis_url, rpm=fs.rpm, workers=4, seconds=fs.rate_seconds),
    )
    admin.RedisDatabase(redis_url).flush()
    if errors:
        out["error"] = "; ".join(errors)
    return out


# -- report -------------------------------------------------------------------------------
def targets(results: dict[str, Any], add: Any) -> None:
    """Never two runs of a key at once (limit 1); the rate limit's two targets; every
    child and run done."""
    sec = results.get("flow")
    if not isinstance(sec, dict):
        return
    for r in sec.get("rows", []):
        if r["keyed"]:
            add(
                f"flow: never more than 1 running per key ({r['runs']:,} runs over "
                f"{r['keys']:,} keys at limit 1, from the step history)",
                r["most_running_per_key"] == 1 and r["overlaps"] == 0 and r["failed"] == 0,
                f"most running at once in a key: {r['most_running_per_key']}; "
                f"{r['overlaps']} overlapping pairs; {r['done']:,} done, {r['failed']} failed",
            )
    rl = sec.get("ratelimit")
    if rl:
        add(
            f"flow: model rate limit of {rl['rpm']}/min across {rl['workers']} processes: "
            f"observed within {rl['target_ratio']:.0%} and 0 provider 429s",
            rl["ok"],
            f"{rl['observed_rpm']:,.1f}/min observed = {rl['ratio']:.3f}× the limit over "
            f"{rl['seconds']:g} s; {rl['standin_429']} 429s from the stand-in; busiest 60 s: "
            f"{_f(rl['max_in_60s'], '{:,}')}; {rl['deferred']:,} calls deferred by the limiter",
        )
    fo = sec.get("fanout")
    if fo:
        add(
            f"flow: fan-out of {fo['children']:,} children: every child done, the parent went on",
            fo["all_done"],
            f"last child's end → the parent's next step: median {fo['handoff_ms']:.0f} ms "
            f"over {len(fo['reps'])} fan-outs (max {fo['handoff_max_ms']:.0f} ms)",
        )


def _f(v: Any, fmt: str) -> str:
    return "–" if v is None else fmt.format(v)


def render(results: dict[str, Any], c: Any) -> None:
    from rich.table import Table

    sec = results.get("flow")
    if not isinstance(sec, dict) or "rows" not in sec:
        return
    rows = sec["rows"]
    if rows:
        t = Table(
            title=f"10. Concurrency keys: a burst of {rows[0]['runs']:,} one-step runs, then "
            f"{rows[0]['lone']} lone runs (a key of their own), enqueued by "
            f"{sec['enqueuers']} client threads while {sec['workers']} threads workers × "
            f"{sec['threads']} were paused; seconds = their resume → the last run's end; "
            "lone wait = resume → its start; hand-off = a key's next run's start − the "
            "previous one's end"
        )
        for col in (
            "system",
            "keys",
            "runs/s",
            "seconds",
            "enqueued/s",
            "most running / key",
            "overlaps",
            "hand-off p50 ms",
            "p95 ms",
            "lone wait p50 s",
            "max s",
            "backlog ahead",
        ):
            t.add_column(col, justify="left" if col == "system" else "right")
        for r in rows:
            t.add_row(
                r["system"],
                _f(r["keys"], "{:,}"),
                _f(r["runs_per_s"], "{:,.1f}"),
                _f(r["seconds"], "{:.1f}"),
                _f(r["enqueue_per_s"], "{:,.0f}"),
                _f(r.get("most_running_per_key"), "{}"),
                _f(r.get("overlaps"), "{}"),
                _f(r.get("handoff_p50_ms"), "{:,.0f}"),
                _f(r.get("handoff_p95_ms"), "{:,.0f}"),
                _f(r["lone_wait_p50_s"], "{:.2f}"),
                _f(r["lone_wait_max_s"], "{:.2f}"),
                _f(r["ahead_of_lone"], "{:,}"),
            )
        c.print(t)
        groups = list(dict.fromkeys(g for r in rows for g in r["cpu_ms_per_run"]))
        t = Table(
            title=f"   where the {rows[0]['cpu']['cores']} cores went in the drain: CPU ms a run "
            "(postgres: the whole server's)"
        )
        for col in ("system", *groups):
            t.add_column(col, justify="left" if col == "system" else "right")
        for r in rows:
            t.add_row(r["system"], *(_f(r["cpu_ms_per_run"].get(g), "{:.2f}") for g in groups))
        c.print(t)
        for r in rows:
            if r.get("key_cycle_s") is not None:
                c.print(
                    f"  under load a freed slot's next run queues behind one run per busy key: "
                    f"a cycle of the keys is {r['keys']:,} ÷ {r['runs_per_s']:,.0f} runs/s = "
                    f"{r['key_cycle_s']:.2f} s; hand-off p50 {r['handoff_p50_ms'] / 1000:.2f} s "
                    f"over {r['handoffs']:,} hand-offs"
                )
    q = sec.get("ratios")
    if q:
        c.print(
            f"  keys ÷ no keys: runs/s {q['runs_per_s']:.2f}×; a lone run's wait p50 "
            f"{q['lone_wait_p50']:.2f}×, max {q['lone_wait_max']:.2f}× (fairness: it queues "
            "behind one run per busy key, not behind the whole backlog)"
        )
    h = sec.get("handoff")
    if h:
        c.print(
            f"  slot hand-off on an idle fleet (one key, {h['handoffs']} hand-offs, "
            f"{h['overlaps']} overlaps): p50 {_f(h['p50_ms'], '{:.1f}')} ms, p95 "
            f"{_f(h['p95_ms'], '{:.1f}')} ms; floor, a plain run enqueue → start "
            f"({h['floor_runs']} runs): p50 {_f(h['floor_p50_ms'], '{:.1f}')} ms, p95 "
            f"{_f(h['floor_p95_ms'], '{:.1f}')} ms = {_f(h.get('p50_vs_floor'), '{:.2f}×')} / "
            f"{_f(h.get('p95_vs_floor'), '{:.2f}×')} the floor"
        )
    fo = sec.get("fanout")
    if fo:
        c.print(
            f"  fan-out of {fo['children']:,} children (median of {len(fo['reps'])}): last "
            f"child's end → the parent's next step {fo['handoff_ms']:.1f} ms = "
            f"{_f(fo['handoff_vs_floor'], '{:.2f}×')} the enqueue → start floor; children's "
            f"span {fo['children_span_s']:.2f} s vs {fo['enqueued_span_s']:.2f} s for the "
            f"same runs enqueued by the client = {fo['span_vs_enqueued']:.2f}× (paired); "
            "spawning step " + ", ".join(f"{r['spawn_step_ms']:.0f}" for r in fo["reps"]) + " ms"
        )
    rl = sec.get("ratelimit")
    if rl:
        c.print(
            f"  model rate limit {rl['rpm']}/min, {rl['workers']} processes × {rl['threads']} "
            f"threads, {rl['seconds']:g} s: {rl['observed_rpm']:,.1f}/min observed = "
            f"{rl['ratio']:.3f}× the limit (target within {rl['target_ratio']:.0%}); "
            f"{rl['standin_429']} 429s from the stand-in; {rl['requests']:,} answers"
        )
    c.print(
        "[dim]start = a run's first step's started_at (the worker's clock), end = its last "
        "step's ended_at (Postgres's clock, same host); backlog ahead = backlog runs that "
        "started before the last lone run did[/]"
    )
