"""Shared plumbing: scratch databases, WAL accounting, payloads, progress lines."""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

from cairn import Settings

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = (
    "per_step",
    "growth",
    "recovery",
    "fleet",
    "per_run",
    "waiting",
    "million",
    "pydantic_ai",
    "stream",
    "flow",
    "providers",
    "fanout",
    "latency",
    "db_cost",
    "waits",
    "sleep",
    "backlog",
)
BENCH_REDIS_DB = 15
INSTALL_HINT = "not installed: pip install -e '.[bench]'"


def base_db() -> str:
    return Settings.from_env().database_url


def bench_redis() -> str:
    base = Settings.from_env().redis_url
    return base.rsplit("/", 1)[0] + f"/{BENCH_REDIS_DB}"


def bench_amqp() -> str:
    """The RabbitMQ vhost the recovery section also measures on: CAIRN_BENCH_AMQP_URL, or
    scripts/services.sh's server (CAIRN_RABBITMQ_PORT) and its vhost cairn-15."""
    port = os.environ.get("CAIRN_RABBITMQ_PORT", "5672")
    return os.environ.get("CAIRN_BENCH_AMQP_URL") or f"amqp://guest:guest@127.0.0.1:{port}/cairn-15"


def with_db(url: str, name: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + name


_t0 = time.monotonic()
_quiet = False


def set_quiet(quiet: bool) -> None:
    global _quiet
    _quiet = quiet


def progress(msg: str) -> None:
    if not _quiet:
        print(f"[bench {time.monotonic() - _t0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# -- scratch databases ---------------------------------------------------------------------
class Databases:
    """Fresh bench_* databases; every one made here is dropped by close()."""

    def __init__(self, base: str | None = None) -> None:
        self.base = base or base_db()
        self.made: list[str] = []
        self.tag = f"{os.getpid()}_{uuid.uuid4().hex[:6]}"

    def fresh(self, label: str) -> str:
        name = f"bench_{label}_{self.tag}_{len(self.made)}".lower()
        with psycopg.connect(self.base, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {name}")
        self.made.append(name)
        return with_db(self.base, name)

    def drop(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.base, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if name in self.made:
            self.made.remove(name)

    def close(self) -> None:
        for name in list(self.made):
            with contextlib.suppress(Exception):
                self.drop(with_db(self.base, name))


# -- WAL -----------------------------------------------------------------------------------
class Wal:
    """pg_current_wal_lsn() around a block; the difference is the cluster's WAL bytes.

    The counter is cluster-wide: anything else writing to this Postgres meanwhile is
    counted too, so callers take the minimum over repetitions.
    """

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)

    def lsn(self) -> str:
        row = self.conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        return str(row[0])

    def diff(self, start: str, end: str) -> int:
        row = self.conn.execute(
            "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (end, start)
        ).fetchone()
        assert row is not None
        return int(row[0])

    def close(self) -> None:
        self.conn.close()


def measure(url: str, fn: Callable[[], Any]) -> tuple[float, int, Any]:
    """(seconds, WAL bytes, fn's result) of one call."""
    wal = Wal(url)
    try:
        start = wal.lsn()
        t0 = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - t0
        end = wal.lsn()
        return elapsed, wal.diff(start, end), result
    finally:
        wal.close()


# -- payloads ------------------------------------------------------------------------------
def text(nbytes: int, seed: int) -> str:
    """Incompressible ASCII (base64 of random bytes), so pglz/TOAST cannot hide bytes."""
    rnd = random.Random(seed)
    raw = rnd.randbytes((nbytes * 3) // 4 + 3)
    return base64.b64encode(raw).decode()[:nbytes]


def message(nbytes: int, seed: int) -> dict[str, Any]:
    """One model message whose JSON is about nbytes long."""
    role = "user" if seed % 2 == 0 else "assistant"
    overhead = len(json.dumps({"role": role, "content": ""}))
    return {"role": role, "content": text(max(nbytes - overhead, 1), seed)}


def window(total_bytes: int, msg_bytes: int = 1024) -> list[dict[str, Any]]:
    count = max(1, total_bytes // msg_bytes)
    return [message(msg_bytes, i) for i in range(count)]


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return float(ordered[k])


@contextlib.contextmanager
def timed(label: str) -> Iterator[None]:
    t0 = time.monotonic()
    progress(f"{label} …")
    yield
    progress(f"{label} done in {time.monotonic() - t0:.1f}s")


def missing_module(modules: tuple[str, ...]) -> str | None:
    """The first of modules that cannot be imported, or None."""
    for mod in modules:
        try:
            if importlib.util.find_spec(mod) is None:
                return mod
        except ModuleNotFoundError:
            return mod
    return None


def run_child(module: str, argv: list[str], what: str, timeout: float) -> Any:
    """`python -m module *argv` in its own process (a system's threads, singletons and
    warnings kept from the others' timings): the "results" of the JSON it prints after
    @@BENCH@@, or a note (str) saying why there are none."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", module, *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f}s"
    marker = proc.stdout.rfind("@@BENCH@@")
    if marker < 0:
        return f"exited {proc.returncode} without a result: {(proc.stderr or proc.stdout)[-800:]}"
    payload = json.loads(proc.stdout[marker + len("@@BENCH@@") :])
    if "error" in payload:
        progress(f"{what} failed:\n{payload.get('traceback', '')}")
        return f"error: {payload['error']}"
    return payload["results"]


def child_main(work: Callable[[], Any]) -> int:
    """A child's side of run_child: work()'s results, or its error, as JSON after
    @@BENCH@@ on stdout (whatever else the system printed stays before it)."""
    import traceback
    import warnings

    warnings.simplefilter("ignore")  # a peer's deprecation noise is not ours to fail on
    try:
        payload: dict[str, Any] = {"results": work()}
    except Exception as exc:  # noqa: BLE001
        payload = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    sys.stdout.write("\n@@BENCH@@" + json.dumps(payload) + "\n")
    sys.stdout.flush()
    return 0
