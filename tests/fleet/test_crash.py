"""Crash tests: real Celery worker processes killed with SIGKILL / SIGSTOP mid-run, on
both pools: prefork (a run's process is a pool child) and threads (a run's process is
the whole worker, with every other run it drives)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest

from cairn.store import Leases
from cairn.testing import fleet
from cairn.testing.standins import MailServer, ModelServer
from tests.helpers.runs import done, holder_pid, sleeping, starts, step_log, wait_for
from tests.helpers.services import LEASE_TTL, both_brokers

# scripts/test runs these again behind PgBouncer in transaction mode.
pytestmark = pytest.mark.pgbouncer


@pytest.fixture(params=["prefork", "threads"])
def pool(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def start_worker(start_worker: Callable[..., fleet.Proc], pool: str) -> Callable[..., fleet.Proc]:
    """Every worker of a test on the pool under test."""
    return lambda concurrency=1, **env: start_worker(concurrency, **{"CAIRN_POOL": pool, **env})


@pytest.fixture
def kill_holder(leases: Leases, pool: str, start_worker, start_beat) -> Callable[[str], int]:
    """SIGKILL the process holding the run's lease. A prefork pool child: its worker lives
    on and sends the run again. A threads worker: the whole worker is gone, so another
    starts, and the reaper sends the run once its lease has expired."""

    def kill(run_id: str) -> int:
        pid = wait_for(lambda: holder_pid(leases, run_id), 10, "a lease holder")
        os.kill(pid, signal.SIGKILL)
        if pool == "threads":
            start_worker(concurrency=1)
            start_beat()
        return pid

    return kill


# The run's process dies: on prefork its worker sends the run again (or the broker
# redelivers it); on threads the reaper does.
@pytest.mark.parametrize(
    ("boundary", "broker_url"),
    [("before", "redis"), ("after", "redis"), ("after", "amqp")],
    indirect=["broker_url"],
)
def test_run_resumes_at_its_cursor_after_sigkill(
    start_worker, create, store, kill_holder, mail: MailServer, tmp_path, boundary
) -> None:
    log = tmp_path / "steps.log"
    start_worker(concurrency=1)
    run_id = create("probe", {"log": str(log), boundary: {"two": 60}})
    wait_for(lambda: sleeping(log, "two", boundary), 30, "step two")
    kill_holder(run_id)
    done(store, run_id)
    assert starts(log) == ["one", "two", "two", "mail", "ledger", "once"]
    cp = store.load(run_id)
    assert cp is not None and cp.resumes == 1 and cp.seq == 5
    assert mail.stats()["deliveries"] == 1


@pytest.mark.parametrize(("keyed", "deliveries"), [(True, 1), (False, 2)])
def test_email_step_killed_after_sending_delivers_once(
    start_worker, create, store, kill_holder, mail: MailServer, tmp_path, keyed, deliveries
) -> None:
    log = tmp_path / "steps.log"
    start_worker(concurrency=1)
    run_id = create("probe", {"log": str(log), "after": {"mail": 60}, "unkeyed": not keyed})
    wait_for(lambda: sleeping(log, "mail", "after"), 30, "the email to be sent")
    kill_holder(run_id)
    done(store, run_id)
    stats = mail.stats()
    assert stats["attempts"] == 2
    # Keyed: the replay reuses the key and the mail API dedupes it. Unkeyed (the bug this
    # guards against): the customer gets two emails.
    assert stats["deliveries"] == deliveries
    assert stats["duplicate_deliveries"] == deliveries - 1


def test_ledger_keeps_an_effect_without_idempotency_from_repeating(
    start_worker, create, store, kill_holder, tmp_path
) -> None:
    log = tmp_path / "steps.log"
    start_worker(concurrency=1)
    run_id = create("probe", {"log": str(log), "after": {"once": 60}})
    wait_for(lambda: sleeping(log, "once", "after"), 30, "the once effect")
    kill_holder(run_id)
    done(store, run_id)
    assert starts(log).count("once") == 2
    assert (tmp_path / "steps.log.effects").read_text().splitlines() == [f"cairn:{run_id}:once:0"]


@both_brokers
def test_kill_between_the_effects_write_and_commit_leaves_neither(
    start_worker, create, store, sql, send, tmp_path
) -> None:
    log = tmp_path / "steps.log"
    w = start_worker(concurrency=1)
    run_id = create("probe", {"log": str(log), "after": {"ledger": 60}})
    wait_for(lambda: sleeping(log, "ledger", "after"), 30, "the ledger write")
    w.kill()  # the whole worker: Redis redelivers nothing; RabbitMQ waits for a worker
    time.sleep(0.5)
    assert sql("SELECT count(*) FROM invoice_ledger") == [(0,)]
    cp = store.load(run_id)
    assert cp is not None and (cp.cursor, cp.seq) == ("ledger", 3)
    start_worker(concurrency=1)
    send(run_id)  # what the reaper (or enqueueing the run id again) does
    done(store, run_id)
    assert sql("SELECT idempotency_key FROM invoice_ledger") == [(f"cairn:{run_id}:ledger:0",)]


@pytest.mark.parametrize("step", ["two", "mail"])  # paused before its model call / its send
def test_zombie_after_sigstop_writes_nothing_and_sends_nothing(
    start_worker,
    start_beat,
    create,
    store,
    leases,
    mail: MailServer,
    model: ModelServer,
    tmp_path,
    step,
) -> None:
    log = tmp_path / "steps.log"
    a = start_worker(concurrency=1)
    run_id = create("probe", {"log": str(log), "before": {step: 2 * LEASE_TTL + 2}})
    wait_for(lambda: sleeping(log, step, "before"), 30, f"step {step}")
    zombie = holder_pid(leases, run_id)
    a.signal_all(signal.SIGSTOP)  # a partition: the process lives but says nothing
    start_worker(concurrency=1)
    start_beat()  # the reaper notices the expired lease and re-enqueues the run
    done(store, run_id, timeout=LEASE_TTL + 30)
    finished = store.load(run_id)
    lines_before = log.read_text()
    assert model.stats()["requests"] == 1  # the new owner's call to the model
    a.signal_all(signal.SIGCONT)
    wait_for(lambda: "lease lost" in a.text(), 20, "the zombie to stop")
    time.sleep(0.5)
    assert store.load(run_id) == finished
    assert log.read_text() == lines_before  # it started no further step
    assert not any(pid == zombie for c, _, pid, e in step_log(log) if c in ("ledger", "once"))
    # It woke up right before its model call or its send: both check the lease first.
    assert model.stats()["requests"] == 1
    assert mail.stats()["deliveries"] == 1 and mail.stats()["attempts"] == 1


def test_zombie_at_the_same_seq_commits_no_ctx_db_write(
    start_worker, start_beat, create, store, leases, sql, tmp_path
) -> None:
    """A pauses after its ctx.db write, before its save; B takes the run over and redoes
    the step. A, resumed, must commit neither its write nor its checkpoint.

    A's open transaction holds the row B inserts, so B waits on it until A, resumed,
    learns it lost the lease and rolls back (then B's insert goes through)."""
    log = tmp_path / "steps.log"
    a = start_worker(concurrency=1)
    run_id = create("probe", {"log": str(log), "after": {"ledger": 2 * LEASE_TTL + 2}})
    wait_for(lambda: sleeping(log, "ledger", "after"), 30, "the ledger write")
    zombie = holder_pid(leases, run_id)
    a.signal_all(signal.SIGSTOP)
    start_worker(concurrency=1)
    start_beat()
    wait_for(lambda: holder_pid(leases, run_id) not in (None, zombie), LEASE_TTL + 20, "B")
    a.signal_all(signal.SIGCONT)
    wait_for(lambda: "lease lost" in a.text(), 20, "the zombie to stop")
    done(store, run_id, timeout=30)
    assert sql("SELECT idempotency_key FROM invoice_ledger") == [(f"cairn:{run_id}:ledger:0",)]
    assert (tmp_path / "steps.log.effects").read_text().splitlines() == [f"cairn:{run_id}:once:0"]
    assert not any(pid == zombie for c, _, pid, _ in step_log(log) if c == "once")


def test_two_deliveries_of_one_run_never_run_concurrently(
    start_worker, create, store, send, tmp_path
) -> None:
    log = tmp_path / "steps.log"
    start_worker(concurrency=1)
    start_worker(concurrency=1)
    run_id = create("probe", {"log": str(log), "before": {"one": 2}})
    send(run_id)  # a second delivery, as a short visibility timeout would make
    done(store, run_id)
    assert starts(log) == ["one", "two", "mail", "ledger", "once"]


# Redis: the reaper sends the run again once its lease expires. RabbitMQ: the dead
# worker's connection drops, the message comes straight back, and the next worker takes
# the run over once the lease expires (it defers until then).
@both_brokers
def test_reaper_recovers_a_run_whose_whole_worker_was_lost(
    start_worker, start_beat, create, store, tmp_path
) -> None:
    log = tmp_path / "steps.log"
    a = start_worker(concurrency=1)
    start_beat()
    run_id = create("probe", {"log": str(log), "before": {"two": 60}})
    wait_for(lambda: sleeping(log, "two", "before"), 30, "step two")
    a.kill()
    killed = time.monotonic()
    start_worker(concurrency=1)
    ready = time.monotonic()
    wait_for(lambda: (store.load(run_id) or object()).seq >= 2, 30, "the run to move on")  # type: ignore[attr-defined]
    moved = time.monotonic()
    # Timed from the later of the lease's expiry and the replacement being ready (its
    # start-up, slow on a busy machine, is not the reaper's doing): a tick and a delivery.
    assert moved - max(ready, killed + LEASE_TTL) < 8, (moved - killed, ready - killed)
    done(store, run_id)


def test_reaper_sends_a_pending_run_whose_message_was_lost(
    start_worker, start_beat, worker_env, create, store, tmp_path
) -> None:
    log = tmp_path / "steps.log"
    worker_env.update(CAIRN_LOST_AFTER="1")  # beat's reaper reads it
    start_worker(concurrency=1)
    run_id = create("probe", {"log": str(log)}, queue=False)  # recorded, never sent
    time.sleep(2)
    assert store.load(run_id).status == "pending"
    beat = start_beat()
    wait_for(lambda: "beat ticking" in beat.text(), 60, "beat's first passes")  # its boot
    done(store, run_id, timeout=30)
    assert starts(log) == ["one", "two", "mail", "ledger", "once"]


def test_redelivered_finished_run_does_nothing(
    start_worker, create, store, send, mail: MailServer, tmp_path
) -> None:
    log = tmp_path / "steps.log"
    w = start_worker(concurrency=1)
    run_id = create("probe", {"log": str(log)})
    done(store, run_id)
    before, lines = store.load(run_id), log.read_text()
    send(run_id)
    wait_for(
        lambda: f"run {run_id} (probe) done, nothing to do" in w.text(), 20, "the second delivery"
    )
    assert store.load(run_id) == before and log.read_text() == lines
    assert mail.stats()["attempts"] == 1


def test_workflow_plugged_in_with_cairn_workflows(start_worker, create, store, tmp_path) -> None:
    without = start_worker(concurrency=1, CAIRN_WORKFLOWS="")
    missing = create("probe", {"log": str(tmp_path / "a.log")})
    wait_for(lambda: (store.load(missing) or object()).status == "failed", 30, "the run to fail")  # type: ignore[attr-defined]
    assert "unknown workflow 'probe'" in (store.load(missing).error or "")  # type: ignore[union-attr]
    without.kill()
    start_worker(concurrency=1, CAIRN_WORKFLOWS="tests.helpers.flows")
    found = create("loop", {"visits": 2})
    done(store, found)


def test_a_worker_paused_inside_an_at_most_once_effect_never_makes_it_twice(
    start_worker, start_beat, create, store, leases, client, mail: MailServer, tmp_path
) -> None:
    """A is SIGSTOPped after its lease check and its intent, before the charge, past the
    TTL. B takes the run over, finds the intent without its mark and stops the run as
    unknown. A, resumed, makes the charge it had started: once across both workers; its
    late done mark is fenced (the outcome stays the operator's to settle). Then someone
    resolves the run as done, with what they found, and it finishes with that result
    without charging again."""
    log = tmp_path / "steps.log"
    a = start_worker(concurrency=1)
    run_id = create("at_most_once", {"log": str(log), "before": {"charge": 2 * LEASE_TTL + 2}})
    wait_for(lambda: sleeping(log, "charge", "before"), 30, "the charge")
    zombie = holder_pid(leases, run_id)
    a.signal_all(signal.SIGSTOP)
    start_worker(concurrency=1)
    start_beat()

    def unknown() -> bool:
        cp = store.load(run_id)
        return cp is not None and cp.status == "unknown"

    wait_for(unknown, LEASE_TTL + 30, "B to stop the run as unknown")
    cp = store.load(run_id)
    assert cp is not None and f"cairn runs resolve {run_id}" in (cp.error or "")
    assert mail.stats()["deliveries"] == 0  # B did not charge
    a.signal_all(signal.SIGCONT)
    wait_for(lambda: mail.stats()["deliveries"] == 1, 20, "A's charge")
    wait_for(lambda: "lease lost" in a.text() or "stale" in a.text().lower(), 20, "A to stop")
    time.sleep(0.5)
    assert mail.stats()["deliveries"] == 1
    assert store.load(run_id).status == "unknown"  # type: ignore[union-attr]
    assert not any(pid != zombie for c, _, pid, e in step_log(log) if e == "start")
    assert [i["key"] for i in store.open_intents(run_id)] == [f"cairn:{run_id}:charge:0"]
    client.resolve(run_id, done=True, result={"charged": "by hand"})
    done(store, run_id, timeout=30)
    assert mail.stats()["deliveries"] == 1
    assert client.get(run_id).state["charge"] == {"charged": "by hand"}  # type: ignore[union-attr]
