"""`cairn chaos`: real worker processes SIGKILLed at step boundaries (and from outside).

The end-to-end tests call workers.chaos (the same code as the CLI command) against
this suite's Postgres server and a flushed Redis database from the redis_url fixture.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import cairn.testing.demos.chat  # noqa: F401  (registers chat here, as a worker does)
from cairn.cli import chaos as chaos_cli
from cairn.core.events import Event, encode
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.steps import DONE, Context, StepResult, workflow
from cairn.steps.model import ModelClient
from cairn.store import Leases, PgStore, keys
from cairn.store.events import RedisEvents
from cairn.testing import chaos, faults
from cairn.testing.chaos import pauses, record
from cairn.testing.faults import BOUNDARIES
from cairn.workers import loop
from cairn.workers.middleware import Chain, Middleware
from cairn.workers.outbox import Outbox
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


def _event(kind: str, seq: int, cursor: str, attempt: int, data: Any = None) -> Event:
    return Event("0-1", kind, data, cursor, 0, attempt, seq)


def test_the_stream_check_names_each_way_a_stream_can_lie() -> None:
    saved = [(0, "answer", 0, 2), (1, "close", 0, 2)]
    truthful = [
        _event("step_saved", 0, "answer", 2),
        _event("attempt_abandoned", 1, "close", 3, {"cursor": "close", "visit": 0, "attempt": 1}),
        _event("step_saved", 1, "close", 2, {"late": True}),
    ]
    assert record.compare(saved, truthful) == []
    lying = [
        _event("step_saved", 0, "answer", 1),  # an attempt whose save was refused
        _event("step_saved", 1, "close", 2),
        _event("step_saved", 1, "close", 2),
        _event("attempt_abandoned", 1, "close", 3, {"cursor": "close", "visit": 0, "attempt": 2}),
    ]
    assert record.compare(saved, lying) == [
        "no step_saved for seq 0 'answer' visit 0 attempt 2",
        "step_saved for seq 0 'answer' visit 0 attempt 1, not saved",
        "step_saved 2 times for seq 1 'close' visit 0 attempt 2",
        "attempt_abandoned for saved seq 1 'close' visit 0 attempt 2",
    ]


def test_the_record_checks_catch_a_stream_without_a_step_saved_and_a_forked_thread(
    settings: Settings, store: PgStore, leases: Leases, sql: Callable[..., Any]
) -> None:
    """A chat run driven to its end in this process, with its events: its stream matches
    its step history. Then the stream loses the answer's step_saved and gains an
    attempt_abandoned for the saved close, and the run's graph thread gets a second child
    of one checkpoint: the checks chaos runs on Postgres and Redis name all three."""
    model = ModelClient(base_url=settings.anthropic_base_url, give_up_after=10.0)
    outbox = Outbox(RedisEvents(leases.client), settings)
    deps = loop.Deps(settings=settings, store=store, leases=leases, model=model, events=outbox)
    run_id = "chaos-record-1"
    store.create_run(run_id, "chat", {"prompt": "REPLY: four words come back", "max_tokens": 16})
    try:
        assert loop.run(run_id, deps) == RunStatus.DONE
    finally:
        model.close()
    db, url = settings.database_url, settings.redis_url
    section, problems, notes = record.streams(db, url, grace=0)
    assert (section["runs"], section["mismatches"], problems, notes) == (1, 0, [], [])
    assert record.forks(db) == ({"threads": 0, "forks": 0}, [])

    stream = keys.events(run_id)
    entries = leases.client.xrange(stream)
    answer_saved = next(
        i
        for i, fields in entries
        if (e := json.loads(fields[b"e"]))["kind"] == "step_saved" and e["cursor"] == "answer"
    )
    close = next(h for h in store.history(run_id) if h["cursor"] == "close")
    where = {"cursor": "close", "visit": close["visit"], "attempt": close["epoch"]}
    leases.client.delete(stream)  # written again without it (an XDEL reads as a trim)
    for i, fields in entries:
        if i != answer_saved:
            leases.client.xadd(stream, {"e": fields[b"e"]})
    lie = encode("attempt_abandoned", where, cursor="close", visit=0, attempt=9, seq=1)
    leases.client.xadd(stream, {"e": lie[1:]})  # without its emit flag, as emit.lua writes
    section, problems, _ = record.streams(db, url, grace=0)
    assert section["mismatches"] == 1
    [problem] = problems
    assert f"run {run_id}'s stream does not match its step history" in problem
    assert "no step_saved for seq 0 'answer' visit 0" in problem
    assert f"attempt_abandoned for saved seq 1 'close' visit 0 attempt {close['epoch']}" in problem

    for checkpoint_id, parent in (("c1", None), ("c2", "c1"), ("c3", "c1")):
        sql("INSERT INTO graph_checkpoints (thread_id, ns, checkpoint_id, parent_id, type,"
            " checkpoint) VALUES (%s, '', %s, %s, 'json', '\\x00')", run_id, checkpoint_id,
            parent)  # fmt: skip
    graph, problems = record.forks(db)
    assert graph == {"threads": 1, "forks": 1}
    assert problems == [f"run {run_id}: graph checkpoint c1 has 2 children: the thread forked"]


silent = workflow("chaos_silent_save")
_CUT_IN_TALK = {"armed": False}


class _Cut(BaseException):
    """The worker gone at this point (its SIGKILL, played in this process)."""


@silent.step()
def talk(ctx: Context) -> StepResult:
    ctx.emit("progress", {"i": 0})
    if _CUT_IN_TALK["armed"]:
        _CUT_IN_TALK["armed"] = False
        raise _Cut
    return StepResult(cursor="end")


@silent.step()
def end(ctx: Context) -> StepResult:
    return StepResult(cursor=DONE)


class _CutAfterCommit(Middleware):
    def after_step(self, cp: Any, *, saved: Any, exception: Any, seconds: float) -> None:
        if saved is not None and cp.cursor == "talk":
            raise _Cut


@pytest.mark.parametrize("told_before", [True, False], ids=["after-a-told-attempt", "first"])
def test_the_stream_tells_a_step_saved_by_an_attempt_whose_events_never_reached_redis(
    told_before: bool, settings: Settings, store: PgStore, leases: Leases
) -> None:
    """What `cairn chaos invoice` found once it held streams against the history (about
    1 run in 8 of 200 before the fix): an attempt that saved a step and died before any
    of its events reached Redis (the outbox lingers 5 ms; a fresh pool process is slower)
    must still be told by the worker that takes the run over. (after-a-told-attempt)
    Attempt 1 writes its events and dies mid-step; attempt 2 saves `talk` and dies right
    after the commit with none of its events sent; attempt 3 takes the run over and ends
    it. (first) Attempt 1 is the silent one. events=None plays the outbox killed before
    its thread sent anything. The check chaos runs finds the stream as the history."""
    outbox = Outbox(RedisEvents(leases.client), settings)
    deps = loop.Deps(settings=settings, store=store, leases=leases, model=None, events=outbox)
    store.create_run("silent-1", "chaos_silent_save", {})
    if told_before:
        _CUT_IN_TALK["armed"] = True
        with pytest.raises(_Cut):
            loop.run("silent-1", deps)
    quiet = dataclasses.replace(deps, events=None, middleware=Chain([_CutAfterCommit()]))
    with pytest.raises(_Cut):
        loop.run("silent-1", quiet)
    assert loop.run("silent-1", deps) == RunStatus.DONE
    _, problems, _ = record.streams(settings.database_url, settings.redis_url, grace=0)
    assert problems == []


def test_chaos_of_a_demo_whose_extra_is_missing_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "langgraph", None)  # import langgraph: ImportError
    app = typer.Typer()
    chaos_cli.register(app)

    @app.callback()
    def _root() -> None:
        pass

    result = CliRunner().invoke(app, ["chaos", "graph_agent", "--runs", "1"])
    assert result.exit_code == 2, result.output
    assert "the demo 'graph_agent' needs langgraph: pip install 'cairn[langgraph]'" in result.output


def test_a_pause_taken_over_is_one_whose_run_a_new_owner_claimed_meanwhile() -> None:
    rows = [
        _row(1, "r", "claim", 0, 1),
        _row(5, "r", "claim", 0, 2),  # a new owner at t=5, while the holder is stopped
        _row(9, "q", "claim", 0, 3),
    ]
    log = [
        {"runs": ["r"], "ts": 2.0, "resumed": 6.0},  # taken over while paused
        {"runs": ["q"], "ts": 2.0, "resumed": 6.0},  # woke before anyone claimed it
    ]
    assert pauses.taken_over(log, rows) == 1


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
