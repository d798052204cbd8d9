"""Forks, rewinds and renamed steps: going back to a saved step, as a new run or in place,
and a deploy that renames or removes a step live runs stand at. Over HTTP from a real
`cairn serve`: tests/fleet/test_fork.py."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

import tests.helpers.flows  # noqa: F401 (loop: one keyed email a visit)
from cairn.client.client import Client
from cairn.core.errors import InvalidInput, RunNotStopped, UnknownRun
from cairn.core.status import RunStatus
from cairn.steps import Context, StepResult, registry, workflow
from cairn.store import PgStore
from cairn.testing.standins import MailServer
from cairn.workers import loop

# a -> b -> c; c fails until the file named by input "fixed" exists.
mend = workflow("mend")


@mend.step()
def a(ctx: Context) -> StepResult:
    return StepResult(cursor="b", state={"a": ctx.visit})


@mend.step()
def b(ctx: Context) -> StepResult:
    return StepResult(cursor="c", state={"b": ctx.idempotency_key()})


@mend.step()
def c(ctx: Context) -> StepResult:
    if not os.path.exists(ctx.input["fixed"]):
        raise ValueError("c is broken until fixed")
    return StepResult(cursor="done", state={"c": True})


def _keys(mail: MailServer) -> list[str]:
    return [m["idempotency_key"] for m in mail.messages()]


def test_a_fork_from_step_3_reruns_4_to_6_with_new_keys_and_leaves_the_original(
    client: Client, deps: loop.Deps, store: PgStore, mail: MailServer, sql: Any
) -> None:
    original = client.enqueue("loop", {"visits": 6}, run_id="six")
    assert loop.run(original, deps) == RunStatus.DONE
    before = (store.get(original), client.history(original))
    assert len(_keys(mail)) == 6
    fork = client.fork(original, at_seq=3, new_run_id="six-b", input_patch={"note": "again"})
    got = store.load(fork)
    assert got is not None and (got.seq, got.cursor, got.state) == (3, "think", {"n": 3})
    assert got.visits == {"think": 3} and got.input == {"visits": 6, "note": "again"}
    assert loop.run(fork, deps) == RunStatus.DONE
    keys = _keys(mail)
    assert len(keys) == 9 and len(set(keys)) == 9  # three more emails, each its own key
    assert keys[6:] == [f"cairn:six-b:think:{v}" for v in (3, 4, 5)]
    assert (store.get(original), client.history(original)) == before  # untouched
    run = client.get(fork)
    assert run is not None and (run.forked_from, run.forked_at) == ("six", 3)
    assert run.state == {"n": 6} and [f.run_id for f in client.forks("six")] == ["six-b"]
    outcomes = [(h.seq, h.outcome) for h in client.history(fork)]
    assert outcomes == [(2, "forked"), (3, "saved"), (4, "saved"), (5, "saved")]
    # The same new run id again is the same fork: nothing new is made or sent.
    assert client.fork(original, at_seq=3, new_run_id="six-b") == "six-b"
    assert sql("SELECT count(*) FROM runs WHERE forked_from = 'six'") == [(1,)]


def test_a_failed_run_rewound_to_step_2_finishes_with_new_visit_numbers(
    client: Client, deps: loop.Deps, store: PgStore, tmp_path: Path
) -> None:
    fixed = tmp_path / "fixed"
    run_id = client.enqueue("mend", {"fixed": str(fixed)})
    assert loop.run(run_id, deps) == RunStatus.FAILED
    with pytest.raises(InvalidInput, match="saved no checkpoint at seq 7"):
        client.rewind(run_id, to_seq=7)
    fixed.touch()  # the cause fixed, the run goes back to after step a (seq 1): b again
    run = client.rewind(run_id, to_seq=1)
    assert (run.status, run.cursor, run.seq) == ("pending", "b", 3)
    assert loop.run(run_id, deps) == RunStatus.DONE
    done = store.get(run_id)
    assert done is not None and done.state is not None
    # b's second pass is visit 1: a new idempotency key, not the first pass's.
    assert done.state == {"a": 0, "b": f"cairn:{run_id}:b:1", "c": True}
    steps = [(h.cursor, h.visit, h.outcome) for h in client.history(run_id)]
    assert steps == [
        ("a", 0, "saved"), ("b", 0, "saved"), ("c", 0, "failed"), ("b", 0, "rewound"),
        ("b", 1, "saved"), ("c", 1, "saved"),
    ]  # fmt: skip


def test_rewind_refuses_a_run_that_is_not_stopped_and_bad_seqs(
    client: Client, deps: loop.Deps
) -> None:
    run_id = client.enqueue("loop", {"visits": 3})
    with pytest.raises(RunNotStopped, match="is pending: rewind moves a stopped run"):
        client.rewind(run_id, to_seq=1)
    with pytest.raises(InvalidInput, match="whole number >= 1"):
        client.fork(run_id, at_seq=0)
    with pytest.raises(UnknownRun):
        client.fork("no-such-run", at_seq=1)
    with pytest.raises(UnknownRun):
        client.rewind("no-such-run", to_seq=1)


def test_a_renamed_step_takes_its_waiting_runs_and_a_removed_one_stops_them_incompatible(
    client: Client, deps: loop.Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    v1 = registry.Workflow("evolving_wait")
    monkeypatch.setitem(registry._REGISTRY, "evolving_wait", v1)

    @v1.step()
    def park(ctx: Context) -> StepResult:
        return StepResult.wait("go", cursor="finish_old")

    @v1.step()
    def finish_old(ctx: Context) -> StepResult:
        return StepResult(cursor="done", state={"by": "old"})

    waiting = [client.enqueue("evolving_wait", {}) for _ in range(3)]
    assert all(loop.run(r, deps) == RunStatus.WAITING for r in waiting)
    # The deploy: finish_old is now finish.
    v2 = registry.Workflow("evolving_wait", renamed={"finish_old": "finish"})
    v2.step("park")(park)

    @v2.step()
    def finish(ctx: Context) -> StepResult:
        return StepResult(cursor="done", state={"by": "new"})

    monkeypatch.setitem(registry._REGISTRY, "evolving_wait", v2)
    assert v2.missing(["park", "finish_old"]) == []
    for r in waiting:
        client.signal(r, "go")
        assert loop.run(r, deps) == RunStatus.DONE
        assert client.get(r).state == {"by": "new"}  # type: ignore[union-attr]
    # A deploy without the step at all: the run stops as incompatible, naming it.
    v3 = registry.Workflow("evolving_wait")
    v3.step("park")(park)
    monkeypatch.setitem(registry._REGISTRY, "evolving_wait", v3)
    stranded = client.enqueue("evolving_wait", {})
    monkeypatch.setitem(registry._REGISTRY, "evolving_wait", v1)
    assert loop.run(stranded, deps) == RunStatus.WAITING
    monkeypatch.setitem(registry._REGISTRY, "evolving_wait", v3)
    assert v3.missing(["park", "finish_old"]) == ["finish_old"]
    client.signal(stranded, "go")
    assert loop.run(stranded, deps) == RunStatus.INCOMPATIBLE
    run = client.get(stranded)
    assert run is not None and "has no step 'finish_old'" in (run.error or "")


def test_db_check_names_a_step_live_runs_stand_at_that_the_code_lacks(
    client: Client, store: PgStore, sql: Any, worker_env: dict[str, str]
) -> None:
    ok = client.enqueue("loop", {"visits": 2})
    gone = client.enqueue("loop", {"visits": 2})
    sql("UPDATE checkpoints SET cursor = 'thought', status = 'failed' WHERE run_id = %s", gone)
    check = [".venv/bin/cairn", "db", "check", "--workflows", "tests.helpers.flows", "--json"]
    out = subprocess.run(
        check, env=worker_env, capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert report["problems"] == [
        {"workflow": "loop", "step": "thought", "runs": 1, "problem": "no such step"}
    ]
    sql("UPDATE checkpoints SET cursor = 'think' WHERE run_id = %s", gone)
    out = subprocess.run(
        check, env=worker_env, capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0 and json.loads(out.stdout) == {"ok": True, "problems": []}
    assert store.get(ok) is not None


def test_replay_reruns_the_failed_runs_since_a_time_from_their_last_step_once(
    client: Client, deps: loop.Deps, sql: Any, tmp_path: Path
) -> None:
    fixed = tmp_path / "fixed"
    old, *recent = [client.enqueue("mend", {"fixed": str(fixed)}) for _ in range(4)]
    ok = client.enqueue("loop", {"visits": 1})
    assert loop.run(ok, deps) == RunStatus.DONE
    for r in (old, *recent):
        assert loop.run(r, deps) == RunStatus.FAILED
    sql("UPDATE checkpoints SET updated_at = now() - interval '2 hours' WHERE run_id = %s", old)
    since = client.store.clock() - dt.timedelta(hours=1)
    # The dry run lists them, oldest first, as they stopped, and writes nothing.
    listed = client.replay("mend", since=since, dry_run=True)
    assert [r.run_id for r in listed] == recent
    assert {(r.status, r.cursor) for r in listed} == {("failed", "c")}
    assert client.replay("loop", since=since, dry_run=True) == []
    assert {client.get(r).status for r in recent} == {"failed"}  # type: ignore[union-attr]
    fixed.touch()  # the cause fixed (a deploy), then the replay
    seen: list[int] = []
    replayed = client.replay("mend", since=since, limit=2, progress=seen.append)
    assert [r.run_id for r in replayed] == recent[:2] and seen == [2]
    rest = client.replay("mend", since=since)
    assert [r.run_id for r in rest] == recent[2:]
    assert client.replay("mend", since=since) == []  # each run replayed once
    for r in recent:
        assert loop.run(r, deps) == RunStatus.DONE
        steps = [(h.cursor, h.visit, h.outcome) for h in client.history(r)]
        # From its last saved step, c's visit kept: its effects' keys are the first pass's.
        assert steps == [("a", 0, "saved"), ("b", 0, "saved"), ("c", 0, "failed"),
                         ("c", 0, "saved")]  # fmt: skip
    assert client.get(old).status == "failed"  # type: ignore[union-attr]  # before `since`
    with pytest.raises(InvalidInput, match="failed or incompatible runs, not done"):
        client.replay("mend", since=since, status="done")
    with pytest.raises(InvalidInput, match="since must be a datetime with a time zone"):
        client.replay("mend", since=dt.datetime(2026, 1, 1))
    with pytest.raises(InvalidInput, match="limit must be a whole number"):
        client.replay("mend", since=since, limit=0)


def test_the_async_client_forks_rewinds_and_lists_forks(
    client: Client, deps: loop.Deps, settings: Any
) -> None:
    import asyncio

    from cairn.client import AsyncClient

    run_id = client.enqueue("loop", {"visits": 2})
    assert loop.run(run_id, deps) == RunStatus.DONE

    broken = client.enqueue("mend", {"fixed": "/nonexistent"})
    assert loop.run(broken, deps) == RunStatus.FAILED

    async def go() -> tuple[str, Any, list[Any], list[Any], list[Any]]:
        async with AsyncClient(settings=settings) as aclient:
            new = await aclient.fork(run_id, at_seq=1, input_patch={"visits": 3})
            back = await aclient.rewind(run_id, to_seq=1)
            since = aclient.store.clock() - dt.timedelta(minutes=5)
            listed = await aclient.replay("mend", since=since, dry_run=True)
            replayed = await aclient.replay("mend", since=since)
            return new, back, await aclient.forks(run_id), listed, replayed

    new, back, forks, listed, replayed = asyncio.run(go())
    assert [f.run_id for f in forks] == [new] and back.status == "pending"
    assert [r.run_id for r in listed] == [r.run_id for r in replayed] == [broken]
    assert client.get(broken).status == "pending"  # type: ignore[union-attr]
    assert loop.run(new, deps) == RunStatus.DONE
    assert client.get(new).state == {"n": 3}  # type: ignore[union-attr]
