"""Outages of the real servers mid-run, and a second delivery while the owner lives."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from cairn.store import PgStore
from cairn.testing.standins import MailServer
from tests.helpers.runs import done, sleeping, starts, wait_for
from tests.helpers.services import LEASE_TTL, ROOT


def _service(action: str, name: str) -> None:
    subprocess.run(
        ["bash", str(ROOT / "scripts/services.sh"), action, name],
        check=True,
        capture_output=True,
        timeout=60,
    )


@pytest.fixture
def restarts():
    """Whatever a test stops is started again, even if the test fails."""
    stopped: list[str] = []

    def down(name: str) -> None:
        stopped.append(name)
        _service("down", name)

    yield down
    for name in stopped:
        _service("up", name)


def test_postgres_restarted_mid_run(
    start_worker, create, store: PgStore, mail: MailServer, restarts, tmp_path: Path
) -> None:
    log = tmp_path / "steps.log"
    start_worker(concurrency=1)
    run_id = create("probe", {"log": str(log), "after": {"two": 1.5}})
    wait_for(lambda: sleeping(log, "two", "after"), 30, "step two")
    restarts("postgres")  # the step's save meets a dead server and retries with backoff
    time.sleep(2.5)
    _service("up", "postgres")
    done(store, run_id)
    cp = store.load(run_id)
    assert cp is not None and cp.seq == 5
    assert starts(log).count("one") == 1  # nothing before the outage was redone
    assert mail.stats()["deliveries"] == 1 and mail.stats()["duplicate_deliveries"] == 0


def test_redis_restarted_mid_run(
    start_worker, start_beat, create, store: PgStore, mail: MailServer, restarts, tmp_path: Path
) -> None:
    log = tmp_path / "steps.log"
    worker = start_worker(concurrency=1)
    start_beat()
    # The mail step outlasts the lease TTL while Redis is down: its lease cannot be proven.
    run_id = create("probe", {"log": str(log), "after": {"mail": 2 * LEASE_TTL}})
    wait_for(lambda: sleeping(log, "mail", "after"), 30, "the mail step")
    restarts("redis")  # broker and leases gone at once, for longer than the lease TTL
    time.sleep(2 * LEASE_TTL + 1)
    cp = store.load(run_id)
    assert cp is not None and (cp.status, cp.cursor) == ("running", "mail")  # not saved
    assert "lease renewal failed" in worker.text()
    _service("up", "redis")
    done(store, run_id, timeout=90)
    assert "lease lost" in worker.text()  # it stopped rather than save unprovably
    cp = store.load(run_id)
    assert cp is not None and cp.seq == 5
    assert starts(log).count("one") == 1 and starts(log).count("mail") == 2
    stats = mail.stats()
    assert stats["deliveries"] == 1 and stats["attempts"] == 2  # the replay was deduplicated


def test_redelivery_past_the_visibility_timeout_defers_and_survives_the_owners_death(
    start_worker, create, store: PgStore, tmp_path: Path
) -> None:
    # A visibility timeout shorter than a step: the broker hands the running run to a
    # second worker while the first is alive and working.
    opts = json.dumps({"unacked_restore_interval": 0.5, "unacked_restore_throttle": 1})
    broker = {"CAIRN_VISIBILITY_TIMEOUT": "2", "CAIRN_BROKER_TRANSPORT_OPTIONS": opts}
    log = tmp_path / "steps.log"
    first = start_worker(concurrency=1, **broker)
    run_id = create("probe", {"log": str(log), "before": {"two": 60}})
    wait_for(lambda: sleeping(log, "two", "before"), 30, "step two")
    second = start_worker(concurrency=1, **broker)
    wait_for(lambda: "held by" in second.text(), 45, "the broker to redeliver and the run to defer")
    assert starts(log) == ["one", "two"]  # deferred, not run concurrently
    first.kill()  # no reaper running: only the redelivered message can finish the run
    done(store, run_id, timeout=30)
    assert starts(log) == ["one", "two", "two", "mail", "ledger", "once"]
