"""The `cairn` command as a user runs it: errors that say what to do, --help everywhere
(a worker started from a user's project: tests/fleet/test_cli.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from cairn.store import PgStore
from tests.helpers.services import ROOT

BIN = Path(sys.executable).parent

# The operations on runs, under `cairn runs`; the first six were top-level commands once.
OLD_SPELLINGS = ["enqueue", "show", "events", "signal", "cancel", "resolve"]
OPERATIONS = ["list", *OLD_SPELLINGS, "steer", "raise-budget", "fork", "rewind", "replay", "export"]

COMMANDS = [
    "worker",
    "beat",
    "serve",
    "runs",
    *(f"runs {op}" for op in OPERATIONS),
    *OLD_SPELLINGS,
    "schedules",
    "schedules add",
    "approvals",
    "approvals list",
    "approvals approve",
    "approvals rule add",
    "settings",
    "db",
    "db upgrade",
    "tokens create",
    "tokens list",
    "tokens revoke",
    "deploy check",
    "deploy status",
    "deploy drain",
    "demo",
    "standin",
    "chaos",
    "chaos mix",
]


def _cairn(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "cairn.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        env=full,
        cwd=ROOT,
        timeout=60,
    )


@pytest.fixture
def cli_env(settings) -> dict[str, str]:
    return {
        "CAIRN_DATABASE_URL": settings.database_url,
        "CAIRN_REDIS_URL": settings.redis_url,
        "CAIRN_WORKFLOWS": "tests.helpers.flows",
    }


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_its_options_and_their_variables(command: str) -> None:
    import click
    from typer.main import get_command

    from cairn import cli

    cli._register_plugins()
    cmd = get_command(cli.app)
    for part in command.split():
        cmd = cmd.commands[part]  # type: ignore[attr-defined]
    result = _cairn(*command.split(), "--help")
    assert result.returncode == 0, result.stderr
    assert (cmd.help or "").split("\n")[0].strip()[:40] in " ".join(result.stdout.split())
    for param in cmd.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert param.opts[0] in result.stdout
            if param.envvar:
                assert f"env var: {param.envvar}" in result.stdout, (command, param.envvar)


def test_enqueue_errors_say_what_to_do(cli_env, store: PgStore) -> None:
    unknown = _cairn("enqueue", "nope", "{}", env=cli_env)
    assert unknown.returncode == 2 and "unknown workflow 'nope'" in unknown.stderr
    assert "CAIRN_WORKFLOWS" in unknown.stderr
    malformed = _cairn("enqueue", "invoice", "{not json", env=cli_env)
    assert malformed.returncode == 2 and "input is not JSON" in malformed.stderr
    invalid = _cairn("enqueue", "invoice", '{"customer": "acme", "email": "x"}', env=cli_env)
    assert invalid.returncode == 2 and "'email' must be an email address" in invalid.stderr
    assert store.list_runs() == []  # nothing was written by any of them


def test_enqueue_prints_the_id_and_an_existing_id_resumes(cli_env, store: PgStore) -> None:
    data = json.dumps({"customer": "acme", "email": "a@example.com"})
    first = _cairn("enqueue", "invoice", data, "--run-id", "order-1", env=cli_env)
    assert first.returncode == 0 and first.stdout.strip() == "order-1"
    again = _cairn("enqueue", "invoice", data, "--run-id", "order-1", env=cli_env)
    assert again.returncode == 0
    assert [r.run_id for r in store.list_runs()] == ["order-1"]


def test_show_prints_a_failed_runs_error_and_runs_lists_it(cli_env, create, deps, sql) -> None:
    from cairn.workers import loop

    run_id = create("bad", {"mode": "raise"}, queue=False)
    loop.run(run_id, deps)
    shown = _cairn("show", run_id, env=cli_env)
    assert shown.returncode == 0 and "RuntimeError: the step blew up" in shown.stdout
    listed = _cairn("runs", env=cli_env)
    assert run_id in listed.stdout and "failed" in listed.stdout
    sql("UPDATE checkpoints SET version = 9")
    foreign = _cairn("show", run_id, env=cli_env)
    assert "payload version 9" in foreign.stdout
    assert _cairn("show", "missing-run", env=cli_env).returncode == 1


def test_postgres_down_is_a_clear_error_not_a_traceback() -> None:
    down = {
        "CAIRN_DATABASE_URL": "postgresql://postgres@127.0.0.1:9/cairn",
        "CAIRN_STORE_GIVE_UP_AFTER": "1",
    }
    result = _cairn("runs", env=down)
    assert result.returncode == 1
    assert "error:" in result.stderr and "127.0.0.1:9 is unreachable" in result.stderr
    assert "Traceback" not in result.stderr


def test_broker_down_at_enqueue_keeps_the_run_and_says_what_to_do(cli_env, store: PgStore) -> None:
    env = {**cli_env, "CAIRN_REDIS_URL": "redis://127.0.0.1:9/0"}
    data = json.dumps({"customer": "acme", "email": "a@example.com"})
    result = _cairn("enqueue", "invoice", data, "--run-id", "r-1", env=env)
    assert result.returncode == 2 and "broker is unreachable" in result.stderr
    assert [r.run_id for r in store.list_runs()] == ["r-1"]  # recorded, resumable


def test_json_of_enqueue_signal_cancel_and_the_time_filters(cli_env) -> None:
    data = json.dumps({"customer": "acme", "email": "a@example.com"})
    made = _cairn("enqueue", "invoice", data, "--run-id", "j-1", "--json", env=cli_env)
    assert json.loads(made.stdout) == {"run_id": "j-1"}
    sent = _cairn("signal", "j-1", "payment", '{"a": 1}', "--id", "x", "--json", env=cli_env)
    assert json.loads(sent.stdout) == {"run_id": "j-1", "event": "payment", "stored": True}
    again = _cairn("signal", "j-1", "payment", '{"a": 1}', "--id", "x", "--json", env=cli_env)
    assert json.loads(again.stdout)["stored"] is False
    cancelled = _cairn("cancel", "j-1", "--json", env=cli_env)
    assert json.loads(cancelled.stdout)["run"]["status"] == "cancelled"
    later = _cairn("runs", "--json", "--since", "2999-01-01", env=cli_env)
    assert json.loads(later.stdout) == {"runs": [], "totals": {"cancelled": 1}, "next_after": None}
    span = _cairn("runs", "--json", "--since", "2000-01-01", "--until", "2999-01-01", env=cli_env)
    assert [r["run_id"] for r in json.loads(span.stdout)["runs"]] == ["j-1"]


def test_steer_stores_a_message_and_says_what_went_wrong_in_one_line(cli_env, store) -> None:
    store.create_run("s-1", "probe", {}, "one")
    out = _cairn("runs", "steer", "s-1", "also check the date", "--json", env=cli_env)
    assert json.loads(out.stdout) == {"run_id": "s-1", "n": 1}
    chat = '{"role": "user", "content": "hi"}'
    out = _cairn("runs", "steer", "s-1", chat, "--json-message", "--json", env=cli_env)
    assert json.loads(out.stdout)["n"] == 2
    assert store.steers_pending("s-1") == [
        (1, "also check the date"),
        (2, {"role": "user", "content": "hi"}),
    ]
    bad = _cairn("runs", "steer", "s-1", "{not json", "--json-message", env=cli_env)
    assert bad.returncode == 2 and "message is not JSON" in bad.stderr
    gone = _cairn("runs", "steer", "nope", "hi", env=cli_env)
    assert gone.returncode == 2 and "no run 'nope'" in gone.stderr
    _cairn("cancel", "s-1", env=cli_env)
    ended = _cairn("runs", "steer", "s-1", "too late", env=cli_env)
    assert ended.returncode == 2 and "has ended" in ended.stderr
    for failed in (bad, gone, ended):
        assert "Traceback" not in failed.stderr and len(failed.stderr.strip().splitlines()) == 1


def test_resolve_settles_an_unknown_run(cli_env, store: PgStore) -> None:
    from cairn.core.status import RunStatus

    store.create_run("u-1", "probe", {}, "one")
    cp = store.claim("u-1", 1)
    assert cp is not None and store.record_intent(cp, "k-1") == ("written", None)
    store.end_attempt(cp, RunStatus.UNKNOWN, "outcome unknown")
    bad = _cairn("resolve", "u-1", "--done", "--result", "{not json", env=cli_env)
    assert bad.returncode != 0 and "--result is not JSON" in bad.stderr
    out = _cairn("resolve", "u-1", "--not-done", "--json", env=cli_env)
    assert json.loads(out.stdout)["resolved"] == ["k-1"]
    assert json.loads(out.stdout)["run"]["status"] == "pending"
    assert store.open_intents("u-1") == [] and store.was_done("k-1") == (False, None)


def test_events_follows_a_run_as_text_and_as_json_lines(cli_env, settings, store) -> None:
    import cairn.testing.demos.chat  # noqa: F401  (registers chat here, as a worker does)
    from cairn.steps.model import ModelClient
    from cairn.store.events import RedisEvents
    from cairn.store.lease import Leases
    from cairn.workers import loop
    from cairn.workers.outbox import Outbox

    store.create_run("ev-cli", "chat", {"prompt": "REPLY: one two three", "max_tokens": 9})
    leases = Leases.from_url(settings.redis_url)
    outbox = Outbox(RedisEvents(leases.client), settings)
    model = ModelClient(base_url=settings.anthropic_base_url)
    deps = loop.Deps(settings=settings, store=store, leases=leases, model=model, events=outbox)
    assert loop.run("ev-cli", deps) == "done"
    model.close()
    outbox.flush()
    lines = _cairn("events", "ev-cli", "--json", env=cli_env).stdout.splitlines()
    kinds = [json.loads(line)["kind"] for line in lines]
    assert kinds[0] == "step_started" and kinds[-1] == "run_ended" and "step_saved" in kinds
    text = _cairn("events", "ev-cli", "--after", json.loads(lines[0])["id"], env=cli_env)
    assert "step_started" not in text.stdout and "run_ended" in text.stdout
    assert "one two three" in text.stdout  # the tokens, as one line of text
    missing = _cairn("events", "no-such-run", env=cli_env)
    assert missing.returncode == 2 and "no run 'no-such-run'" in missing.stderr
    leases.client.close()


def _listed(help_text: str) -> set[str]:
    """The commands a --help lists: the first word of each row of its Commands box."""
    box = help_text.split("Commands", 1)[1] if "Commands" in help_text else ""
    return set(re.findall(r"^│ (\S+) ", box, re.MULTILINE))


def test_runs_help_lists_every_operation_and_the_root_help_the_group_only() -> None:
    runs = _cairn("runs", "--help")
    assert runs.returncode == 0, runs.stderr
    assert _listed(runs.stdout) == set(OPERATIONS)
    assert "--status" in runs.stdout  # `cairn runs` alone still lists, with its filters
    root = _cairn("--help").stdout
    assert "runs" in _listed(root)
    assert not _listed(root) & set(OLD_SPELLINGS)  # the old spellings are hidden


@pytest.mark.parametrize("old", OLD_SPELLINGS)
def test_an_old_spelling_takes_the_same_arguments_and_options(old: str) -> None:
    def usage(*argv: str) -> list[str]:
        done = _cairn(*argv, "--help")
        assert done.returncode == 0, done.stderr
        return [line.rstrip() for line in done.stdout.splitlines()]

    assert usage(old) == [
        line.replace(f"cairn runs {old}", f"cairn {old}") for line in usage("runs", old)
    ]


def test_the_old_spellings_print_what_the_new_ones_do(cli_env, store: PgStore) -> None:
    data = json.dumps({"customer": "acme", "email": "a@example.com"})
    enqueued = [
        _cairn(*where, "invoice", data, "--run-id", "al-1", "--json", env=cli_env)
        for where in (["runs", "enqueue"], ["enqueue"])
    ]
    assert [e.stdout for e in enqueued] == ['{"run_id": "al-1"}\n'] * 2
    # Each twice first where the first call changes the run: the pair compared sees one state.
    _cairn("runs", "signal", "al-1", "payment", "{}", "--id", "s-1", env=cli_env)
    _cairn("runs", "cancel", "al-1", env=cli_env)
    for argv in (
        ["show", "al-1"],
        ["show", "al-1", "--json"],
        ["events", "al-1", "--json", "--timeout", "1"],
        ["signal", "al-1", "payment", "{}", "--id", "s-1", "--json"],
        ["cancel", "al-1"],
        ["resolve", "al-1", "--not-done"],
        ["show", "no-such-run"],
    ):
        new = _cairn("runs", *argv, env=cli_env)
        old = _cairn(*argv, env=cli_env)
        assert (old.returncode, old.stdout, old.stderr) == (
            new.returncode,
            new.stdout,
            new.stderr,
        ), argv
        assert new.stdout or new.stderr, argv  # something to compare


def test_runs_list_is_runs(cli_env, store: PgStore) -> None:
    store.create_run("l-1", "probe", {}, "one")
    for flags in ([], ["--json"], ["--json", "--status", "pending", "--limit", "1"]):
        listed = _cairn("runs", "list", *flags, env=cli_env)
        assert listed.returncode == 0 and "l-1" in listed.stdout, listed.stderr
        assert listed.stdout == _cairn("runs", *flags, env=cli_env).stdout


def test_runs_raise_budget_resumes_the_tree_or_says_why_not(cli_env, client) -> None:
    import tests.helpers.budget_flows  # noqa: F401  (spender)

    run_id = client.enqueue("spender", {}, budget_usd=0.5)
    done = _cairn("runs", "raise-budget", run_id, "--usd", "2", "--json", env=cli_env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["budget"]["limit_usd"] == 2.0
    plain = client.enqueue("spender", {})
    refused = _cairn("runs", "raise-budget", plain, "--usd", "2", env=cli_env)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "has no budget" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1


def test_budgets_set_show_and_delete_a_tenants_budget_or_say_why_not(cli_env) -> None:
    tenant = f"cli-{uuid.uuid4().hex[:8]}"
    made = _cairn("budgets", "set", "--tenant", tenant, "--usd", "50", "--soft", "0.8", env=cli_env)
    assert made.returncode == 0, made.stderr
    assert f"tenant:{tenant} per day since" in made.stdout and "$50.000000" in made.stdout
    _cairn("budgets", "set", "--tenant", tenant, "--per", "month", env=cli_env)
    shown = json.loads(_cairn("budgets", "show", "--tenant", tenant, "--json", env=cli_env).stdout)
    assert shown["budget"]["period"] == "month" and shown["budget"]["limit_usd"] == 50.0
    assert shown["budget"]["period_start"].endswith("-01T00:00:00+00:00")
    for argv, said in (
        (["set", "--tenant", tenant, "--usd", "5", "--per", "week"], "per='week'"),
        (["set", "--tenant", tenant, "--usd", "-1"], "a budget in dollars is a number above 0"),
        (["set", "--usd", "5"], "Missing option '--tenant'"),
        (["set", "--tenant", f"{tenant}-new", "--per", "day"], "a new one needs a limit"),
        (["show", "--tenant", f"{tenant}-none"], "has no budget"),
        (["delete", "--tenant", f"{tenant}-none"], "has no budget to delete"),
    ):
        refused = _cairn("budgets", *argv, env=cli_env)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr, argv
        assert said in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, argv
    gone = _cairn("budgets", "delete", "--tenant", tenant, "--json", env=cli_env)
    assert gone.returncode == 0, gone.stderr
    assert json.loads(gone.stdout)["deleted"]["limit_usd"] == 50.0
    assert _cairn("budgets", "show", "--tenant", tenant, env=cli_env).returncode != 0


@pytest.mark.parametrize("columns", [80, 120, 200])
def test_show_fits_the_terminal_and_shows_every_step_value_whole(
    cli_env, create, deps, client, tmp_path, columns: int
) -> None:
    """A run of five steps (a model call's cost, effect keys, a code version) and one of a
    retry's long error: at 80 columns as at 120 and 200, no line is longer than the
    terminal and no value is cut: each step's name, outcome, start, worker and version is
    whole on a line of its own, and a long key or error folds without losing a character."""
    import dataclasses

    from cairn.workers import loop

    deps = dataclasses.replace(
        deps, settings=deps.settings.with_options(code_version="2025.06.1-rc3")
    )
    probe = create("probe", {"log": str(tmp_path / "log")}, queue=False)
    assert loop.run(probe, deps) == "done"
    flaky = create("flaky", {"fixed": str(tmp_path / "fixed")}, queue=False)
    assert loop.run(flaky, deps) == "failed"
    env = {**cli_env, "COLUMNS": str(columns)}
    for run_id in (probe, flaky):
        shown = _cairn("runs", "show", run_id, env=env)
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert max(len(line) for line in lines) <= columns, shown.stdout
        whole = " ".join(lines)
        joined = "".join(shown.stdout.split())  # a folded value, put back together
        for step in client.history(run_id):
            for value in (step.cursor, step.outcome, step.worker, step.code_version):
                assert value and any(value in line for line in lines), (value, shown.stdout)
            stamp = step.started_at.strftime("%H:%M:%S.%f")[:-3]
            assert stamp in whole, (stamp, shown.stdout)
            assert "".join((step.error or step.effect_key or "").split()) in joined
        if columns >= 200:  # room for the table: its header on one line
            assert re.search(r"seq +step +visit +outcome +started", shown.stdout), shown.stdout
