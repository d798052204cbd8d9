"""`cairn chaos` on real worker processes SIGKILLed at step boundaries (and from outside):
the invoice, the agent loop, signals and cancels, children, concurrency keys, a bulk
replay, a streaming chat, a LangGraph demo and an OpenAI Agents SDK demo, each run counted
once and its effects once.

The tests call cairn.testing.chaos (the same code as the CLI command) against this
suite's Postgres server and a flushed Redis database from the redis_url fixture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import cairn.testing.demos.chat  # noqa: F401  (registers chat here, as a worker does)
from cairn.cli import chaos as chaos_cli
from cairn.testing import chaos, faults
from cairn.testing.faults import BOUNDARIES
from tests.helpers.chaos import CHAOS_DB, SEED
from tests.helpers.services import BASE_DB, both_brokers

RUNS = 100


RATE = 0.03


@pytest.mark.pgbouncer
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


@pytest.mark.parametrize(
    ("workflow", "pool", "runs"),
    [
        ("agent", "prefork", 8),
        ("agent_async", "prefork", 8),
        # Async steps on the threads pool: tests/fleet/test_pydantic_ai.py's agent chaos.
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


def _kills_at_every_boundary(
    seed: int, points: list[tuple[int, str]]
) -> list[tuple[str, int, str]]:
    """One run killed at each point (seq, boundary or call point), runs 0, 1, 2, ...

    Listed, so each test meets every point whatever the seed; a low rate adds others."""
    return [(f"chaos-{seed}-{i:04d}", seq, point) for i, (seq, point) in enumerate(points)]


def _assert_truthful(report: dict[str, Any]) -> None:
    """The verdict of issue 38: every run done, each keyed effect once, no graph forked,
    every stream telling what the step history saved, under kills and pauses."""
    assert report["ok"], report["problems"]
    assert report["runs_finished"] == report["runs"] and report["duplicates"] == 0
    assert report["forks"] == 0 and report["history_violations"] == 0
    assert report["stream_mismatches"] == 0 and report["stream"]["gone"] == 0
    assert report["stream"]["runs"] == report["runs"]
    # A kill between a step's commit and its events: told late by the next owner.
    assert report["stream"]["late_step_saved"] >= 1
    assert report["pauses"] >= 1 and report["kills_total"] >= 1
    kills = report["kills"]
    assert all(kills[b] >= 1 for b in (*BOUNDARIES, "before_call", "after_call")), kills


def test_a_langgraph_demo_survives_kills_and_pauses_without_a_fork_or_a_false_stream(
    template_db: str, redis_url: str, tmp_path: Path
) -> None:
    """`cairn chaos graph_agent`: the LangGraph demo killed at every boundary (its graph
    step's, and before and after the calls of its nodes) and paused past its lease: no
    thread forked, each email delivered once, every stream as the history."""
    runs = 16
    kills = _kills_at_every_boundary(SEED, [(0, "before_effect"), (0, "after_effect"),
        (0, "after_save"), (0, "before_call:0"), (0, "after_call:0"), (0, "before_call:0"),
        (0, "after_call:0")])  # fmt: skip
    report = chaos.run_chaos(
        "graph_agent",
        runs=runs,
        workers=2,
        concurrency=2,
        seed=SEED,
        rate=0.03,
        kills=kills,
        random_kills=1,
        pauses=3,
        lease_ttl=2.0,
        deadline=120,
        pending_after=20,
        mail_delay_ms=20,
        model_delay_ms=30,  # a run lasts long enough to be paused in the middle
        database_url=CHAOS_DB,
        redis_url=redis_url,
        state_dir=tmp_path,
        quiet=True,
    )
    _assert_truthful(report)
    assert report["graph"]["threads"] == runs
    assert report["journaled"] == {"model": 3 * runs, "lookup": runs, "notify": runs}
    graph = next(s for s in report["steps"] if s["step"] == "graph")
    assert graph["delivered"] == graph["keys"] == runs and graph["max_per_key"] == 1


@both_brokers
def test_the_oa_agent_demo_survives_kills_and_pauses_asking_and_sending_nothing_twice(
    template_db: str, redis_url: str, broker_url: str | None, tmp_path: Path
) -> None:
    """`cairn chaos oa_agent`: the OpenAI Agents SDK demo (four model requests, a lookup,
    a keyed email and a handoff in its one step) killed at its step's boundaries and before
    and after its calls, and paused past its lease, on each broker: every run done, each
    email delivered once, the model stand-in asked again only for requests a kill or a
    pause cut short, every stream as the history."""
    runs = 12
    # Calls in order: 0 model, 1 tool:lookup, 2 model, 3 tool:notify (the email),
    # 4 model (the handoff), 5 model (billing's answer).
    kills = _kills_at_every_boundary(SEED, [(0, "before_effect"), (0, "after_effect"),
        (0, "after_save"), (0, "before_call:0"), (0, "after_call:0"), (0, "after_call:3"),
        (0, "before_call:3"), (0, "after_call:4"), (0, "before_call:5")])  # fmt: skip
    report = chaos.run_chaos(
        "oa_agent",
        runs=runs,
        workers=2,
        concurrency=2,
        seed=SEED,
        rate=0.02,
        kills=kills,
        random_kills=1,
        pauses=2,
        lease_ttl=2.0,
        deadline=90,
        pending_after=20,
        mail_delay_ms=20,
        model_delay_ms=30,  # a run lasts long enough to be paused in the middle
        database_url=CHAOS_DB,
        redis_url=redis_url,
        broker_url=broker_url,
        state_dir=tmp_path,
        quiet=True,
    )
    _assert_truthful(report)
    assert report["journaled"] == {"model": 4 * runs, "tool:lookup": runs, "tool:notify": runs}
    model = report["model"]
    assert model["excess"] == 0
    # Each kill after a request returned (not yet recorded: 0 and 4 are planned) costs one
    # more; one after a request that raised (a zombie refused by its lost lease) costs none.
    asked_again = [
        k for k in report["kill_log"]
        if k.get("point") in {"after_call:0", "after_call:2", "after_call:4", "after_call:5"}
        and not k.get("raised")
    ]  # fmt: skip
    assert model["journaled"] + len(asked_again) <= model["requests"]
    assert model["requests"] <= model["journaled"] + model["in_flight_allowed"]
    agent = next(s for s in report["steps"] if s["step"] == "agent")
    assert agent["delivered"] == agent["keys"] == runs and agent["max_per_key"] == 1
    # Each kill after the email's call returned (sent, not yet recorded) sends it again with
    # the same key. A kill there after the call raised sent nothing: a zombie, paused inside
    # the call and woken after another worker took the run, is refused its key (LeaseLost).
    emailed = [k for k in report["kill_log"] if k.get("point") == "after_call:3"]
    assert emailed, report["kill_log"]
    assert agent["deduplicated"] >= sum(1 for k in emailed if not k.get("raised")), emailed


def test_a_streaming_chat_survives_kills_and_pauses_with_a_truthful_stream(
    template_db: str, redis_url: str, tmp_path: Path
) -> None:
    """`cairn chaos chat`: a streamed model answer, then a keyed email, killed at every
    boundary (mid-stream too) and paused past the lease: each email delivered once, and
    every run's stream tells the steps its history saved, late where a kill came between
    a commit and its events, never a saved attempt abandoned."""
    runs = 24
    kills = _kills_at_every_boundary(SEED, [(0, "before_effect"), (0, "after_effect"),
        (0, "before_call:0"), (0, "after_call:0"), (0, "after_save"), (1, "before_effect"),
        (1, "after_effect"), (1, "after_save")])  # fmt: skip
    report = chaos.run_chaos(
        "chat",
        runs=runs,
        workers=2,
        concurrency=2,
        seed=SEED,
        rate=0.03,
        kills=kills,
        random_kills=1,
        pauses=3,
        lease_ttl=2.0,
        deadline=120,
        pending_after=20,
        mail_delay_ms=20,
        model_delay_ms=30,
        database_url=CHAOS_DB,
        redis_url=redis_url,
        state_dir=tmp_path,
        quiet=True,
    )
    _assert_truthful(report)
    assert report["journaled"] == {"model": runs} and report["model"]["excess"] == 0
    close = next(s for s in report["steps"] if s["step"] == "close")
    assert close["delivered"] == close["keys"] == runs and close["max_per_key"] == 1


def test_unkeyed_effect_is_reported_as_the_step_that_duplicates(
    template_db: str, redis_url: str, tmp_path: Path
) -> None:
    app = typer.Typer()
    chaos_cli.register(app)

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
        "tests.helpers.chaos_flows",
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
        workflows="tests.helpers.flows",
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
