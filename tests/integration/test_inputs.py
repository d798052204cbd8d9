"""Bad input at the door: a clear error within seconds, nothing written; outages answered
in seconds with the host, port and cause; only errors that can heal are retried."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import subprocess
import sys
import time

import psycopg
import pytest

from cairn.client.client import Client
from cairn.core.errors import InvalidInput, StoreUnavailable
from cairn.store.db import outage
from tests.helpers.services import ROOT

OK = {"customer": "acme", "email": "a@acme.test"}

BAD = [
    # (what, run_id, input, message)
    ("empty run id", "", OK, "is not valid"),
    ("non-ASCII run id", "r\u00e9sum\u00e9", OK, "is not valid"),
    ("run id too long", "r" * 201, OK, "is not valid"),
    ("run id with a space", "a b", OK, "is not valid"),
    ("integer run id", 42, OK, "must be a string"),
    ("NaN", None, {**OK, "x": math.nan}, "NaN or Infinity"),
    ("Infinity", None, {**OK, "x": math.inf}, "NaN or Infinity"),
    ("NUL character", None, {**OK, "note": "a\x00b"}, "NUL"),
    ("a datetime", None, {**OK, "when": dt.datetime(2026, 1, 1)}, "not JSON"),
    ("integer key", None, {**OK, 1: "x"}, "round trip"),
    ("a list, not an object", None, [OK], "JSON object"),
    ("too large", None, {**OK, "blob": "x" * 2_000_000}, "CAIRN_MAX_INPUT_BYTES"),
]


@pytest.mark.parametrize(("what", "run_id", "data", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_to_the_client_is_refused_at_once(
    client: Client, what: str, run_id, data, message: str
) -> None:
    started = time.monotonic()
    with pytest.raises(InvalidInput, match=message):
        client.enqueue("invoice", data, run_id=run_id)
    assert time.monotonic() - started < 2
    assert client.list() == []  # nothing written


def _cairn(*args: str, env: dict[str, str], stdin: str | None = None):
    full = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **env}
    return subprocess.run(
        [sys.executable, "-m", "cairn.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=full,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


@pytest.fixture
def cli_env(settings) -> dict[str, str]:
    return {
        "CAIRN_DATABASE_URL": settings.database_url,
        "CAIRN_REDIS_URL": settings.redis_url,
        "CAIRN_WORKFLOWS": "cairn.testing.demos.invoice",  # `cairn enqueue` checks the name
    }


CLI_BAD = [
    (["enqueue", "invoice", json.dumps(OK), "--run-id", "r\u00e9sum\u00e9"], "is not valid"),
    (["enqueue", "invoice", json.dumps(OK), "--run-id", ""], "is not valid"),
    (["enqueue", "invoice", '{"customer": "acme", "email": "a@b", "x": NaN}'], "NaN"),
    (["enqueue", "invoice", json.dumps(OK), "--input-file", "-"], "not both"),
    (["enqueue", "invoice", "--input-file", "/nonexistent/input.json"], "cannot read"),
    (["runs", "--status", "bogus"], "is not one of"),
    (["runs", "--limit", "-1"], "greater than or equal to 1"),
]


@pytest.mark.parametrize(("args", "message"), CLI_BAD, ids=[" ".join(a[:3]) for a, _ in CLI_BAD])
def test_bad_input_to_the_cli_is_a_clear_error(cli_env, client: Client, args, message) -> None:
    result = _cairn(*args, env=cli_env)
    assert result.returncode == 2, result.stderr
    assert message in " ".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.stderr
    assert client.list() == []


def test_the_cli_reads_a_large_input_from_a_file_or_stdin(cli_env, client, tmp_path) -> None:
    data = {**OK, "note": "x" * 200_000}
    path = tmp_path / "input.json"
    path.write_text(json.dumps(data))
    from_file = _cairn("enqueue", "invoice", "--input-file", str(path), env=cli_env)
    from_stdin = _cairn(
        "enqueue", "invoice", "--input-file", "-", env=cli_env, stdin=json.dumps(data)
    )
    assert from_file.returncode == 0 and from_stdin.returncode == 0, from_file.stderr
    ids = {from_file.stdout.strip(), from_stdin.stdout.strip()}
    assert ids == {r.run_id for r in client.list()}


def test_an_unreachable_postgres_fails_a_client_call_in_seconds_naming_host_port_and_cause() -> (
    None
):
    client = Client("postgresql://postgres@127.0.0.1:9/cairn")
    started = time.monotonic()
    with pytest.raises(
        StoreUnavailable, match=r"postgres at 127\.0\.0\.1:9 is unreachable: .*refused"
    ):
        client.list()
    assert time.monotonic() - started <= 5.5
    client.close()


def test_an_unreachable_multi_host_dsn_names_every_host_with_its_port() -> None:
    # A primary and its standby in one DSN (libpq's multi-host, as a failover wants).
    both = "postgresql://postgres@127.0.0.1:9,127.0.0.1:1/cairn?target_session_attrs=read-write"
    one_port = "postgresql://postgres@127.0.0.1,127.0.0.2/cairn?port=9"
    for url, at in ((both, "127.0.0.1:9,127.0.0.1:1"), (one_port, "127.0.0.1:9,127.0.0.2:9")):
        client = Client(url)
        with pytest.raises(StoreUnavailable, match=rf"postgres at {re.escape(at)} is unreachable"):
            client.list()
        client.close()


def test_the_cli_says_postgres_is_down_in_one_line_within_seconds() -> None:
    started = time.monotonic()
    result = _cairn("runs", env={"CAIRN_DATABASE_URL": "postgresql://postgres@127.0.0.1:9/cairn"})
    assert time.monotonic() - started < 10
    assert result.returncode == 1
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "127.0.0.1:9 is unreachable" in lines[0], result.stderr


def test_the_worker_refuses_to_start_without_postgres() -> None:
    env = {"CAIRN_DATABASE_URL": "postgresql://postgres@127.0.0.1:9/cairn"}
    started = time.monotonic()
    result = _cairn("worker", env=env)
    assert time.monotonic() - started < 15
    assert result.returncode == 1
    assert "cannot start" in result.stderr and "127.0.0.1:9 is unreachable" in result.stderr


def test_only_errors_that_can_heal_count_as_outages(settings, sql) -> None:
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        for query, heals in (
            ("SELECT 1/0", False),  # 22012: a value, never heals
            ("SELECT repeat('x', 10)::int", False),  # 22P02
            ("SELECT pg_terminate_backend(pg_backend_pid())", True),  # 57P01: admin shutdown
        ):
            with pytest.raises(psycopg.Error) as caught:
                conn.execute(query)
            assert (outage(caught.value) is not None) is heals, (query, caught.value.sqlstate)
