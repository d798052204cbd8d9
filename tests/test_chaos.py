"""`cairn chaos`: real worker processes SIGKILLed at step boundaries (and from outside).

The end-to-end tests call workers.chaos (the same code as the CLI command) against
this suite's Postgres server and a flushed Redis database from the redis_url fixture.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cairn.testing import chaos, faults
from cairn.testing.faults import BOUNDARIES
from tests.conftest import BASE_DB, both_brokers, via_pgbouncer

# ---------------------------------------------------------------------------------------
# Fast: the pieces, without processes
# ---------------------------------------------------------------------------------------


def test_the_production_worker_never_loads_the_fault_machinery() -> None:
    code = (
        "import sys, cairn.workers.main as m; "
        "assert [type(x).__name__ for x in m.app.cairn.middleware.middleware] == ['Metrics']; "
        "print(sorted(n for n in sys.modules if n.startswith('cairn.testing')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_kill_schedule_is_a_pure_function_of_the_seed() -> None:
    points = [(f"run-{i}", s, b) for i in range(200) for s in range(4) for b in BOUNDARIES]
    a = {p for p in points if faults.decide(42, *p, 0.05)}
    assert a == {p for p in points if faults.decide(42, *p, 0.05)}
    assert a != {p for p in points if faults.decide(43, *p, 0.05)}
    assert 80 < len(a) < 160  # ~5% of 2400
    assert not any(faults.decide(42, *p, 0.0) for p in points)
    plan = faults.Plan({"dir": "/nonexistent", "seed": 1, "kills": [["r", 3, "after_save"]]})
    assert plan.due("after_save", "r", 3) and not plan.due("before_effect", "r", 3)


def _row(i: int, run: str, kind: str, seq: int, epoch: int, status: str = "running") -> dict:
    return {
        "id": i,
        "run_id": run,
        "kind": kind,
        "seq": seq,
        "epoch": epoch,
        "cursor": "c",
        "status": status,
        "at": float(i),
    }


def test_history_check_flags_a_checkpoint_going_backwards() -> None:
    good = [
        _row(1, "a", "create", 0, 0, "pending"),
        _row(2, "a", "claim", 0, 1, "pending"),
        _row(3, "a", "save", 1, 1),
        _row(4, "a", "claim", 1, 2),
        _row(5, "a", "save", 2, 2),
        _row(6, "a", "save", 3, 2, "done"),
        _row(7, "a", "claim", 3, 3, "done"),
    ]
    assert chaos.check_history(good) == []
    bad = [
        *good[:5],
        _row(6, "a", "save", 1, 2),
        _row(7, "a", "save", 2, 1),
        _row(8, "a", "save", 2, 3),
    ]
    problems = chaos.check_history(bad)
    assert any("seq went back 2 -> 1" in p for p in problems)
    assert any("epoch went back" in p for p in problems)
    assert any("did not advance" in p for p in problems)


def test_recovery_is_measured_to_the_next_owner() -> None:
    rows = [
        _row(1, "a", "create", 0, 0, "pending"),
        _row(2, "a", "claim", 0, 1, "pending"),
        _row(3, "a", "save", 1, 1),
        _row(10, "a", "claim", 1, 2),
        _row(11, "a", "save", 2, 2, "done"),
    ]
    kills = [
        {"kind": "boundary", "run_id": "a", "ts": 4.5},
        {"kind": "pool_child", "run_id": "a", "ts": 12.0},
    ]
    rec = chaos.recoveries(kills, rows)
    assert rec[0]["seconds"] == 5.5
    assert rec[1]["seconds"] is None and rec[1]["note"] == "run had already finished"


def test_step_report_counts_replays_of_one_visit_as_duplicates() -> None:
    events = [
        # keyed: the replay (attempt 2) is deduplicated by the mail API
        {"step": "r1 2 send 1", "key": "cairn:r1:send:0", "id": "m1", "delivered": True},
        {"step": "r1 2 send 2", "key": "cairn:r1:send:0", "id": "m1", "delivered": False},
        # unkeyed: the replay is delivered again
        {"step": "r2 2 send 1", "key": None, "id": "m2", "delivered": True},
        {"step": "r2 2 send 2", "key": None, "id": "m3", "delivered": True},
        {"step": "r3 2 send 1", "key": None, "id": "m4", "delivered": True},
    ]
    (send,) = chaos.step_report(events, {"send": 5}, ["fetch", "send"])
    assert send["sends"] == 5 and send["delivered"] == 4 and send["deduplicated"] == 1
    assert send["keys"] == 1 and send["max_per_key"] == 1 and send["unkeyed"] == 3
    assert send["duplicates"] == 1 and send["visits"] == 3


def test_step_report_counts_each_journaled_calls_key_as_its_own_effect() -> None:
    events = [
        # attempt 1 sends call 0, dies; attempt 2 replays it and sends calls 1 and 2
        {"step": "r1 0 work 1", "key": "cairn:r1:work:0:notify:0", "id": "a", "delivered": True},
        {"step": "r1 0 work 2", "key": "cairn:r1:work:0:notify:1", "id": "b", "delivered": True},
        {"step": "r1 0 work 2", "key": "cairn:r1:work:0:notify:2", "id": "c", "delivered": True},
        # a call whose kill came after its send and before its record: sent again, deduped
        {"step": "r2 0 work 1", "key": "cairn:r2:work:0:notify:0", "id": "d", "delivered": True},
        {"step": "r2 0 work 2", "key": "cairn:r2:work:0:notify:0", "id": "d", "delivered": False},
    ]
    (work,) = chaos.step_report(events, {"work": 4}, ["work"])
    assert work["duplicates"] == 0 and work["keys"] == 4 and work["deduplicated"] == 1


def test_model_requests_beyond_the_journal_and_the_kills_are_a_problem() -> None:
    kills = [{"kind": "call", "run_id": "a"}, {"kind": "whole_worker", "runs": ["b", "c"]}]
    assert chaos.report._model_check(10, {"model": 7}, kills)["excess"] == 0
    assert chaos.report._model_check(11, {"model": 7}, kills)["excess"] == 1
    assert chaos.report._model_check(None, {}, kills)["excess"] == 0


# ---------------------------------------------------------------------------------------
# Slow: real workers, real SIGKILLs
# ---------------------------------------------------------------------------------------

RUNS = 100
SEED = 1234
# The server the chaos databases are made on, and that the workers reach: PgBouncer in
# transaction mode when scripts/test runs the chaos test again behind it.
CHAOS_DB = via_pgbouncer(BASE_DB)
RATE = 0.03


@pytest.mark.slow
@both_brokers
def test_invoice_survives_kills_at_every_boundary(
    template_db: str, redis_url: str, broker_url: str | None, tmp_path: Path
) -> None:
    report = chaos.run_chaos(
        "invoice",
        runs=RUNS,
        workers=2,
        concurrency=2,
        seed=SEED,
        rate=RATE,
        random_kills=3,
        lease_ttl=2.0,
        deadline=150,
        pending_after=20,
        mail_delay_ms=5,
        model_delay_ms=0,
        database_url=CHAOS_DB,
        redis_url=redis_url,
        broker_url=broker_url,
        state_dir=tmp_path,
        quiet=True,
    )
    assert report["ok"], report["problems"]
    assert report["runs_finished"] == RUNS and report["runs_lost"] == 0
    assert report["duplicates"] == 0 and report["history_violations"] == 0
    assert report["history_rows"] >= RUNS * 5  # create + 4 saves per run, at least
    kills = report["kills"]
    assert (
        sum(kills[b] for b in BOUNDARIES) + kills["random_pool_child"] + kills["whole_worker"] >= 20
    )
    assert all(kills[b] >= 3 for b in BOUNDARIES), kills
    # Replayable: the boundary kills are exactly the points the seed picks (an outside
    # kill between a save and its after_save hit may skip one after_save point).
    predicted = {
        (f"chaos-{SEED}-{i:04d}", seq, b)
        for i in range(RUNS)
        for seq in range(4)
        for b in BOUNDARIES
        if faults.decide(SEED, f"chaos-{SEED}-{i:04d}", seq, b, RATE)
    }
    actual = {
        (k["run_id"], k["seq"], k["boundary"])
        for k in report["kill_log"]
        if k["kind"] == "boundary"
    }
    assert actual <= predicted
    assert len(actual) >= len(predicted) - kills["random_pool_child"] - kills["whole_worker"]
    send = next(s for s in report["steps"] if s["step"] == "send_email")
    assert send["delivered"] == RUNS and send["keys"] == RUNS and send["max_per_key"] == 1
    # Every kill between a send and its checkpoint makes the replay resend the same key.
    sent_unsaved = [
        k
        for k in report["kill_log"]
        if k["kind"] == "boundary"
        and k["boundary"] == "after_effect"
        and k["cursor"] == "send_email"
    ]
    assert len(sent_unsaved) > 0
    assert send["deduplicated"] >= len(sent_unsaved)
    assert report["recovery"]["pool_child"]["n"] >= 10
    assert report["recovery"]["pool_child"]["p95"] < 15


@pytest.mark.slow
def test_invoice_survives_kills_on_the_threads_pool(
    template_db: str, redis_url: str, tmp_path: Path
) -> None:
    """Threads workers: each kill takes a whole worker with every run it drives, and a
    new worker is started; the runs still finish with each email sent once."""
    runs = 40
    report = chaos.run_chaos(
        "invoice",
        runs=runs,
        workers=2,
        concurrency=8,
        pool="threads",
        seed=SEED,
        rate=RATE,
        random_kills=2,
        lease_ttl=2.0,
        deadline=150,
        pending_after=20,
        mail_delay_ms=5,
        model_delay_ms=0,
        database_url=CHAOS_DB,
        redis_url=redis_url,
        state_dir=tmp_path,
        quiet=True,
    )
    assert report["ok"], report["problems"]
    assert report["runs_finished"] == runs and report["runs_lost"] == 0
    assert report["duplicates"] == 0 and report["history_violations"] == 0
    assert sum(report["kills"][b] for b in BOUNDARIES) >= 5, report["kills"]
    assert "--pool threads" in report["replay"]
    send = next(s for s in report["steps"] if s["step"] == "send_email")
    assert send["delivered"] == runs and send["max_per_key"] == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workflow", "pool", "runs"),
    [
        ("agent", "prefork", 8),
        ("agent_async", "prefork", 8),
        # Async steps on the threads pool: test_pydantic_ai_fleet.py's agent chaos.
        ("agent", "threads", 3),
    ],
)
def test_an_agent_loop_in_one_step_survives_kills_at_every_call(
    workflow: str, pool: str, runs: int, template_db: str, redis_url: str, tmp_path: Path
) -> None:
    """Eight journaled model calls and three keyed tool effects in ONE step, killed before
    and after calls (one point in ten) and at the step boundaries: each call is made
    once, or again only when a kill cut it short."""
    report = chaos.run_chaos(
        workflow,
        runs=runs,
        workers=2,
        concurrency=2,
        pool=pool,
        seed=SEED,
        rate=0.1,
        random_kills=1,
        lease_ttl=2.0,
        deadline=240,
        pending_after=20,
        mail_delay_ms=5,
        model_delay_ms=0,
        database_url=CHAOS_DB,
        redis_url=redis_url,
        state_dir=tmp_path,
        quiet=True,
    )
    assert report["ok"], report["problems"]
    assert report["runs_finished"] == runs and report["duplicates"] == 0
    assert report["history_violations"] == 0
    kills = report["kills"]
    assert kills["before_call"] >= 1 and kills["after_call"] >= 1, kills
    # Every call recorded once; the model asked again only for calls a kill cut short.
    assert report["journaled"] == {"model": 8 * runs, "notify": 3 * runs}
    model = report["model"]
    assert model["excess"] == 0
    assert model["journaled"] <= model["requests"] <= model["journaled"] + report["kills_total"]
    work = next(s for s in report["steps"] if s["step"] == "work")
    assert work["delivered"] == work["keys"] == 3 * runs and work["max_per_key"] == 1


@pytest.mark.slow
def test_unkeyed_effect_is_reported_as_the_step_that_duplicates(
    template_db: str, redis_url: str, tmp_path: Path
) -> None:
    app = typer.Typer()
    chaos.register(app)

    @app.callback()
    def _root() -> None:
        pass

    seed = 5
    kills = [f"chaos-{seed}-{i:04d}:2:after_effect" for i in (0, 3)]  # send_email is seq 2
    args = [
        "chaos",
        "unkeyed",
        "--runs",
        "6",
        "--workers",
        "1",
        "--seed",
        str(seed),
        "--rate",
        "0",
        "--random-kills",
        "0",
        "--lease-ttl",
        "2",
        "--deadline",
        "90",
        "--json",
        "--workflows",
        "tests.chaos_flows",
        "--database-url",
        BASE_DB,
        "--redis-url",
        redis_url,
        *[a for k in kills for a in ("--kill", k)],
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert not report["ok"] and report["runs_finished"] == 6
    assert report["kills"]["after_effect"] == 2
    assert any(
        "'send_email'" in p and "without an idempotency key" in p for p in report["problems"]
    )
    by_step = {s["step"]: s for s in report["steps"]}
    assert by_step["send_email"]["duplicates"] == 2
    assert by_step["send_email"]["delivered"] == 8 and by_step["send_email"]["keys"] == 0
    assert all(s["duplicates"] == 0 for name, s in by_step.items() if name != "send_email")


@pytest.mark.slow
def test_signals_and_cancels_under_kills(template_db: str, redis_url: str, tmp_path: Path) -> None:
    report = chaos.run_chaos(
        "invoice",
        runs=40,
        workers=2,
        concurrency=2,
        seed=SEED,
        rate=RATE,
        random_kills=2,
        lease_ttl=2.0,
        deadline=150,
        pending_after=20,
        mail_delay_ms=5,
        model_delay_ms=0,
        database_url=CHAOS_DB,
        redis_url=redis_url,
        state_dir=tmp_path,
        quiet=True,
        signals=True,
        cancel_rate=0.1,
    )
    assert report["ok"], report["problems"]
    life = report["lifecycle"]
    assert life["signals_lost"] == 0 and life["sends_after_cancel"] == 0
    assert life["cancels_asked"] == report["runs_cancelled"] == 4
    assert life["signals_duplicated"] > 0 and life["signals_early"] > 0
    assert life["runs_paid"] == report["runs_finished"] == 40 - 4
    assert report["duplicates"] == 0 and report["history_violations"] == 0


@pytest.mark.slow
@both_brokers
def test_recovery_stays_within_the_lease_ttl_under_heavy_kills(
    template_db: str, redis_url: str, broker_url: str | None, tmp_path: Path
) -> None:
    """A kill at one step boundary in ten (about 1.5 per run) with the queue full: a run
    whose pool process died must not wait behind the backlog (issue 10: p95 was ~20 s).

    It waits for the next free pool process, which on 2 cores with every process busy is
    most of its recovery: p95 4.8-4.9 s alone (before run events and after), 6.1 s on
    RabbitMQ beside the other half of the suite. The bound is two TTLs plus 2 s: far
    below the backlog's ~20 s, above what a loaded CI machine adds."""
    ttl = 3.0
    report = chaos.run_chaos(
        "invoice",
        runs=60,
        workers=3,
        concurrency=2,
        seed=7,
        rate=0.1,
        random_kills=2,
        lease_ttl=ttl,
        deadline=150,
        database_url=CHAOS_DB,
        redis_url=redis_url,
        broker_url=broker_url,
        state_dir=tmp_path,
        quiet=True,
    )
    assert report["ok"], report["problems"]
    assert report["kills_total"] >= 60
    child = report["recovery"]["pool_child"]
    assert child["n"] >= 50
    assert child["p95"] <= 2 * ttl + 2, (child, report["recovery"]["slowest"])


@pytest.mark.fleet
def test_child_runs_survive_kills_at_every_boundary(
    template_db: str, redis_url: str, tmp_path: Path
) -> None:
    """Parents that spawn children, both killed at step boundaries (one in five) and
    from outside: every child is spawned once and runs its step once, every parent goes
    on after its spawn once, with every child's result."""
    from cairn.store.admin import drop_database, execute, with_path

    runs, ns = 8, [1, 2, 3, 4]
    report = chaos.run_chaos(
        "fanout",
        runs=runs,
        workers=2,
        concurrency=2,
        seed=SEED,
        rate=0.2,
        random_kills=2,
        lease_ttl=2.0,
        deadline=150,
        pending_after=20,
        workflows="tests.flows",
        input={"ns": ns},
        keep=True,
        database_url=CHAOS_DB,
        redis_url=redis_url,
        state_dir=tmp_path,
        quiet=True,
    )
    name = report["database"].split(" ")[0]
    db = with_path(CHAOS_DB, name)
    try:
        kids = execute(db, "SELECT parent_id, count(*) AS n FROM runs"
                           " WHERE parent_id IS NOT NULL GROUP BY parent_id")  # fmt: skip
        saved = execute(db, "SELECT h.run_id, h.cursor, count(*) AS n FROM step_history h"
                            " WHERE h.outcome = 'saved' GROUP BY h.run_id, h.cursor")  # fmt: skip
        states = execute(db, "SELECT c.run_id, c.status, c.state FROM checkpoints c"
                             " JOIN runs r USING (run_id) WHERE r.parent_id IS NULL")  # fmt: skip
    finally:
        drop_database(CHAOS_DB, name)
    assert report["ok"], report["problems"]
    assert report["kills_total"] >= 5, report["kills"]
    assert len(kids) == runs and all(k["n"] == len(ns) for k in kids)
    assert all(s["n"] == 1 for s in saved), [s for s in saved if s["n"] != 1]
    parents = {s["run_id"] for s in saved if s["cursor"] == "total"}
    assert len(parents) == runs  # each parent's step after the spawn: saved once
    assert sum(1 for s in saved if s["cursor"] == "sq") == runs * len(ns)
    assert all(
        r["status"] == "done" and r["state"]["total"] == sum(n * n for n in ns) for r in states
    )


@pytest.mark.fleet
def test_concurrency_keys_hold_their_limit_under_kills_at_every_boundary(
    template_db: str, redis_url: str, tmp_path: Path
) -> None:
    """12 invoice runs over 3 keys at limit 1, workers killed at step boundaries (one in
    five) and from outside: every run ends, each effect once, no key ever ran two runs at
    once (step history), and every slot came back (a killed run keeps its slot until it
    is resumed and stops; none leaked, none granted twice)."""
    report = chaos.run_chaos(
        "invoice",
        runs=12,
        workers=2,
        concurrency=2,
        seed=SEED,
        rate=0.2,
        random_kills=2,
        lease_ttl=2.0,
        deadline=150,
        pending_after=20,
        mail_delay_ms=5,
        model_delay_ms=0,
        keys=3,
        key_limit=1,
        database_url=CHAOS_DB,
        redis_url=redis_url,
        state_dir=tmp_path,
        quiet=True,
    )
    assert report["ok"], report["problems"]
    assert report["kills_total"] >= 5, report["kills"]
    assert report["keys"]["most_at_once"] == {"k0": 1, "k1": 1, "k2": 1}
    assert report["keys"]["left"] == {"slots": 0, "queued": 0, "keys": 0}


@pytest.mark.fleet
def test_bulk_replay_of_100_failed_runs_under_kills_ends_with_each_done_once(
    template_db: str, redis_url: str, tmp_path: Path
) -> None:
    """100 invoice runs fail (the mail API refuses every send), the cause is fixed and
    Client.replay re-arms them while workers are killed at step boundaries and from
    outside: each run was replayed once (a second replay finds none), re-armed from failed
    once (its checkpoint history), ended done, and its email went out once."""
    report = chaos.run_chaos(
        "invoice",
        runs=RUNS,
        workers=2,
        concurrency=2,
        seed=SEED,
        rate=0.05,
        random_kills=3,
        lease_ttl=2.0,
        deadline=200,
        pending_after=20,
        mail_delay_ms=5,
        model_delay_ms=0,
        replay_failed=True,
        database_url=CHAOS_DB,
        redis_url=redis_url,
        state_dir=tmp_path,
        quiet=True,
    )
    assert report["ok"], report["problems"]
    assert report["kills_total"] >= 10, report["kills"]
    assert report["replay_failed"] == {
        "failed_first": RUNS, "replayed": RUNS, "replayed_again": 0, "rearmed_once": RUNS,
    }  # fmt: skip
    send = next(s for s in report["steps"] if s["step"] == "send_email")
    assert send["delivered"] == RUNS and send["duplicates"] == 0


def test_the_replay_verdict_names_a_run_replayed_twice_or_never() -> None:
    from cairn.testing.chaos import replay

    ids = ["a", "b"]
    rows = [
        {"run_id": r, "status": s}
        for r, s in (("a", "failed"), ("b", "failed"), ("a", "pending"), ("a", "failed"),
                     ("a", "pending"), ("a", "done"))
    ]  # fmt: skip
    section, problems = replay.verdict(ids, ids, ["a", "a"], ["b"], rows)
    assert section == {"failed_first": 2, "replayed": 2, "replayed_again": 1, "rearmed_once": 0}
    assert problems == [
        "the replay returned 2 run(s) for 2 failed (a twice)",
        "a second replay re-armed 1 run(s) again",
        "2 run(s) re-armed from failed other than once (e.g. a: 2)",
    ]
