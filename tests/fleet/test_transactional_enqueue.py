"""A web process that enqueues in its own transaction, commits and is SIGKILLed before it
could send anything: its run still starts, once. Beat's dispatcher hears the commit; when
no dispatcher heard it (beat down at the commit), the reaper sends the run. Through
PgBouncer in transaction mode (scripts/test's pass) the dispatcher listens straight to
Postgres (CAIRN_LISTEN_URL): LISTEN through PgBouncer hears nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from cairn.store.checkpoints import PgStore
from cairn.testing.standins import MailServer
from tests.helpers.runs import done, wait_for
from tests.helpers.services import PGBOUNCER_PORT, ROOT

OK = {"customer": "acme", "email": "a@acme.test"}

# The web process: the order and its run in one transaction, committed, then killed
# before any line after the commit runs (the Client itself sends nothing here).
WEB = """
import os, signal, sys, psycopg
from cairn.client.client import Client

run_id, data = sys.argv[1], __import__("json").loads(sys.argv[2])
with Client() as client, psycopg.connect(os.environ["CAIRN_DATABASE_URL"]) as conn:
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY)")
    conn.execute("INSERT INTO orders VALUES (%s)", (run_id,))
    client.enqueue("invoice", data, run_id=run_id, connection=conn)
    conn.commit()
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _web(env: dict[str, str], run_id: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", WEB, run_id, json.dumps(OK)],
        env=env,
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == -signal.SIGKILL, out.stderr


pytestmark = pytest.mark.pgbouncer


def test_a_web_process_killed_after_its_commit_still_gets_its_run_started_once(
    worker_env, db_url: str, start_worker, start_beat, store: PgStore, mail: MailServer
) -> None:
    # The reaper waits 5 minutes for a pending run (or a lost message): only the
    # dispatcher can send it in time.
    worker_env.update(CAIRN_PENDING_AFTER="300", CAIRN_LOST_AFTER="300")
    if PGBOUNCER_PORT:  # LISTEN through PgBouncer in transaction mode hears nothing
        worker_env.update(CAIRN_LISTEN_URL=db_url)
    start_worker(concurrency=1)
    beat = start_beat()
    wait_for(lambda: "dispatcher: listening" in beat.text(), 60, "beat's dispatcher")
    _web(worker_env, "order-1")
    started = time.monotonic()
    done(store, "order-1")
    assert time.monotonic() - started < 30
    cp = store.load("order-1")
    assert cp is not None and cp.resumes == 0
    assert mail.stats()["deliveries"] == 1 and mail.stats()["attempts"] == 1


def test_a_commit_no_dispatcher_heard_is_sent_by_the_reaper(
    worker_env, start_worker, start_beat, store: PgStore, mail: MailServer
) -> None:
    worker_env.update(CAIRN_PENDING_AFTER="2")
    start_worker(concurrency=1)
    _web(worker_env, "order-2")  # no beat yet: nobody listens
    time.sleep(1.0)
    run = store.get("order-2")
    assert run is not None and run.status == "pending"
    start_beat()
    done(store, "order-2")
    assert mail.stats()["deliveries"] == 1 and mail.stats()["attempts"] == 1


# A web process whose enqueue is its transaction's first statement (a fresh connection,
# as a SQLAlchemy Session or a Django atomic block has it), then commits or rolls back.
WEB_FIRST = """
import os, sys, psycopg
from cairn.client.client import Client

run_id, data, commit = sys.argv[1], __import__("json").loads(sys.argv[2]), sys.argv[3] == "1"
with Client() as client, psycopg.connect(os.environ["CAIRN_DATABASE_URL"]) as conn:
    client.enqueue("invoice", data, run_id=run_id, connection=conn)
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY)")
    conn.execute("INSERT INTO orders VALUES (%s)", (run_id,))
    conn.commit() if commit else conn.rollback()
"""


def test_an_enqueue_that_begins_the_callers_transaction_runs_only_if_it_commits(
    worker_env, db_url: str, start_worker, start_beat, store: PgStore, mail: MailServer, sql
) -> None:
    # The reaper sends a pending run after a second: a run the rollback left would start.
    worker_env.update(CAIRN_PENDING_AFTER="1", CAIRN_LOST_AFTER="300")
    if PGBOUNCER_PORT:
        worker_env.update(CAIRN_LISTEN_URL=db_url)
    worker = start_worker(concurrency=1)
    beat = start_beat()
    wait_for(lambda: "dispatcher: listening" in beat.text(), 60, "beat's dispatcher")
    for run_id, commit in (("rolled-back", "0"), ("committed", "1")):
        out = subprocess.run(
            [sys.executable, "-c", WEB_FIRST, run_id, json.dumps(OK), commit],
            env=worker_env,
            cwd=ROOT,
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
    done(store, "committed")
    time.sleep(3.0)  # past the reaper's pending_after, twice
    assert store.get("rolled-back") is None
    assert sql("SELECT id FROM orders") == [("committed",)]
    assert mail.stats()["deliveries"] == 1 and mail.stats()["attempts"] == 1
    assert "rolled-back" not in worker.text() and "rolled-back" not in beat.text()
