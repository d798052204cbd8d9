"""`cairn deploy check` replays runs that have no journal yet: a run waiting at a step's
start (for a signal, or a sleep's end), one woken by its signal and not run yet, and one
pending that never started. Each is replayed on its upgraded state up to its first call,
effect or write, as a worker would run it after the deploy; a waiting run's timeout step
too; and a run waiting for a signal is held to the step that made it wait, replayed on
that visit's journal. The real CLI, in a process of its own, against runs the loop left in
Postgres; the mail stand-in and the database say nothing was sent or written."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cairn.client.client import Client
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.store import PgStore
from cairn.testing.standins import MailServer
from cairn.workers import loop
from tests.helpers.services import ROOT

# The code the runs started on. `ask` makes a journaled call, then waits for a payment
# (or, after an hour, reminds); `charge` reads the state and the payment, then mails.
V1 = """
import os

import httpx

import cairn

flow = cairn.workflow("deploy_wait_demo")


def lookup(what):
    return {"what": what}


def send(to):
    key = cairn.current().idempotency_key()
    url = os.environ["DEPLOY_MAIL_URL"] + "/v1/send"
    return httpx.post(url, json={"to": to}, headers={"Idempotency-Key": key}).json()


@flow.step()
def start(ctx):
    state = {"order": ctx.input["order"]}
    if ctx.input.get("nap"):
        return cairn.StepResult(cursor="charge", sleep=3600, state=state)
    return cairn.StepResult(cursor="ask", state=state)


@flow.step()
def ask(ctx):
    ctx.call("quote", lookup, ctx.state["order"])
    return cairn.StepResult.wait("payment", cursor="charge", timeout=3600, on_timeout="remind")


@flow.step()
def charge(ctx):
    order = ctx.state["order"]
    paid = ctx.signal["amount_cents"] if ctx.signal is not None else 0
    ctx.call("receipt", send, f"{order}@example.com")
    return cairn.StepResult(cursor="done", state={"paid": paid})


@flow.step()
def remind(ctx):
    ctx.call("reminder", send, f"{ctx.state['order']}@example.com")
    return cairn.StepResult(cursor="done")
"""

READS_CUSTOMER = (
    '    order = ctx.state["order"]\n    paid',
    '    order = ctx.state["customer"]\n    paid',
)
UPGRADED = (
    'flow = cairn.workflow("deploy_wait_demo")\n',
    (
        'flow = cairn.workflow("deploy_wait_demo", version=2)\n\n\n'
        "@flow.migration(from_version=1)\n"
        "def _customer(state):\n"
        '    return {**state, "customer": f"c-{state[\'order\']}"}\n'
    ),
)

# New code: its edits of V1, the runs it breaks (by their role) and what the check says.
VERSIONS: dict[str, tuple[list[tuple[str, str]], set[str], str]] = {
    # The KeyError the issue found: `charge` reads a field the runs' state lacks.
    "field_missing": (
        [READS_CUSTOMER],
        {"waiting", "signalled", "sleeping"},
        "the step raised KeyError: 'customer'",
    ),
    # The same code with a migration that adds the field: every run goes on.
    "upgraded": ([READS_CUSTOMER, UPGRADED], set(), ""),
    "signal_renamed": (
        [('wait("payment"', 'wait("paid"')],
        {"waiting"},
        (
            "the run waits for signal 'payment', and this code's step 'ask' (replayed on its "
            "journal) waits for 'paid' instead"
        ),
    ),
    "step_removed": (
        [("def charge(ctx)", "def bill(ctx)"), ('cursor="charge"', 'cursor="bill"')],
        {"waiting", "signalled", "sleeping"},
        "has no step 'charge': it was renamed or removed",
    ),
    "timeout_step_removed": (
        [(', on_timeout="remind"', ""), ("@flow.step()\ndef remind", "def remind")],
        {"waiting"},
        "on its wait's timeout: workflow 'deploy_wait_demo' has no step 'remind'",
    ),
    "start_broken": (
        [('ctx.input["order"]}', 'ctx.input["order_id"]}')],
        {"pending"},
        "the step raised KeyError: 'order_id'",
    ),
    "payload_renamed": (
        [('ctx.signal["amount_cents"]', 'ctx.signal["amount"]')],
        {"signalled"},
        "the step raised KeyError: 'amount'",
    ),
}
STEP = {"start_broken": "start", "signal_renamed": "ask", "timeout_step_removed": "remind"}


@pytest.fixture
def runs(deps: loop.Deps, store: PgStore, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:  # fmt: skip
    """V1's runs, by role: waiting for its payment at `charge`'s start, woken by it and
    not run yet, sleeping before `charge`, and pending (never started)."""
    (tmp_path / "deploy_wait_v1.py").write_text(V1)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("deploy_wait_v1")
    stamp = time.time_ns()
    ids = {role: f"dw-{role}-{stamp}" for role in ("waiting", "signalled", "sleeping", "pending")}
    for role, run_id in ids.items():
        store.create_run(run_id, "deploy_wait_demo", {"order": role, "nap": role == "sleeping"})
        if role != "pending":
            assert loop.run(run_id, deps) == RunStatus.WAITING
    with Client(settings=settings, store=store, send=lambda r, p: None) as client:
        assert client.signal(ids["signalled"], "payment", {"amount_cents": 4200})
    for role in ("waiting", "sleeping"):
        run = store.get(ids[role])
        assert run is not None and (run.status, run.cursor) == (RunStatus.WAITING, "charge")
    return ids


def _module(tmp_path: Path, name: str) -> str:
    code = V1
    for old, new in VERSIONS[name][0]:
        assert old in code, old
        code = code.replace(old, new)
    (tmp_path / f"deploy_wait_{name}.py").write_text(code)
    return f"deploy_wait_{name}"


def _cairn(tmp_path: Path, database_url: str, mail: MailServer, *argv: str) -> subprocess.CompletedProcess[str]:  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
        "CAIRN_DATABASE_URL": database_url,
        "CAIRN_CLIENT_GIVE_UP_AFTER": "1",
        "DEPLOY_MAIL_URL": mail.url,
        "COLUMNS": "200",
    }
    argv = (sys.executable, "-m", "cairn.cli", *argv)
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)


# What the check may not touch: every row a run has, in every table it writes.
TABLES = ("checkpoints", "runs", "journal", "step_history", "signals", "effects", "window_messages")


def _rows(sql: Any) -> dict[str, list[tuple[Any, ...]]]:
    return {t: sorted(map(repr, sql(f"SELECT * FROM {t}"))) for t in TABLES}  # type: ignore[misc]


def _verdicts(report: dict[str, Any], runs: dict[str, str]) -> dict[str, dict[str, Any]]:
    by_id = {r["run_id"]: r for r in report["runs"]}
    return {role: by_id[run_id] for role, run_id in runs.items()}


@pytest.mark.parametrize("name", list(VERSIONS))
def test_the_check_replays_runs_with_no_journal_and_names_those_new_code_breaks(
    runs: dict[str, str], settings: Settings, sql: Any, mail: MailServer, tmp_path: Path, name: str
) -> None:
    _, broken, says = VERSIONS[name]
    before = _rows(sql)
    argv = ["deploy", "check", "--workflows", _module(tmp_path, name), "--json"]
    done = _cairn(tmp_path, settings.database_url, mail, *argv)
    assert done.returncode == (1 if broken else 0), done.stderr
    report = json.loads(done.stdout)
    assert report["checked"] == 4 and report["broken"] == len(broken), report
    got = _verdicts(report, runs)
    assert {role for role, r in got.items() if not r["ok"]} == broken, got
    for role in broken:
        assert says in got[role]["problem"], got[role]
        assert got[role]["step"] == STEP.get(name, "charge"), got[role]
    # Nothing sent, nothing written: the stand-in saw no request, every row is as it was.
    assert mail.stats()["attempts"] == 0
    assert _rows(sql) == before


def test_a_passing_check_ran_each_step_up_to_its_first_call_or_unsent_signal(
    runs: dict[str, str], settings: Settings, mail: MailServer, tmp_path: Path
) -> None:
    argv = ["deploy", "check", "--workflows", _module(tmp_path, "upgraded"), "--json"]
    done = _cairn(tmp_path, settings.database_url, mail, *argv)
    assert done.returncode == 0, done.stderr
    got = _verdicts(json.loads(done.stdout), runs)
    assert {role: (r["step"], r["stopped_at"]) for role, r in got.items()} == {
        "waiting": ("charge", "the signal it waits for, not sent yet"),
        "signalled": ("charge", "a new call"),  # its payment read, then the receipt
        "sleeping": ("charge", "a new call"),
        "pending": ("start", ""),  # ran to its end: no call in it
    }
    assert mail.stats()["attempts"] == 0
    plain = _cairn(tmp_path, settings.database_url, mail, *argv[:-1])
    assert (
        plain.stdout.strip()
        == "ok: 4 live run(s) go on with this code (0 recorded call(s) replayed)"
    )


def test_the_plain_report_names_the_run_the_step_and_the_error(
    runs: dict[str, str], settings: Settings, mail: MailServer, tmp_path: Path
) -> None:
    argv = ["deploy", "check", "--workflows", _module(tmp_path, "field_missing")]
    done = _cairn(tmp_path, settings.database_url, mail, *argv, "--run", runs["waiting"])
    assert done.returncode == 1
    assert (
        f"{runs['waiting']} deploy_wait_demo.charge: the step raised KeyError: 'customer'"
        in done.stderr
    )
    assert done.stdout.strip() == "1 of 1 live run(s) would break on this code"


def test_exported_waiting_and_pending_runs_get_the_same_verdicts_with_no_database(
    runs: dict[str, str], settings: Settings, mail: MailServer, tmp_path: Path
) -> None:
    exported = tmp_path / "runs.jsonl"
    out = _cairn(tmp_path, settings.database_url, mail, "runs", "export", str(exported))
    assert out.returncode == 0, out.stderr
    lines = {
        json.loads(line)["run_id"]: json.loads(line) for line in exported.read_text().splitlines()
    }
    waiting = lines[runs["waiting"]]
    # The visit that made it wait, and its call: what the check holds the wait to.
    assert waiting["waited_in"] == {"seq": 1, "cursor": "ask", "visit": 0, "outcome": "saved"}
    assert [(c["cursor"], c["name"]) for c in waiting["journal"]] == [("ask", "quote")]
    assert lines[runs["pending"]]["waited_in"] is None
    nowhere = "postgresql://postgres@127.0.0.1:9/none"
    for name in ("signal_renamed", "field_missing", "start_broken", "upgraded"):
        _, broken, says = VERSIONS[name]
        argv = ["deploy", "check", "--runs", str(exported), "--workflows", _module(tmp_path, name)]
        done = _cairn(tmp_path, nowhere, mail, *argv, "--json")
        assert done.returncode == (1 if broken else 0), (name, done.stderr)
        got = _verdicts(json.loads(done.stdout), runs)
        assert {role for role, r in got.items() if not r["ok"]} == broken, (name, got)
        assert all(says in got[role]["problem"] for role in broken), (name, got)
    assert mail.stats()["attempts"] == 0
