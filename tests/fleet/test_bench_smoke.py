"""Smoke test of the benchmark suite: `bench --quick` runs end to end against the test
Postgres/Redis and writes every section with positive numbers. No timing assertions."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import bench
from bench.common import SECTIONS
from bench.flow import QUICK
from tests.helpers.services import BASE_DB, BASE_REDIS


def _measured(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "skipped" not in r]


def test_bench_quick(template_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # conftest clears CAIRN_* from the environment; the bench reads its services from it
    monkeypatch.setenv("CAIRN_DATABASE_URL", BASE_DB)
    monkeypatch.setenv("CAIRN_REDIS_URL", BASE_REDIS)
    out = tmp_path / "r.json"

    assert bench.main(["--quick", "--quiet", "--json", str(out)]) == 0

    data = json.loads(out.read_text())
    for section in ("meta", *SECTIONS, "targets"):
        assert section in data, section
        assert "error" not in data[section], data[section]

    per = data["per_step"]["rows"]
    keys = {r["key"] for r in per}
    assert {"tiny", "floor", "cairn", "celery", "dbos", "langgraph-async", "langgraph-sync"} <= keys
    for r in _measured(per):
        assert r["steps_per_s"] > 0 and r["wal_bytes_per_step"] > 0, r
    # the tiny guarded upsert is the floor every ratio divides by; the whole-window
    # upsert stays as a second reference beside each W
    tiny = next(r for r in per if r["key"] == "tiny")
    assert tiny["time_vs_floor"] == 1.0 and tiny["window_bytes"] is None
    for r in _measured(per):
        assert r["time_vs_floor"] == r["best_ms_per_step"] / tiny["best_ms_per_step"], r
        if r["key"] in ("cairn", "celery"):
            assert r["time_vs_window_floor"] > 0 and r["paired_ratio"] > 0, r
    # the same loop traced (the otel extra, a test dependency): both exporters, each W
    traced = [r for r in per if r["key"] in ("cairn-traced", "cairn-traced-batch")]
    assert [(r["key"], r["window_bytes"]) for r in traced] == [
        (k, w) for w in data["per_step"]["windows"] for k in ("cairn-traced", "cairn-traced-batch")
    ], traced
    for r in traced:
        assert r["steps_per_s"] > 0 and r["vs_untraced"] > 0 and r["paired_vs_untraced"] > 0, r
    batch = [r for r in traced if r["key"] == "cairn-traced-batch"]
    assert all(r["export_ms_per_step"] > 0 and r["with_export_vs_untraced"] > 0 for r in batch)
    assert data["per_step"]["trace_sink"]["requests"] > 0  # the spans reached the OTLP sink
    for key in ("tracing_pairs", "tracing_pairs_batch"):  # measured pair by pair, both
        got = data["per_step"][key]
        assert len(got["ratios"]) == got["pairs"] > 0 and got["median"] > 0, got
    assert data["per_step"]["tracing_pairs_batch"]["export_us_per_step"] > 0
    # a peer may be absent (no [bench] extra), but one that is installed must run
    for r in per + data["growth"]["rows"]:
        if "skipped" in r:
            assert r["skipped"].startswith("not installed: pip install -e '.[bench]'"), r

    grow = data["growth"]["rows"]
    assert {"cairn", "naive"} <= {r["key"] for r in _measured(grow)}
    for r in _measured(grow):
        assert r["wal_bytes"] > 0 and r["n"] > 0, r

    modes = data["recovery"]["modes"]
    # RabbitMQ's row is there when a RabbitMQ answers: always in CI (scripts/test starts one)
    expected = ["child", "worker", "worker_amqp"]
    assert [m["mode"] for m in modes] == expected[: 3 if os.environ.get("CI") else len(modes)]
    assert len(modes) >= 2
    for m in modes:
        assert m["seconds"] and all(s > 0 for s in m["seconds"]), m

    fleet = data["fleet"]["rows"]
    assert fleet
    for r in fleet:
        assert r["runs_per_s"] > 0 and r["steps_per_s"] > 0 and r["noop_tasks_per_s"] > 0, r
        assert r["pgbench_tps"] is None or r["pgbench_tps"] > 0, r
        assert r["cpu_ms_per_step"]["celery workers"] >= 0, r
    assert [p["cores"] for p in data["fleet"]["prediction"]] == [2, 4, 8, 16]

    waiting = data["waiting"]["rows"]
    assert [r["pool"] for r in waiting] == ["threads", "prefork"]
    for r in waiting:
        assert r["done"] == r["runs"] and r["steps_per_s"] > 0, r
        assert r["peak_rss_mb"] > 0 and r["peak_pg_connections"] > 0, r
        assert r["overhead_p50_ms"] is not None and r["cpu_ms_per_step"]["workers"] >= 0, r

    million = data["million"]
    assert million["runs"] == 10_000 and million["counts_exact"] is True
    kinds = {r["kind"] for r in million["rows"]}
    assert {"interactive", "counts", "reaper", "retention"} <= kinds
    for r in million["rows"]:
        assert r["median_ms"] > 0, r
    sweep = next(r for r in million["rows"] if r["kind"] == "retention")
    assert sweep["swept"] > 0 and sweep["left_behind"] == 0, sweep

    run = data["per_run"]
    assert run["run_ms"] > 0 and run["noop_ms"] > 0, run
    assert run["ratio"] == run["run_ms"] / run["noop_ms"]
    phases = run["in_process_ms"]
    assert all(phases[p] > 0 for p in ("run", "lease acquire", "claim", "save", "release"))
    assert sum(v for p, v in phases.items() if p != "run") <= phases["run"]
    assert run["fenced_floor_ms"] > 0, run  # measured (compared in the report, not here)

    stream = data["stream"]
    for r in stream["rows"]:  # every token event reaches its reader, cairn's and the floor's
        assert r["all_received"] and not r["out_of_order"] and not r.get("streams_ended"), r
    assert stream["memory"]["streams"] == 20 and stream["memory"]["rss_open_mb"] > 0
    on = stream["cpu"]["rows"][0]
    assert on["token_events"] == on["token_events_expected"] > 0, on

    names = [t["target"] for t in data["targets"]]
    for prefix in (
        "cairn in-process per-step cost ≤ 1.2× tiny floor",
        "cairn through Celery ≤ 1.4× tiny floor",
        "a no-op step in process, run events and tracing off ≤ 1.6× tiny floor",
        "a journaled call (ctx.call) ≤ 1.5× tiny floor",
        "per-run fixed cost ≤ 2× a Celery no-op task's",
        "tracing overhead per no-op step ≤ 10% (no-op exporter",
        "tracing overhead per no-op step, batch OTLP exporter (stated",
    ):
        assert any(n.startswith(prefix) for n in names), (prefix, names)
    tracing = [t for t in data["targets"] if t["target"].startswith("tracing overhead")]
    assert all(t["pass"] is not None for t in tracing), tracing  # measured, not skipped
    assert [t.get("stated") for t in tracing] == [None, True], tracing  # the batch one: stated
    assert data["targets"] and all("pass" in t for t in data["targets"])
    # Each fleet line says what 40% would leave a step once Celery's own dispatch is paid.
    rooms = [t["detail"] for t in data["targets"] if t["target"].startswith("fleet steps/s")]
    assert len(rooms) == sum(1 for r in fleet if r["pgbench_tps"]), rooms
    assert all("a Celery no-op took" in d for d in rooms), rooms

    flow = data["flow"]  # concurrency keys, the rate limiter, fan-out (bench/flow.py)
    plain, keyed = flow["rows"]
    assert (plain["keyed"], keyed["keyed"]) == (False, True)
    for r in (plain, keyed):
        assert r["done"] == QUICK.runs + QUICK.lone and r["failed"] == 0, r
        assert r["runs_per_s"] > 0 and r["lone_wait_max_s"] >= r["lone_wait_p50_s"] >= 0, r
        assert r["cpu_ms_per_run"]["workers"] > 0, r
    assert keyed["most_running_per_key"] == 1 and keyed["overlaps"] == 0, keyed
    assert keyed["keys_seen"] == QUICK.keys
    # every run of a key but its first was queued behind the one before
    assert keyed["handoffs"] == QUICK.runs - QUICK.keys, keyed
    assert flow["ratios"]["runs_per_s"] > 0

    h = flow["handoff"]
    assert h["handoffs"] == QUICK.chain - 1 and h["overlaps"] == 0, h
    assert h["floor_runs"] == QUICK.floor and h["p50_vs_floor"] > 0, h

    fo = flow["fanout"]
    assert fo["all_done"] and len(fo["reps"]) == QUICK.fanout_reps, fo
    assert all(r["handoff_ms"] > 0 for r in fo["reps"]), fo

    rl = flow["ratelimit"]
    assert rl["requests"] > 0 and "standin_429" in rl, rl  # the count is a timing: no assert

    targets = [t for t in data["targets"] if t["target"].startswith("flow")]
    assert len(targets) == 3 and targets[0]["pass"] is True, targets

    lat = data["latency"]["rows"]  # both ways on each broker, idle and loaded
    assert {(r["broker"], r["load"]) for r in lat} >= {("redis", "idle"), ("redis", "loaded")}
    for r in lat:
        assert r["floor"]["p50"] > 0 and r["cairn"]["p50"] > 0, r
        assert r["floor"]["n"] == r["cairn"]["n"] > 0, r
    tx = data["latency"]["in_transaction"]  # an order's commit, with a run enqueued inside
    assert tx["floor"]["p50"] > 0 and tx["cairn"]["n"] == tx["floor"]["n"] > 0, tx
    cost = data["db_cost"]["best"]  # Postgres's CPU and WAL over the window, per run
    assert cost["pg_cpu_ms_per_run"] > 0 and cost["wal_bytes_per_run"] > 0, cost
    idle = next(r for r in lat if r["load"] == "idle")
    assert all(v > 0 for v in idle["parts_p50_ms"].values()) and len(idle["parts_p50_ms"]) == 3
    waits = data["waits"]  # counts, not timings: every wait woke, on the client's connections
    assert waits["waits"] == 100 and waits["burst"] == 50, waits
    assert waits["connections"] <= 2 and waits["wake_ms"]["p50"] > 0, waits
    slept = data["sleep"]  # beat's wake pass among sleeping runs (bench/sleep.py)
    assert slept["wake_ms"] > 0 and slept["wake_none_due_ms"] > 0, slept
    assert slept["counts_exact"], slept
    backlog = data["backlog"]  # a backlog drained fresh and stale (bench/backlog.py)
    for phase in ("fresh", "stale"):
        assert backlog[phase]["runs_per_s"] > 0 and backlog[phase]["duplicates"] >= 0, backlog
    assert backlog["pass"]["sent"] == backlog["pass"]["stalled"], backlog
    assert backlog["pass"]["sent_again"] == 0 and backlog["pass"]["ms_per_batch"] > 0, backlog
