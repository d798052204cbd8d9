"""`cairn chaos WORKFLOW`: real workers SIGKILLed at every step boundary; what broke?

It makes a fresh database (``chaos_<stamp>``, from the migrations, with a trigger that
records every checkpoint row version), flushes its Redis database (index 13 by default),
starts the mail and model stand-ins, K worker processes and the beat (reaper) process,
enqueues N runs of WORKFLOW and, while they work:

* the workers kill themselves at step boundaries chosen from ``--seed``
  (workers/faults.py: before the effect, after the effect before the checkpoint is
  saved, after the save). Same seed, same runs, same rate: same kill points, so a
  failing schedule can be replayed;
* this process kills from outside, at random (seeded) moments, a busy pool child or
  now and then a whole worker (parent and pool, which is then replaced).

At the end it reports, per step: attempts, sends to the mail API, deliveries, replays
the mail API deduplicated, deliveries per idempotency key and duplicates (deliveries of
one step visit by more than one attempt); and runs finished/failed/lost, resumes, kills
per boundary and the time from each kill to the run continuing under another owner
(p50/p95, for pool-child kills and whole-worker kills). Not OK (exit 1) if a run is not
done by the deadline, an effect was delivered twice, or a checkpoint went backwards.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import threading
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from workers import fleet
from workers.faults import BOUNDARIES, STEP_HEADER, read_journal

if TYPE_CHECKING:  # the rest is imported when chaos runs: `cairn --help` stays fast
    import redis

    from store import PgStore

CHAOS_REDIS_DB = 13
SENTINEL = "chaos:sentinel"
STATE = fleet.ROOT / ".cairn" / "chaos"

HISTORY_SQL = """
CREATE TABLE checkpoint_history (
    id      bigserial PRIMARY KEY,
    run_id  text NOT NULL,
    kind    text NOT NULL,  -- create | save | claim | status
    seq     bigint NOT NULL,
    epoch   bigint NOT NULL,
    cursor  text NOT NULL,
    status  text NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX checkpoint_history_run ON checkpoint_history (run_id, id);

CREATE FUNCTION chaos_record_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO checkpoint_history (run_id, kind, seq, epoch, cursor, status)
    VALUES (
        NEW.run_id,
        CASE
            WHEN TG_OP = 'INSERT' THEN 'create'
            WHEN (NEW.seq, NEW.cursor, NEW.state, NEW.visits, NEW.win_start, NEW.win_end,
                  NEW.status, NEW.error, NEW.updated_at)
                 IS NOT DISTINCT FROM
                 (OLD.seq, OLD.cursor, OLD.state, OLD.visits, OLD.win_start, OLD.win_end,
                  OLD.status, OLD.error, OLD.updated_at) THEN 'claim'
            WHEN (NEW.seq, NEW.cursor, NEW.state, NEW.visits)
                 IS NOT DISTINCT FROM (OLD.seq, OLD.cursor, OLD.state, OLD.visits) THEN 'status'
            ELSE 'save'
        END,
        NEW.seq, NEW.epoch, NEW.cursor, NEW.status);
    RETURN NULL;
END $$;

CREATE TRIGGER chaos_history AFTER INSERT OR UPDATE ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION chaos_record_checkpoint();
"""

DEFAULT_INPUTS: dict[str, dict[str, Any]] = {
    "invoice": {"customer": "customer-{i}", "email": "billing{i}@example.com"},
    "unkeyed": {"customer": "customer-{i}", "email": "billing{i}@example.com"},
}


# ---------------------------------------------------------------------------------------
# The mail stand-in, with every request attributed to a step attempt
# ---------------------------------------------------------------------------------------


def chaos_mail(**options: Any) -> Any:
    """A MailServer (not started) that also remembers, per request, the X-Cairn-Step
    header the faulted workers add (run, seq, cursor, attempt) and the Idempotency-Key:
    MailServer.messages() records neither the header nor the requests it deduplicated.
    (Defined here, not at import, so that `cairn --help` does not import the stand-ins.)"""
    from steps.standins import MailServer

    class ChaosMail(MailServer):
        def __init__(self, **options: Any) -> None:
            super().__init__(**options)
            self._events: list[dict[str, Any]] = []
            self._events_lock = threading.Lock()

        def events(self) -> list[dict[str, Any]]:
            with self._events_lock:
                return [dict(e) for e in self._events]

        def _send(self, headers: dict[str, str], raw: bytes) -> tuple[int, Any, dict[str, str]]:
            lower = {k.lower(): v for k, v in headers.items()}
            step = lower.get(STEP_HEADER.lower())
            key = (lower.get("idempotency-key") or "").strip() or None
            status, result, extra = super()._send(headers, raw)
            if status == 200 and isinstance(result, dict):
                with self._events_lock:
                    self._events.append(
                        {
                            "step": step,
                            "key": key,
                            "id": result.get("id"),
                            "delivered": not result.get("deduplicated"),
                        }
                    )
            return status, result, extra

    return ChaosMail(**options)


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------


def _with_path(url: str, path: str) -> str:
    return urllib.parse.urlsplit(url)._replace(path="/" + path).geturl()


def chaos_redis_url(url: str) -> str:
    return _with_path(url, str(CHAOS_REDIS_DB))


def _fill(value: Any, i: int) -> Any:
    """Replace "{i}" in every string of the input with the run's index."""
    if isinstance(value, str):
        return value.replace("{i}", str(i))
    if isinstance(value, list):
        return [_fill(v, i) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, i) for k, v in value.items()}
    return value


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil
    return round(ordered[int(rank) - 1], 3)


def _pid_of(token: bytes | str | None) -> int | None:
    if not token:
        return None
    text = token.decode() if isinstance(token, bytes) else token
    try:
        return int(text.split("|")[0].split(":")[1])
    except (IndexError, ValueError):
        return None


def create_database(base_url: str, name: str) -> str:
    """A fresh database next to base_url, migrated, with the checkpoint history trigger."""
    import psycopg

    from store import upgrade

    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = _with_path(base_url, name)
    upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(HISTORY_SQL)
    return url


def drop_database(base_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# ---------------------------------------------------------------------------------------
# Analysis (pure functions over what was recorded)
# ---------------------------------------------------------------------------------------


def check_history(rows: list[dict[str, Any]]) -> list[str]:
    """Rows of checkpoint_history ordered by id: where did a checkpoint go backwards?"""
    problems: list[str] = []
    last: dict[str, dict[str, Any]] = {}
    for row in rows:
        prev = last.get(row["run_id"])
        last[row["run_id"]] = row
        if prev is None:
            continue
        run = row["run_id"]
        if row["epoch"] < prev["epoch"]:
            problems.append(f"run {run}: epoch went back {prev['epoch']} -> {row['epoch']}")
        if row["seq"] < prev["seq"]:
            problems.append(f"run {run}: seq went back {prev['seq']} -> {row['seq']}")
        elif row["kind"] == "save" and row["seq"] <= prev["seq"]:
            problems.append(f"run {run}: a save did not advance seq ({row['seq']})")
        if prev["status"] == "done" and row["status"] != "done":
            problems.append(f"run {run}: a done run became {row['status']}")
    return problems


def recoveries(kills: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each (kill, run): seconds from the kill to the run's first checkpoint row
    written under a newer epoch (another owner), or why there is none."""
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_run[row["run_id"]].append(row)
    out = []
    for kill in kills:
        for run_id in kill.get("runs") or [kill["run_id"]]:
            history = by_run.get(run_id, [])
            before = [r for r in history if r["at"] <= kill["ts"]]
            after = [r for r in history if r["at"] > kill["ts"]]
            entry = {
                "kind": kill["kind"],
                "run_id": run_id,
                "seconds": None,
                "note": "",
                "at": kill.get("boundary") or "outside",
                "cursor": kill.get("cursor"),
            }
            if before and before[-1]["status"] in ("done", "failed"):
                entry["note"] = "run had already finished"
            else:
                epoch = max((r["epoch"] for r in before), default=0)
                nxt = next((r for r in after if r["epoch"] > epoch), None)
                if nxt is None:
                    entry["note"] = "never continued"
                else:
                    entry["seconds"] = round(nxt["at"] - kill["ts"], 3)
            out.append(entry)
    return out


def step_report(
    events: list[dict[str, Any]], attempts: dict[str, int], order: list[str]
) -> list[dict[str, Any]]:
    """Per step: attempts, sends, deliveries, dedupes, keys, duplicates.

    A delivery belongs to a step visit (run, seq, cursor), known from the X-Cairn-Step
    header (or, without it, from a cairn idempotency key). A duplicate is a delivery of a
    visit by an attempt other than the first one that delivered it: the customer got the
    effect twice.
    """
    steps: dict[str, dict[str, Any]] = {}

    def row(cursor: str) -> dict[str, Any]:
        return steps.setdefault(
            cursor,
            {
                "step": cursor,
                "attempts": attempts.get(cursor, 0),
                "sends": 0,
                "delivered": 0,
                "deduplicated": 0,
                "keyed": 0,
                "unkeyed": 0,
                "keys": 0,
                "max_per_key": 0,
                "visits": 0,
                "duplicates": 0,
            },
        )

    per_visit: dict[tuple[str, str], dict[Any, int]] = defaultdict(lambda: defaultdict(int))
    per_key: dict[tuple[str, str], int] = defaultdict(int)
    for e in events:
        run = cursor = visit = attempt = None
        if e.get("step"):
            parts = e["step"].split(" ")
            if len(parts) == 4:
                run, visit, cursor, attempt = parts[0], f"seq{parts[1]}", parts[2], parts[3]
        if cursor is None and e.get("key", "") and e["key"].startswith("cairn:"):
            parts = e["key"].split(":")
            if len(parts) >= 4:
                run, cursor, visit = parts[1], parts[2], f"visit{parts[3]}"
        if cursor is None:
            cursor, run, visit = "?", "?", e.get("id")
        r = row(cursor)
        r["sends"] += 1
        if not e["delivered"]:
            r["deduplicated"] += 1
            continue
        r["delivered"] += 1
        r["keyed" if e.get("key") else "unkeyed"] += 1
        if e.get("key"):
            per_key[(cursor, e["key"])] += 1
        per_visit[(cursor, f"{run}|{visit}")][attempt] += 1
    for (cursor, _), by_attempt in per_visit.items():
        r = row(cursor)
        r["visits"] += 1
        total = sum(by_attempt.values())
        if None in by_attempt:  # attempt unknown: any second delivery is a duplicate
            r["duplicates"] += total - 1
        else:
            first = min(by_attempt, key=lambda a: int(a))
            r["duplicates"] += total - by_attempt[first]
    for (cursor, _), n in per_key.items():
        r = row(cursor)
        r["keys"] += 1
        r["max_per_key"] = max(r["max_per_key"], n)
    for cursor in order:
        if attempts.get(cursor):
            row(cursor)
    rank = {c: i for i, c in enumerate(order)}
    return sorted(steps.values(), key=lambda s: rank.get(s["step"], len(rank)))


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------


def run_chaos(
    workflow: str,
    *,
    runs: int = 20,
    workers: int = 2,
    input: dict[str, Any] | None = None,
    seed: int | None = None,
    rate: float = 0.03,
    kills: list[tuple[str, int, str]] | None = None,
    random_kills: int | None = None,
    concurrency: int = 2,
    lease_ttl: float = 3.0,
    deadline: float = 300.0,
    pending_after: float | None = None,
    mail_delay_ms: int = 20,
    model_delay_ms: int = 5,
    database_url: str | None = None,
    redis_url: str | None = None,
    workflows: str = "",
    keep: bool = False,
    state_dir: Path | None = None,
    quiet: bool = False,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the chaos experiment and return its report (report["ok"] is the verdict)."""
    import psycopg
    import redis
    from celery import Celery
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from steps import registry
    from steps.standins import ModelServer
    from store import Database, PgStore

    err = Console(stderr=True, quiet=quiet)
    say = log or (lambda text: err.print(text))
    seed = random.SystemRandom().randrange(1, 10**6) if seed is None else seed
    modules = tuple(m.strip() for m in workflows.split(",") if m.strip())
    registry.import_modules(("steps.invoice", *modules))
    flow = registry.get(workflow)
    assert flow.first is not None, f"workflow {workflow!r} has no steps"
    template = input if input is not None else DEFAULT_INPUTS.get(workflow, {})
    inputs = [flow.validate(_fill(template, i)) for i in range(runs)]
    random_kills = max(2, runs // 25) if random_kills is None else random_kills
    # The reaper re-enqueues a pending run untouched this long (its message may have sat
    # with a worker killed whole). Shorter than the deadline, but not so short that runs
    # merely waiting in a long queue get a second message each.
    pending_after = max(60.0, deadline / 2) if pending_after is None else pending_after

    base_db = (
        database_url
        or os.environ.get("CAIRN_DATABASE_URL")
        or ("postgresql://postgres@127.0.0.1:54329/cairn")
    )
    redis_url = redis_url or chaos_redis_url(
        os.environ.get("CAIRN_REDIS_URL") or "redis://127.0.0.1:63790/0"
    )
    stamp = time.strftime("%Y%m%d_%H%M%S")
    db_name = f"chaos_{stamp}_{os.getpid()}"
    state = state_dir or STATE / db_name
    state.mkdir(parents=True, exist_ok=True)

    rclient = redis.Redis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=5)
    mail = model = db = app = None
    procs: list[fleet.Proc] = []
    db_url: str | None = None
    try:
        rclient.flushdb()
        rclient.set(SENTINEL, 1)  # gone mid-run: someone else flushed this Redis database
        db_url = create_database(base_db, db_name)
        mail = chaos_mail(delay_ms=mail_delay_ms).start()
        model = ModelServer(delay_ms=model_delay_ms).start()
        faults_dir = state / "faults"
        shutil.rmtree(faults_dir, ignore_errors=True)  # a reused state dir starts clean
        (faults_dir / "killed").mkdir(parents=True)
        plan = {
            "dir": str(faults_dir),
            "seed": seed,
            "rate": rate,
            "kills": [list(k) for k in (kills or [])],
            "spare_pid": os.getpid(),
        }
        plan_path = state / "faults.json"
        plan_path.write_text(json.dumps(plan))
        env = fleet.child_env(
            CAIRN_FAULTS=str(plan_path),
            CAIRN_DATABASE_URL=db_url,
            CAIRN_REDIS_URL=redis_url,
            CAIRN_MAIL_URL=mail.url,
            ANTHROPIC_BASE_URL=model.url,
            CAIRN_LEASE_TTL=str(lease_ttl),
            CAIRN_REAPER_INTERVAL=str(min(1.0, lease_ttl / 3)),
            CAIRN_DEFER_SECONDS=str(min(1.0, lease_ttl / 4)),
            CAIRN_PENDING_AFTER=str(pending_after),
            CAIRN_WORKFLOWS=",".join(modules),
            CAIRN_STORE_GIVE_UP_AFTER="20",
        )
        env.pop("CAIRN_BROKER_URL", None)
        env.pop("ANTHROPIC_API_KEY", None)

        say(
            f"[bold]chaos[/]: {runs} {workflow} runs, {workers} workers x {concurrency}, "
            f"seed {seed}, rate {rate}, lease TTL {lease_ttl:g}s, database {db_name}"
        )
        numbers = itertools.count(workers)  # replacements are chaos<K>, chaos<K+1>, ...
        problems_starting: list[str] = []

        def start(name: str) -> fleet.Proc:
            return fleet.start_worker(env, state / f"{name}.log", name, concurrency, wait=90)

        def replace() -> None:
            try:
                procs.append(start(f"chaos{next(numbers)}"))
            except Exception as exc:  # noqa: BLE001 (reported, and the run goes on)
                problems_starting.append(f"a replacement worker did not start: {exc}")

        started: list[Any] = [None] * workers

        def start_into(i: int) -> None:
            try:
                started[i] = start(f"chaos{i}")
            except Exception as exc:  # noqa: BLE001 (re-raised below)
                started[i] = exc

        threads = [threading.Thread(target=start_into, args=(i,)) for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        procs.extend(p for p in started if isinstance(p, fleet.Proc))
        failed_start = [p for p in started if not isinstance(p, fleet.Proc)]
        if failed_start:
            raise RuntimeError(f"a worker did not start: {failed_start[0]}")
        procs.append(fleet.start_beat(env, state / "beat.log", state / "beat-schedule"))

        db = Database(db_url)
        store = PgStore(db)
        app = Celery("cairn-chaos", broker=redis_url)
        app.conf.broker_transport_options = {"visibility_timeout": 3600.0}
        ids = [f"chaos-{seed}-{i:04d}" for i in range(runs)]
        started_at = time.monotonic()
        for run_id, data in zip(ids, inputs, strict=True):
            store.create_run(run_id, workflow, data, flow.first)
            app.send_task("cairn.run", args=[run_id])

        rng = random.Random(seed)
        whole = (
            set(rng.sample(range(random_kills), max(1, random_kills // 4)))
            if (random_kills >= 2)
            else set()
        )
        outside: list[dict[str, Any]] = []
        replacing: list[threading.Thread] = []
        next_kill = time.monotonic() + rng.uniform(1.0, 3.0)
        counts: dict[str, int] = {}
        flushed = False
        depths: list[int] = []
        with Progress(
            TextColumn("[bold]runs"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=err,
            disable=quiet,
        ) as progress:
            bar = progress.add_task("", total=runs)
            end = time.monotonic() + deadline
            while time.monotonic() < end:
                counts = {s: int(r["n"]) for s, r in store.counts().items()}
                depths.append(int(rclient.llen("celery")))  # Celery's default queue
                finished = counts.get("done", 0) + counts.get("failed", 0)
                progress.update(
                    bar,
                    completed=finished,
                    description=f"running {counts.get('running', 0)} · kills "
                    f"{len(os.listdir(faults_dir / 'killed')) + len(outside)}",
                )
                if not flushed and not rclient.exists(SENTINEL):
                    flushed = True
                    say(
                        f"[yellow]warning[/]: the Redis database {redis_url} was flushed by "
                        "another process during the run (queued messages and leases lost)"
                    )
                if finished >= runs:
                    break
                if len(outside) < random_kills and time.monotonic() >= next_kill:
                    as_whole = len(outside) in whole and not any(t.is_alive() for t in replacing)
                    kill = _kill_from_outside(store, rclient, procs, as_whole, rng)
                    if kill is not None:
                        outside.append(kill)
                        next_kill = time.monotonic() + rng.uniform(1.0, 4.0)
                        if kill["kind"] == "whole_worker":
                            say(
                                f"[red]SIGKILL[/] whole worker {kill['worker']} "
                                f"({len(kill['runs'])} runs); starting a replacement"
                            )
                            t = threading.Thread(target=replace, daemon=True)
                            t.start()
                            replacing.append(t)
                time.sleep(0.1)
        elapsed = time.monotonic() - started_at
        for t in replacing:
            t.join(timeout=90)

        # -- collect -----------------------------------------------------------------
        with db.connection() as conn:
            history = conn.execute(
                "SELECT id, run_id, kind, seq, epoch, cursor, status,"
                " extract(epoch FROM at)::float8 AS at FROM checkpoint_history ORDER BY id"
            ).fetchall()
            final = conn.execute(
                "SELECT run_id, status, cursor, seq, resumes, error FROM checkpoints"
            ).fetchall()
        journal = read_journal(str(faults_dir))
        inside = [r for r in journal if r["e"] == "kill"]
        attempts: dict[str, int] = defaultdict(int)
        for r in journal:
            if r["e"] == "attempt":
                attempts[r["cursor"]] += 1
        events = mail.events()
        all_kills = inside + outside
        return _report(
            workflow=workflow,
            flow_steps=list(flow.steps),
            runs=runs,
            workers=workers,
            concurrency=concurrency,
            seed=seed,
            rate=rate,
            lease_ttl=lease_ttl,
            deadline=deadline,
            elapsed=elapsed,
            final=final,
            history=history,
            kills=all_kills,
            attempts=attempts,
            events=events,
            database=db_name,
            kept=keep,
            state=state,
            random_kills=random_kills,
            extra_args=_extra_args(input, modules, concurrency, kills),
            queue_depths=depths,
            warnings=problems_starting
            + (
                [f"the Redis database {redis_url} was flushed by another process"]
                if flushed
                else []
            ),
        )
    finally:
        for p in procs:
            p.kill()
        for server in (mail, model):
            if server is not None:
                server.stop()
        if db is not None:
            db.close()
        if app is not None:
            app.close()
        rclient.close()
        if db_url is not None and not keep:
            try:
                drop_database(base_db, db_name)
            except psycopg.Error as exc:  # pragma: no cover
                say(f"could not drop {db_name}: {exc}")


def _extra_args(
    input: dict[str, Any] | None,
    modules: tuple[str, ...],
    concurrency: int,
    kills: list[tuple[str, int, str]] | None,
) -> str:
    import shlex

    args = []
    if input is not None:
        args += ["--input", json.dumps(input)]
    if modules:
        args += ["--workflows", ",".join(modules)]
    if concurrency != 2:
        args += ["--concurrency", str(concurrency)]
    for run_id, seq, boundary in kills or []:
        args += ["--kill", f"{run_id}:{seq}:{boundary}"]
    return "".join(" " + shlex.quote(a) for a in args)


def _kill_from_outside(
    store: PgStore,
    rclient: redis.Redis,
    procs: list[fleet.Proc],
    whole: bool,
    rng: random.Random,
) -> dict[str, Any] | None:
    """SIGKILL a random busy pool child (or the whole worker holding it)."""
    import signal

    from store import keys

    running = [r for r in store.list_runs("running", limit=100_000)]
    if not running:
        return None
    tokens = rclient.mget([keys.lease(r["run_id"]) for r in running])
    held: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r, token in zip(running, tokens, strict=True):
        pid = _pid_of(token)
        if pid is not None:
            held[pid].append(r)
    owners = {pid: p for p in procs if p.alive() and p.name != "beat" for pid in p.children()}
    busy = sorted(pid for pid in held if pid in owners)
    if not busy:
        return None
    pid = rng.choice(busy)
    now = time.time()
    if whole:
        proc = owners[pid]
        victims = [r for child in proc.children() for r in held.get(child, [])]
        proc.kill()
        return {
            "kind": "whole_worker",
            "worker": proc.name,
            "pid": proc.pid,
            "ts": now,
            "run_id": victims[0]["run_id"] if victims else None,
            "runs": [r["run_id"] for r in victims],
            "cursor": ",".join(r["cursor"] for r in victims),
        }
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    row = held[pid][0]
    return {
        "kind": "pool_child",
        "pid": pid,
        "ts": now,
        "run_id": row["run_id"],
        "cursor": row["cursor"],
        "seq": row["seq"],
    }


def _report(
    *,
    workflow: str,
    flow_steps: list[str],
    runs: int,
    workers: int,
    concurrency: int,
    seed: int,
    rate: float,
    lease_ttl: float,
    deadline: float,
    elapsed: float,
    final: list[dict[str, Any]],
    history: list[dict[str, Any]],
    kills: list[dict[str, Any]],
    attempts: dict[str, int],
    events: list[dict[str, Any]],
    database: str,
    kept: bool,
    state: Path,
    random_kills: int,
    extra_args: str = "",
    warnings: list[str] | None = None,
    queue_depths: list[int] | None = None,
) -> dict[str, Any]:
    done = [r for r in final if r["status"] == "done"]
    failed = [r for r in final if r["status"] == "failed"]
    lost = [r for r in final if r["status"] not in ("done", "failed")]
    per_boundary = {b: sum(1 for k in kills if k.get("boundary") == b) for b in BOUNDARIES}
    per_boundary["random_pool_child"] = sum(1 for k in kills if k["kind"] == "pool_child")
    per_boundary["whole_worker"] = sum(1 for k in kills if k["kind"] == "whole_worker")
    rec = recoveries([k for k in kills if k.get("run_id") or k.get("runs")], history)
    child = [e["seconds"] for e in rec if e["kind"] != "whole_worker" and e["seconds"] is not None]
    whole = [e["seconds"] for e in rec if e["kind"] == "whole_worker" and e["seconds"] is not None]
    backwards = check_history(history)
    steps = step_report(events, attempts, flow_steps)
    problems: list[str] = []
    if lost:
        problems.append(
            f"{len(lost)} run(s) lost: not finished within {deadline:g}s "
            f"(e.g. {lost[0]['run_id']} at {lost[0]['cursor']})"
        )
    if failed:
        problems.append(
            f"{len(failed)} run(s) failed (e.g. {failed[0]['run_id']}: "
            f"{(failed[0]['error'] or '')[:200]})"
        )
    for s in steps:
        if s["duplicates"]:
            how = "without an idempotency key" if s["unkeyed"] else "with idempotency keys"
            problems.append(
                f"step {s['step']!r} delivered {s['duplicates']} duplicate effect(s) ({how})"
            )
    problems.extend(backwards[:20])
    if len(backwards) > 20:
        problems.append(f"... and {len(backwards) - 20} more history violations")
    replay = (
        f"cairn chaos {workflow} --runs {runs} --workers {workers} --seed {seed} "
        f"--rate {rate:g} --lease-ttl {lease_ttl:g}" + extra_args
    )
    return {
        "ok": not problems,
        "problems": problems,
        "warnings": warnings or [],
        "workflow": workflow,
        "seed": seed,
        "rate": rate,
        "replay": replay,
        "runs": runs,
        "workers": workers,
        "concurrency": concurrency,
        "lease_ttl": lease_ttl,
        "seconds": round(elapsed, 1),
        "runs_finished": len(done),
        "runs_failed": len(failed),
        "runs_lost": len(lost),
        "runs_resumed": sum(1 for r in final if r["resumes"] > 0),
        "resumes": sum(r["resumes"] for r in final),
        "kills": per_boundary,
        "kills_total": len(kills),
        "random_kills_planned": random_kills,
        "recovery": {
            "pool_child": {
                "n": len(child),
                "p50": percentile(child, 50),
                "p95": percentile(child, 95),
                "max": percentile(child, 100),
            },
            "whole_worker": {
                "n": len(whole),
                "p50": percentile(whole, 50),
                "p95": percentile(whole, 95),
                "max": percentile(whole, 100),
            },
            "after_run_finished": sum(1 for e in rec if e["note"] == "run had already finished"),
            "never_continued": sum(1 for e in rec if e["note"] == "never continued"),
            "slowest": sorted(
                (e for e in rec if e["seconds"] is not None), key=lambda e: -e["seconds"]
            )[:3],
        },
        "queue_depth": {
            "p50": percentile([float(d) for d in queue_depths or []], 50),
            "max": max(queue_depths or [0]),
        },
        "steps": steps,
        "duplicates": sum(s["duplicates"] for s in steps),
        "history_rows": len(history),
        "history_violations": len(backwards),
        "kill_log": kills,
        "database": database + (" (kept)" if kept else " (dropped)"),
        "logs": str(state),
    }


def print_report(report: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    out = console or Console()
    steps = Table(title=f"cairn chaos {report['workflow']}: per step")
    for col in ("step", "tries", "sends", "sent", "dedup", "keys", "max/key", "no key", "dups"):
        steps.add_column(col, justify="left" if col == "step" else "right", no_wrap=True)
    for s in report["steps"]:
        dup = str(s["duplicates"])
        steps.add_row(
            s["step"],
            str(s["attempts"]),
            str(s["sends"]),
            str(s["delivered"]),
            str(s["deduplicated"]),
            str(s["keys"]),
            str(s["max_per_key"]),
            str(s["unkeyed"]),
            f"[bold red]{dup}[/]" if s["duplicates"] else dup,
        )
    out.print(steps)
    k, rec = report["kills"], report["recovery"]

    def pct(d: dict[str, Any]) -> str:
        if not d["n"]:
            return "n/a"
        return f"p50 {d['p50']:.2f}s · p95 {d['p95']:.2f}s · max {d['max']:.2f}s (n={d['n']})"

    summary = Table(show_header=False, title="summary")
    for label, value in (
        (
            "runs finished / failed / lost",
            f"{report['runs_finished']} / {report['runs_failed']} / {report['runs_lost']}"
            + f" of {report['runs']}",
        ),
        ("runs resumed (resumes)", f"{report['runs_resumed']} ({report['resumes']})"),
        (
            "kills at before_effect / after_effect / after_save",
            f"{k['before_effect']} / {k['after_effect']} / {k['after_save']}",
        ),
        (
            "random kills: pool child / whole worker",
            f"{k['random_pool_child']} / {k['whole_worker']}",
        ),
        ("recovery after a pool-child kill", pct(rec["pool_child"])),
        ("recovery after a whole-worker kill", pct(rec["whole_worker"])),
        (
            "slowest recoveries",
            "; ".join(
                f"{e['seconds']:.1f}s {e['run_id']} ("
                + (
                    f"{e['kind'].replace('_', ' ')} killed during {e['cursor']}"
                    if e["at"] == "outside"
                    else f"killed at {e['at']} of {e['cursor']}"
                )
                + ")"
                for e in rec.get("slowest", [])
            )
            or "n/a",
        ),
        (
            "broker queue depth while running",
            f"p50 {report['queue_depth']['p50']} · max {report['queue_depth']['max']}",
        ),
        ("duplicate deliveries", str(report["duplicates"])),
        (
            "checkpoint history rows / violations",
            f"{report['history_rows']} / {report['history_violations']}",
        ),
        ("lease TTL", f"{report['lease_ttl']:g}s"),
        ("workers x processes", f"{report['workers']} x {report['concurrency']}"),
        ("seconds", str(report["seconds"])),
        ("replay", report["replay"]),
    ):
        summary.add_row(label, value)
    out.print(summary)
    for w in report.get("warnings", []):
        out.print(f"[yellow]warning[/]: {w}")
    if report["ok"]:
        out.print(
            "[bold green]OK[/]: every run finished, no effect delivered twice, "
            "no checkpoint went backwards"
        )
    else:
        out.print("[bold red]FAILED[/]:")
        for p in report["problems"]:
            out.print(f"  - {p}")


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------


def _parse_kill(text: str) -> tuple[str, int, str]:
    run_id, _, rest = text.rpartition(":")
    run_id, _, seq = run_id.rpartition(":")
    if not run_id or not seq.isdigit() or rest not in BOUNDARIES:
        raise ValueError(f"--kill wants RUN_ID:SEQ:BOUNDARY with BOUNDARY in {BOUNDARIES}")
    return run_id, int(seq), rest


def register(app: typer.Typer) -> None:
    """Add the `chaos` command to the cairn Typer app."""

    @app.command("chaos")
    def chaos(
        workflow: Annotated[str, typer.Argument(help="Registered workflow name, e.g. invoice.")],
        runs: Annotated[int, typer.Option("--runs", help="Runs to enqueue.")] = 20,
        workers: Annotated[int, typer.Option("--workers", help="Worker processes to start.")] = 2,
        input: Annotated[
            str | None,
            typer.Option(
                "--input",
                help='Each run\'s input as a JSON object; "{i}" in a string becomes the '
                "run's index. Default for invoice: a customer and email per run.",
            ),
        ] = None,
        seed: Annotated[
            int | None,
            typer.Option(
                "--seed", help="Seed of the kill schedule (random if unset; printed for replay)."
            ),
        ] = None,
        rate: Annotated[
            float,
            typer.Option(
                "--rate", help="Probability that a given step boundary of a run is killed."
            ),
        ] = 0.03,
        kill: Annotated[
            list[str] | None,
            typer.Option("--kill", help="Also kill at RUN_ID:SEQ:BOUNDARY (repeatable)."),
        ] = None,
        random_kills: Annotated[
            int | None,
            typer.Option(
                "--random-kills",
                help="Kills from outside (a busy pool child; every 4th or so a "
                "whole worker). Default: runs/25, at least 2.",
            ),
        ] = None,
        concurrency: Annotated[
            int, typer.Option("--concurrency", help="Pool processes per worker.")
        ] = 2,
        lease_ttl: Annotated[
            float,
            typer.Option(
                "--lease-ttl",
                help="CAIRN_LEASE_TTL for the workers (shorter than the usual 10s "
                "so recovery is quick).",
            ),
        ] = 3.0,
        deadline: Annotated[
            float,
            typer.Option(
                "--deadline", help="Seconds after which an unfinished run counts as lost."
            ),
        ] = 300.0,
        keep: Annotated[
            bool, typer.Option("--keep", help="Keep the chaos_* database for inspection.")
        ] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
        database_url: Annotated[
            str,
            typer.Option(
                "--database-url",
                envvar="CAIRN_DATABASE_URL",
                help="Postgres server to create the fresh chaos_* database on.",
            ),
        ] = ("postgresql://postgres@127.0.0.1:54329/cairn"),
        redis_url: Annotated[
            str | None,
            typer.Option(
                "--redis-url",
                help="Redis database for broker and leases; FLUSHED at start. "
                f"Default: CAIRN_REDIS_URL's server, database {CHAOS_REDIS_DB}.",
            ),
        ] = None,
        workflows: Annotated[
            str,
            typer.Option(
                "--workflows",
                envvar="CAIRN_WORKFLOWS",
                help="Comma-separated modules to import so their workflows register.",
            ),
        ] = "",
    ) -> None:
        """Kill workers at every step boundary while N runs work; report what broke."""
        from store import CairnError

        try:
            data = None if input is None else json.loads(input)
            points = [_parse_kill(k) for k in kill or []]
        except (json.JSONDecodeError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        try:
            report = run_chaos(
                workflow,
                runs=runs,
                workers=workers,
                input=data,
                seed=seed,
                rate=rate,
                kills=points,
                random_kills=random_kills,
                concurrency=concurrency,
                lease_ttl=lease_ttl,
                deadline=deadline,
                keep=keep,
                database_url=database_url,
                redis_url=redis_url,
                workflows=workflows,
                quiet=as_json,
            )
        except CairnError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        if as_json:
            print(json.dumps(report, default=str))
        else:
            print_report(report)
        if not report["ok"]:
            raise typer.Exit(1)


def main() -> None:
    """`python -m workers.chaos ...` until the lead wires `cairn chaos` into workers/cli.py."""
    app = typer.Typer(add_completion=False)
    register(app)

    @app.callback()
    def _root() -> None:  # keeps `chaos` a subcommand
        pass

    app()


if __name__ == "__main__":
    main()
