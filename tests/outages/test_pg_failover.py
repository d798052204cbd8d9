"""A Postgres primary SIGKILLed under load and its streaming replica promoted; the fleet's one
DSN names both hosts with target_session_attrs=read-write (libpq's multi-host), so workers,
beat, clients and `cairn db upgrade` find whichever server takes writes.

Asynchronous replication (the replica's WAL stream stopped first: a replica that lags) loses
the last saves: every run resumes from its older checkpoint and sends its mail again under
the same idempotency key (0 duplicate deliveries). With synchronous_standby_names and
synchronous_commit = remote_apply nothing a worker was told is saved is lost: no step runs
twice. Figures are printed (`pytest -s`)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import tests.helpers.flows  # noqa: F401  (registers probe)
from cairn.client.client import Client
from cairn.core.settings import Settings
from cairn.store import Database, PgStore
from cairn.testing import fleet
from cairn.testing.standins import MailServer
from tests.helpers.pgpair import PgPair
from tests.helpers.runs import done, sleeping, starts, wait_for
from tests.helpers.services import ROOT

RUNS = 4
HOLD = 4.0  # seconds each run sleeps before its ledger step, on its first try


@pytest.fixture(params=["async", "sync"])
def pair(request: pytest.FixtureRequest) -> Iterator[PgPair]:
    made = PgPair(synchronous=request.param == "sync")
    try:
        made.start()
        yield made
    finally:
        made.close()


def _seqs(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute("SELECT run_id, seq FROM checkpoints").fetchall()
    return {run_id: int(seq) for run_id, seq in rows}


def _rewound(started: list[str]) -> bool:
    """A step run again after a later one began: its save had returned (a worker goes on
    only then) and was lost. A step tried again at once is not: its save never returned."""
    steps = [s for i, s in enumerate(started) if i == 0 or started[i - 1] != s]
    return len(steps) != len(set(steps))


def test_a_promoted_replica_takes_the_fleet_over(
    pair: PgPair,
    settings: Settings,
    worker_env: dict[str, str],
    mail: MailServer,
    tmp_path: Path,
) -> None:
    with psycopg.connect(pair.url(0), autocommit=True) as conn:
        conn.execute("CREATE DATABASE cairn")
    dsn = pair.dsn("cairn")
    env = {**worker_env, "CAIRN_DATABASE_URL": dsn, "CAIRN_DATABASE_PREPARE": "1"}
    upgraded = subprocess.run(
        [str(ROOT / ".venv/bin/cairn"), "db", "upgrade"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert upgraded.returncode == 0, upgraded.stderr
    mine = settings.with_options(database_url=dsn, database_prepare=True)
    store = PgStore(Database(dsn, give_up_after=30.0))
    procs = [
        fleet.start_worker(env, tmp_path / "w0.log", "w0", RUNS),
        fleet.start_beat(env, tmp_path / "beat.log", tmp_path / "beat-schedule", wait=60),
    ]
    logs = {f"probe-{i}": tmp_path / f"{i}.log" for i in range(RUNS)}
    try:
        with Client(settings=mine) as client:
            for run_id, log in logs.items():
                # Each run waits before its ledger write: the kill finds them all past mail.
                client.enqueue(
                    "probe", {"log": str(log), "before": {"ledger": HOLD}}, run_id=run_id
                )
        replica = pair.url(1, "cairn")
        wait_for(lambda: len(_seqs(replica)) == RUNS, 60, "the replica to hold every run")
        # The replica stops receiving: from here it lags the primary by every commit.
        os.kill(pair.walsender(), signal.SIGSTOP)
        if pair.synchronous:
            # remote_apply: a commit waits for the standby; no worker goes past its save.
            time.sleep(3)
            assert not any("mail" in starts(log) for log in logs.values())
        else:
            wait_for(
                lambda: all(sleeping(log, "ledger", "before") for log in logs.values()),
                60, "every run to reach its ledger step",
            )  # fmt: skip
        before = _seqs(pair.url(0, "cairn"))
        killed, killed_at = time.monotonic(), time.time()
        pair.kill_primary()
        pair.promote()
        after = _seqs(replica)
        wait_for(lambda: _seqs(replica) != after, 60, "a save on the promoted server")
        saved = time.monotonic()
        for run_id in logs:
            done(store, run_id, timeout=120)
        finished = time.monotonic() - killed
        print(f"\nbefore the kill {before}, just after the promotion {after}")
    finally:
        for p in procs:
            p.kill()
        store.db.close()
    # Recovery: from the kill, or from the first wake of a worker asleep through it (its
    # marker is written as its sleep begins), to the first save on the promoted server.
    markers = tmp_path.glob("*.log.slept.ledger.*.before")
    slept = [t for m in markers if (t := m.stat().st_mtime) < killed_at]
    woke = min(slept) + HOLD - killed_at + killed if slept else killed
    recovery = saved - max(killed, woke)
    lost = sorted(r for r in logs if after.get(r, 0) < before.get(r, 0))
    rewound = [r for r, log in logs.items() if _rewound(starts(log))]
    stats: dict[str, Any] = mail.stats()
    print(
        f"\npostgres failover ({'sync remote_apply' if pair.synchronous else 'async'}):"
        f" runs={RUNS} lost_saves={len(lost)} rewinds={len(rewound)}"
        f" mail_attempts={stats['attempts']} deliveries={stats['deliveries']}"
        f" duplicates={stats['duplicate_deliveries']} recovery_s={recovery:.1f}"
        f" all_done_s={finished:.1f}"
    )
    assert stats["deliveries"] == RUNS and stats["duplicate_deliveries"] == 0
    if pair.synchronous:
        # Nothing a worker was told is saved was lost: no step of any run ran twice.
        assert rewound == [] and stats["attempts"] == RUNS
    else:
        # Every run's saves after the WAL stopped are gone: each resumes from an older
        # checkpoint and sends its mail again under the same idempotency key.
        assert lost == sorted(logs) and len(rewound) == RUNS
        assert stats["attempts"] == 2 * RUNS
