"""`cairn deploy check`: live runs replayed on new code, each code a module of its own,
checked by the real CLI in a process of its own against runs left mid-step in Postgres."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from cairn.core.errors import RetryLater
from cairn.core.status import RunStatus
from cairn.store import PgStore
from cairn.workers import loop
from tests.helpers.services import ROOT

DEAD = "http://127.0.0.1:9"  # no mail API there: a send fails, Transient

# The code the runs started on: a first step, then one of three journaled calls whose
# run stops after the second is recorded (a Transient), as a deploy would find it.
V1 = """
import cairn
from cairn import Transient

flow = cairn.workflow("deploy_check_demo")


def lookup(what):
    return {"what": what}


@flow.step()
def start(ctx):
    return cairn.StepResult(cursor="fetch", state={"order": ctx.input["order"]})


@flow.step()
def fetch(ctx):
    a = ctx.call("customer", lookup, ctx.state["order"])
    b = ctx.call("items", lookup, a["what"])
    if ctx.input.get("stop"):
        raise Transient("the deploy comes")
    ctx.call("total", lookup, b["what"])
    return cairn.StepResult(cursor="done")
"""

HEAD = """
import cairn

def lookup(what):
    return {"what": what}

"""

# New code, and what the check must say of it.
VERSIONS = {
    # A call added after the recorded ones, a step added after: both fine.
    "same": (
        True,
        """
flow = cairn.workflow("deploy_check_demo")

@flow.step()
def start(ctx):
    return cairn.StepResult(cursor="fetch", state={"order": ctx.input["order"]})

@flow.step()
def fetch(ctx):
    a = ctx.call("customer", lookup, ctx.state["order"])
    b = ctx.call("items", lookup, a["what"])
    ctx.call("tax", lookup, 1)
    ctx.call("total", lookup, b["what"])
    return cairn.StepResult(cursor="ship")

@flow.step()
def ship(ctx):
    return cairn.StepResult(cursor="done")
""",
        "",
    ),
    # A rename declared: the visit in flight goes on under the name it began as.
    "renamed_with_entry": (
        True,
        """
flow = cairn.workflow("deploy_check_demo", renamed={"fetch": "gather"})

@flow.step()
def start(ctx):
    return cairn.StepResult(cursor="gather", state={"order": ctx.input["order"]})

@flow.step()
def gather(ctx):
    a = ctx.call("customer", lookup, ctx.state["order"])
    ctx.call("items", lookup, a["what"])
    return cairn.StepResult(cursor="done")
""",
        "",
    ),
    "reordered": (
        False,
        """
flow = cairn.workflow("deploy_check_demo")

@flow.step()
def start(ctx):
    return cairn.StepResult(cursor="fetch", state={"order": ctx.input["order"]})

@flow.step()
def fetch(ctx):
    b = ctx.call("items", lookup, 1)
    ctx.call("customer", lookup, b["what"])
    return cairn.StepResult(cursor="done")
""",
        "call 0 is 'items' in this attempt but the journal recorded 'customer'",
    ),
    "call_renamed": (
        False,
        """
flow = cairn.workflow("deploy_check_demo")

@flow.step()
def start(ctx):
    return cairn.StepResult(cursor="fetch", state={"order": ctx.input["order"]})

@flow.step()
def fetch(ctx):
    a = ctx.call("customer", lookup, ctx.state["order"])
    ctx.call("line_items", lookup, a["what"])
    return cairn.StepResult(cursor="done")
""",
        "call 1 is 'line_items' in this attempt but the journal recorded 'items'",
    ),
    "step_renamed": (
        False,
        """
flow = cairn.workflow("deploy_check_demo")

@flow.step()
def start(ctx):
    return cairn.StepResult(cursor="gather", state={"order": ctx.input["order"]})

@flow.step()
def gather(ctx):
    return cairn.StepResult(cursor="done")
""",
        "has no step 'fetch': it was renamed or removed",
    ),
    "state_field_gone": (
        False,
        """
flow = cairn.workflow("deploy_check_demo")

@flow.step()
def start(ctx):
    return cairn.StepResult(cursor="fetch", state={"order_id": ctx.input["order"]})

@flow.step()
def fetch(ctx):
    a = ctx.call("customer", lookup, ctx.state["order_id"])
    ctx.call("items", lookup, a["what"])
    return cairn.StepResult(cursor="done")
""",
        "the step raised KeyError: 'order_id'",
    ),
    "calls_skipped": (
        False,
        """
flow = cairn.workflow("deploy_check_demo")

@flow.step()
def start(ctx):
    return cairn.StepResult(cursor="fetch", state={"order": ctx.input["order"]})

@flow.step()
def fetch(ctx):
    ctx.call("customer", lookup, ctx.state["order"])
    return cairn.StepResult(cursor="done")
""",
        "the step returned after 1 of the 2 calls its journal recorded",
    ),
}


@pytest.fixture
def live(deps: loop.Deps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Three runs of V1 left inside `fetch` with two calls recorded, one pending run."""
    (tmp_path / "deploy_check_v1.py").write_text(V1)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("deploy_check_v1")
    ids = []
    for i in range(3):
        run_id = f"dc-{i}-{time.time_ns()}"
        deps.store.create_run(run_id, "deploy_check_demo", {"order": i, "stop": True})
        with pytest.raises(RetryLater):
            loop.run(run_id, deps)
        ids.append(run_id)
    deps.store.create_run(f"dc-new-{time.time_ns()}", "deploy_check_demo", {"order": 9})
    return ids


def _check(tmp_path: Path, settings: Any, name: str, *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / f"deploy_check_{name}.py").write_text(HEAD + textwrap.dedent(VERSIONS[name][1]))
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
        "CAIRN_DATABASE_URL": settings.database_url,
        "CAIRN_REDIS_URL": settings.redis_url,
        "COLUMNS": "200",
    }
    argv = [sys.executable, "-m", "cairn.cli", "deploy", "check"]
    argv += ["--workflows", f"deploy_check_{name}", *extra]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)


@pytest.mark.parametrize("name", list(VERSIONS))
def test_the_check_names_each_run_new_code_would_break(
    live: list[str], store: PgStore, settings: Any, tmp_path: Path, name: str
) -> None:
    ok, _, says = VERSIONS[name]
    before = {r: store.load(r) for r in live}
    done = _check(tmp_path, settings, name, "--json")
    assert done.returncode == (0 if ok else 1), done.stderr
    report = json.loads(done.stdout)
    assert report["checked"] == 4 and report["broken"] == (0 if ok else 3), report
    mid = [r for r in report["runs"] if r["run_id"] in live]
    assert all(r["ok"] is ok and says in r["problem"] for r in mid), mid
    if ok:
        assert all(r["replayed"] == 2 == r["recorded"] for r in mid), mid
    served = {"reordered": 0, "call_renamed": 1}  # the calls before the diverging one
    if name in served:
        assert all(r["replayed"] == served[name] for r in mid), mid
    # Nothing written: the runs stand as they were, their journals as they were.
    for run_id, cp in before.items():
        assert store.load(run_id) == cp
        assert [c.name for c in store.journal(run_id, "fetch", 0)] == ["customer", "items"]


def test_the_plain_report_names_the_run_and_why_in_a_line(
    live: list[str], settings: Any, tmp_path: Path
) -> None:
    done = _check(tmp_path, settings, "reordered", "--run", live[0])
    assert done.returncode == 1
    assert f"{live[0]} deploy_check_demo.fetch: step 'fetch' of run" in done.stderr
    assert done.stdout.strip() == "1 of 1 live run(s) would break on this code"
    fine = _check(tmp_path, settings, "same", "--run", live[0], "--run", live[1])
    assert fine.returncode == 0, fine.stderr
    assert (
        fine.stdout.strip()
        == "ok: 2 live run(s) go on with this code (4 recorded call(s) replayed)"
    )
    missing = _check(tmp_path, settings, "same", "--run", "no-such-run")
    assert missing.returncode == 2 and "no run 'no-such-run'" in missing.stderr
    assert "Traceback" not in missing.stderr
    assert store_status(settings, live) == {RunStatus.RUNNING}


def store_status(settings: Any, ids: list[str]) -> set[str]:
    import psycopg

    with psycopg.connect(settings.database_url) as conn:
        rows = conn.execute("SELECT status FROM checkpoints WHERE run_id = ANY(%s)", (ids,))
        return {r[0] for r in rows}


RENAMED = """
import cairn
from cairn import Transient

flow = cairn.workflow("deploy_rename_demo")
MADE = []
STOP = True


def lookup(what):
    MADE.append((what, cairn.current().idempotency_key()))
    return {"what": what}


@flow.step()
def start(ctx):
    return cairn.StepResult(cursor="fetch")


@flow.step()
def fetch(ctx):
    ctx.call("customer", lookup, "c")
    ctx.call("items", lookup, "i")
    if STOP:
        raise Transient("the deploy comes")
    ctx.call("total", lookup, "t")
    return cairn.StepResult(cursor="done")
"""


def test_a_step_renamed_while_a_run_is_inside_it_goes_on_with_nothing_made_twice(
    deps: loop.Deps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "deploy_rename_v1.py").write_text(RENAMED)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = importlib.import_module("deploy_rename_v1")
    run_id = f"rn-{time.time_ns()}"
    deps.store.create_run(run_id, "deploy_rename_demo", {})
    with pytest.raises(RetryLater):
        loop.run(run_id, deps)
    # The deploy: `fetch` is `gather` now, declared renamed, and the step goes through.
    flow = code.flow
    flow.steps["gather"], flow.retries["gather"] = flow.steps.pop("fetch"), flow.retries["fetch"]
    flow.renamed["fetch"] = "gather"
    code.STOP = False
    assert loop.run(run_id, deps) == RunStatus.DONE
    key = f"cairn:{run_id}:fetch:0"
    assert code.MADE == [
        ("c", f"{key}:customer:0"),
        ("i", f"{key}:items:0"),
        ("t", f"{key}:total:0"),  # the visit's own keys, under the name it began as
    ]
    steps = [(h["cursor"], h["outcome"]) for h in deps.store.history(run_id)]
    assert steps[-1] == ("gather", "saved")


def _cairn(tmp_path: Path, database_url: str, *argv: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
        "CAIRN_DATABASE_URL": database_url,
        "CAIRN_CLIENT_GIVE_UP_AFTER": "1",
        "COLUMNS": "200",
    }
    argv = (sys.executable, "-m", "cairn.cli", *argv)
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)


def test_exported_runs_are_checked_with_no_database(
    live: list[str], settings: Any, tmp_path: Path
) -> None:
    exported = tmp_path / "runs.jsonl"
    done = _cairn(tmp_path, settings.database_url, "runs", "export", str(exported))
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == f"exported 4 run(s) to {exported}"
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    journals = {r["run_id"]: [c["name"] for c in r["journal"]] for r in lines}
    assert {r: journals[r] for r in live} == {r: ["customer", "items"] for r in live}
    # CI: no Postgres at all, and the same verdicts as against the live runs.
    nowhere = "postgresql://postgres@127.0.0.1:9/none"
    for name in ("same", "renamed_with_entry", "reordered", "calls_skipped"):
        ok, _, says = VERSIONS[name]
        (tmp_path / f"deploy_check_{name}.py").write_text(HEAD + textwrap.dedent(VERSIONS[name][1]))
        argv = ["deploy", "check", "--runs", str(exported), "--workflows", f"deploy_check_{name}"]
        checked = _cairn(tmp_path, nowhere, *argv, "--json")
        assert checked.returncode == (0 if ok else 1), (name, checked.stderr)
        report = json.loads(checked.stdout)
        assert report["checked"] == 4 and report["broken"] == (0 if ok else 3), report
        mid = [r for r in report["runs"] if r["run_id"] in live]
        assert all(r["ok"] is ok and says in r["problem"] for r in mid), mid
        assert all(r["recorded"] == 2 for r in mid), mid
    one = _cairn(tmp_path, nowhere, *argv, "--run", live[1])
    assert one.returncode == 1 and one.stdout.strip().startswith("1 of 1 ")


def test_an_export_by_id_workflow_status_or_sample(
    live: list[str], settings: Any, tmp_path: Path
) -> None:
    def exported(*argv: str) -> list[str]:
        done = _cairn(tmp_path, settings.database_url, "runs", "export", "-", *argv)
        assert done.returncode == 0, done.stderr
        return [json.loads(line)["run_id"] for line in done.stdout.splitlines()]

    assert exported("--run", live[2]) == [live[2]]
    pending = exported("--status", "pending", "--workflow", "deploy_check_demo")
    assert len(pending) == 1 and pending[0].startswith("dc-new-")
    assert exported("--status", "done") == []
    sample = exported("--sample", "2")
    assert len(sample) == 2 and len(set(sample)) == 2
    missing = _cairn(tmp_path, settings.database_url, "runs", "export", "-", "--run", "nope")
    assert missing.returncode == 2 and "no run 'nope'" in missing.stderr
    # A file is whole or not there: never a part of the runs asked for.
    half = tmp_path / "half.jsonl"
    argv = ["runs", "export", str(half), "--run", live[0], "--run", "nope"]
    assert _cairn(tmp_path, settings.database_url, *argv).returncode == 2
    assert sorted(p.name for p in tmp_path.glob("half*")) == []
    nowhere = _cairn(tmp_path, settings.database_url, "runs", "export", "/no/such/dir/r.jsonl")
    assert nowhere.returncode == 2 and "cannot write /no/such/dir/r.jsonl" in nowhere.stderr


def test_a_file_that_is_not_an_export_is_one_line_of_error(tmp_path: Path) -> None:
    nowhere = "postgresql://postgres@127.0.0.1:9/none"
    (tmp_path / "notes.txt").write_text("hello\n")
    for path, says in (
        (tmp_path / "notes.txt", "notes.txt:1 is not JSON"),
        (tmp_path / "gone.jsonl", "cannot read"),
    ):
        done = _cairn(tmp_path, nowhere, "deploy", "check", "--runs", str(path))
        assert done.returncode == 2 and says in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_checkpoint_this_code_cannot_read_is_broken_live_and_exported(
    live: list[str], settings: Any, tmp_path: Path, sql: Any
) -> None:
    sql("UPDATE checkpoints SET version = 9 WHERE run_id = %s", live[0])
    exported = tmp_path / "runs.jsonl"
    out = _cairn(tmp_path, settings.database_url, "runs", "export", str(exported), "--run", live[0])
    assert out.returncode == 0, out.stderr
    for where in (["--run", live[0]], ["--runs", str(exported)]):
        done = _check(tmp_path, settings, "same", *where, "--json")
        assert done.returncode == 1, done.stderr
        [run] = json.loads(done.stdout)["runs"]
        assert run["run_id"] == live[0] and not run["ok"], run
        assert "payload version 9" in run["problem"], run


def test_the_agent_demos_version_2_passes_the_check_and_its_reordered_variant_is_caught(
    deps: loop.Deps, settings: Any, store: PgStore
) -> None:
    """The demo `cairn chaos --deploy` swaps in: version 2 (a renamed step, a call after
    the recorded ones, a migrated state field) goes on with runs version 1 left inside
    `work`; its reordered variant (the added call first) breaks each of them."""
    import dataclasses

    import cairn.testing.demos.agent  # noqa: F401  (version 1, as the runs' workers had)

    # The mail API down: each run stops inside `work` at its first notify, three model
    # calls recorded (a Transient is not).
    down = dataclasses.replace(deps, settings=dataclasses.replace(settings, mail_url=DEAD))
    ids = []
    for i in range(2):
        run_id = f"dc-agent-{i}-{time.time_ns()}"
        store.create_run(run_id, "agent", {"topic": "deploys", "email": f"a{i}@example.com"})
        with pytest.raises(RetryLater):
            loop.run(run_id, down)
        assert [c.name for c in store.journal(run_id, "work", 0)] == ["model"] * 3
        ids.append(run_id)
    runs = [a for run_id in ids for a in ("--run", run_id)]
    env = {**os.environ, "CAIRN_DATABASE_URL": settings.database_url, "COLUMNS": "200"}
    for module, code in (("agent_v2", 0), ("agent_v2_reordered", 1)):
        argv = [sys.executable, "-m", "cairn.cli", "deploy", "check", "--json"]
        argv += ["--workflows", f"cairn.testing.demos.{module}", *runs]
        done = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=60, check=False
        )
        assert done.returncode == code, done.stderr
        report = json.loads(done.stdout)
        assert report["broken"] == 2 * code, report
        if code:
            assert all("call 0 is 'stamp'" in r["problem"] for r in report["runs"]), report
            assert all("recorded 'model'" in r["problem"] for r in report["runs"]), report
        else:
            assert all(r["replayed"] == 3 for r in report["runs"]), report
    assert store_status(settings, ids) == {RunStatus.RUNNING}
