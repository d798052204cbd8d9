"""`cairn chaos`'s own logic, with no process started: the kill schedule a pure function
of the seed, and the checks and counts of its report (histories, recovery, duplicates,
streams, pauses, replays). The crews on real workers are tests/fleet/test_chaos.py's.
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
from cairn.testing.chaos import deploy as chaos_deploy
from cairn.testing.chaos import pauses, record
from cairn.testing.demos import agent_parts
from cairn.testing.faults import BOUNDARIES
from cairn.workers import loop
from cairn.workers.middleware import Chain, Middleware
from cairn.workers.outbox import Outbox

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


def test_a_kill_names_every_run_its_process_was_in_a_step_of(tmp_path: Path) -> None:
    # A threads worker runs several steps at once: the kill cuts short a call in flight
    # in each, so the model check allows one per run it names.
    (tmp_path / "killed").mkdir()
    code = (
        "from cairn.testing import faults; "
        f"p = faults.Plan({{'dir': {str(tmp_path)!r}, 'kills': [['a', 2, 'after_effect']]}}); "
        "p.step_started('b'); p.step_started('c'); p.step_ended('c'); p.step_started('a'); "
        "p.hit('after_effect', 'a', 2, 'send')"
    )
    died = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert died.returncode == -9, died.stderr
    [kill] = [r for r in faults.read_journal(str(tmp_path)) if r["e"] == "kill"]
    assert kill["runs"] == ["a", "b"] and kill["run_id"] == "a"
    assert chaos.report._model_check(2 + 2, {"model": 2}, [kill])["excess"] == 0


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


@pytest.mark.parametrize(
    ("workflow", "package", "extra"),
    [("graph_agent", "langgraph", "langgraph"), ("oa_agent", "agents", "openai-agents")],
)
def test_chaos_of_a_demo_whose_extra_is_missing_says_what_to_install(
    workflow: str, package: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # import it: ImportError
    app = typer.Typer()
    chaos_cli.register(app)

    @app.callback()
    def _root() -> None:
        pass

    result = CliRunner().invoke(app, ["chaos", workflow, "--runs", "1"])
    assert result.exit_code == 2, result.output
    assert f"the demo {workflow!r} needs {extra}: pip install 'cairn[{extra}]'" in result.output


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


def test_the_deploy_verdict_counts_versions_and_names_each_incompatible_stop() -> None:
    diverged = (
        "step 'work' of run r3: call 0 is 'stamp' in this attempt but the journal recorded "
        "'model' there; a step must make its journaled calls in the same order every time"
    )
    final = [
        {"run_id": "r1", "status": "done", "cursor": "done", "error": None},
        {"run_id": "r2", "status": "done", "cursor": "done", "error": None},
        {"run_id": "r3", "status": "incompatible", "cursor": "work", "error": diverged},
        {"run_id": "r4", "status": "incompatible", "cursor": "work", "error": ""},
    ]
    versions = [
        {"run_id": "r1", "started_version": "v1", "ended_version": "v1"},
        {"run_id": "r2", "started_version": "v1", "ended_version": "v2"},
        {"run_id": "r3", "started_version": "v1", "ended_version": "v2"},
        {"run_id": "r4", "started_version": "v2", "ended_version": "v2"},
    ]
    swaps = [{"worker": "chaos0", "how": "SIGTERM"}, {"worker": "chaos1", "how": "SIGKILL"}]
    section, problems = chaos_deploy.verdict(final, versions, swaps)
    assert section["started"] == {"v1": 3, "v2": 1}
    assert section["finished"] == {"v1": 1, "v2": 1}  # done runs only
    assert section["crossed"] == 1
    assert section["incompatible_reasons"] == {
        "call 0 is 'stamp' in this attempt but the journal recorded 'model' there": 1,
        "(no reason)": 1,
    }
    assert problems == ["1 run(s) stopped incompatible with no reason (e.g. r4)"]
    # No worker swapped, no run finished by the new code: the deploy did not happen.
    _, problems = chaos_deploy.verdict(final[:1], versions[:1], [{"how": "gone"}])
    assert problems == [
        "the deploy swapped no worker",
        "no run was finished by the new code (v2)",
    ]


def test_an_incompatible_stops_reason_leaves_out_the_run_and_the_advice() -> None:
    assert (
        chaos_deploy.reason_of(
            "run r9: state saved by 'agent' version 2; this code is version 1 and has no "
            "migration for it"
        )
        == "state saved by 'agent' version 2; this code is version 1 and has no migration for it"
    )
    assert (
        chaos_deploy.reason_of(
            "workflow 'agent' has no step 'summarize': it was renamed or removed. Declare "
            "workflow('agent', renamed={'summarize': 'its new name'}) or deploy code"
        )
        == "workflow 'agent' has no step 'summarize': it was renamed or removed"
    )


def test_version_2_of_the_agent_demo_reads_version_1s_state() -> None:
    state = {"notes": ["a", "b"], "sent": [{"email_id": "m1"}]}
    assert agent_parts.upgrade_state(state) == {
        "answers": ["a", "b"],
        "sent": [{"email_id": "m1"}],
    }


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--deploy", "cairn.testing.demos.nosuch"], "--deploy: no module"),
        (["--deploy", "cairn.testing.demos.agent_v2", "--pool", "threads"], "leave --pool out"),
    ],
)
def test_a_deploy_chaos_cannot_run_is_a_one_line_error(args: list[str], error: str) -> None:
    app = typer.Typer()
    chaos_cli.register(app)

    @app.callback()
    def _root() -> None:
        pass

    result = CliRunner().invoke(app, ["chaos", "agent", "--runs", "1", *args])
    assert result.exit_code == 2, result.output
    assert error in result.output and "Traceback" not in result.output
