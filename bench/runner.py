"""`python -m bench`: run the sections, print tables, write JSON."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import redis

from bench import (
    backlog,
    dbcost,
    fanout,
    flow,
    latency,
    million,
    pai,
    providers,
    report,
    sections,
    sleep,
    stream,
    waiting,
    waits,
)
from bench.common import ROOT, SECTIONS, Databases, base_db, bench_redis, progress, set_quiet

DEFAULT_JSON = ROOT / "bench" / "results.json"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke, seconds)")
    p.add_argument(
        "--json",
        type=Path,
        default=DEFAULT_JSON,
        metavar="PATH",
        help="where to write the results (default: bench/results.json)",
    )
    p.add_argument(
        "--only",
        default="",
        metavar="NAME[,NAME]",
        help=f"run only these sections: {', '.join(SECTIONS)}",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p.parse_args(argv)


def _server_info(url: str) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        info = {}
        for name in (
            "server_version",
            "fsync",
            "synchronous_commit",
            "full_page_writes",
            "wal_level",
        ):
            row = conn.execute(f"SHOW {name}").fetchone()
            info[name] = row[0] if row else None
        info["postmaster_start"] = _started(conn)
    return info


def _started(conn: psycopg.Connection[Any]) -> str | None:
    row = conn.execute("SELECT pg_postmaster_start_time()::text").fetchone()
    return str(row[0]) if row else None


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    set_quiet(args.quiet)
    only = [s.strip().replace("-", "_") for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        print(
            f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}",
            file=sys.stderr,
        )
        return 2
    chosen = only or list(SECTIONS)
    sizes = sections.QUICK if args.quick else sections.Sizes()

    url, redis_url = base_db(), bench_redis()
    try:
        info = _server_info(url)
        r = redis.Redis.from_url(redis_url, socket_connect_timeout=3)
        r.flushdb()
        r.close()
    except Exception as exc:  # noqa: BLE001
        print(
            f"bench: Postgres ({url}) or Redis ({redis_url}) not reachable: {exc}", file=sys.stderr
        )
        return 2

    results: dict[str, Any] = {
        "meta": {
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "quick": args.quick,
            "sections": chosen,
            "sizes": {k: list(v) if isinstance(v, tuple) else v for k, v in vars(sizes).items()},
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "postgres": info,
            "redis": redis_url,
            "wal_note": "WAL bytes are pg_current_wal_lsn() differences: cluster-wide, so the "
            "minimum over repetitions is reported",
        }
    }
    t0 = time.monotonic()
    dbs = Databases(url)
    runners = {
        "per_step": sections.per_step,
        "growth": sections.growth,
        "recovery": sections.recovery,
        "fleet": sections.fleet,
        "per_run": sections.per_run,
        "waiting": waiting.section,
        "million": million.million,
        "pydantic_ai": pai.section,
        "stream": stream.section,
        "flow": flow.section,
        "providers": providers.section,
        "fanout": fanout.section,
        "latency": latency.section,
        "db_cost": dbcost.section,
        "waits": waits.section,
        "sleep": sleep.section,
        "backlog": backlog.section,
    }
    try:
        for name in chosen:
            progress(f"== {name} ==")
            started = time.monotonic()
            try:
                results[name] = runners[name](dbs, redis_url, sizes)
            except Exception as exc:  # noqa: BLE001 (one broken section must not lose the others)
                import traceback

                traceback.print_exc()
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            results[name]["elapsed_s"] = time.monotonic() - started
            progress(f"== {name} done in {time.monotonic() - started:.1f}s ==")
    finally:
        dbs.close()
        try:
            r = redis.Redis.from_url(redis_url)
            r.flushdb()
            r.close()
        except Exception:  # noqa: BLE001, S110
            pass
    results["meta"]["elapsed_s"] = time.monotonic() - t0
    results["meta"]["warnings"] = []
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            if _started(conn) != info["postmaster_start"]:
                results["meta"]["warnings"].append(
                    "Postgres restarted while the bench ran (another process's tests?): "
                    "numbers measured around the restart are suspect; run again"
                )
    except Exception as exc:  # noqa: BLE001
        results["meta"]["warnings"].append(f"Postgres not reachable after the bench: {exc}")
    results["targets"] = report.targets(results)
    report.render(results)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    progress(f"wrote {args.json}")
    return 0
