"""A run's whole life in process: history, retries, cancel, budgets, waits and signals,
workflow versions. On real workers (bounded deliveries, poison, SIGTERM):
tests/fleet/test_lifecycle.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from cairn.core import errors
from cairn.store import PgStore, keys
from cairn.testing.standins import ModelServer
from cairn.workers import loop


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_every_step_appends_one_history_row_and_the_sweep_removes_them(
    create, deps, store: PgStore, client, sql, tmp_path
) -> None:
    run_id = create("probe", {"log": str(tmp_path / "steps.log")}, queue=False)
    assert loop.run(run_id, deps) == "done"
    steps = client.history(run_id)
    assert [(s.seq, s.cursor, s.outcome) for s in steps] == [
        (0, "one", "saved"),
        (1, "two", "saved"),
        (2, "mail", "saved"),
        (3, "ledger", "saved"),
        (4, "once", "saved"),
    ]
    assert steps[2].effect_key == f"cairn:{run_id}:mail:0"
    assert steps[1].cost_usd > 0 and steps[0].cost_usd == 0  # step two asked the model
    assert all(s.ended_at >= s.started_at and ":" in (s.worker or "") for s in steps)
    assert sum(s.cost_usd for s in steps) == pytest.approx(store.load(run_id).cost_usd)
    sql("UPDATE checkpoints SET updated_at = now() - interval '8 days'")
    assert store.sweep(older_than=7 * 24 * 3600) == 1
    assert sql("SELECT count(*) FROM step_history") == [(0,)]


def test_a_transient_step_failure_is_retried_with_its_attempts_recorded(
    client, deps, store: PgStore, tmp_path
) -> None:
    run_id = client.enqueue("hiccup", {"log": str(tmp_path / "calls"), "fail": 2})
    for _ in range(2):
        with pytest.raises(errors.RetryLater):
            loop.run(run_id, deps)
    assert store.load(run_id).attempts == 2  # counted in the checkpoint: survives a crash
    assert loop.run(run_id, deps) == "done"
    assert [s.outcome for s in client.history(run_id)] == ["retry", "retry", "saved"]
    assert store.load(run_id).attempts == 0


def test_a_step_whose_attempts_are_spent_fails_the_run(client, deps, store, tmp_path) -> None:
    run_id = client.enqueue("hiccup", {"log": str(tmp_path / "calls"), "fail": 99})
    for _ in range(2):
        with pytest.raises(errors.RetryLater):
            loop.run(run_id, deps)
    assert loop.run(run_id, deps) == "failed"
    run = client.get(run_id)
    assert run.status == "failed" and "retries exhausted after 3 attempts" in run.error
    assert "503" in run.error
    assert len(_lines(tmp_path / "calls")) == 3


def test_cancel_a_pending_run_at_once(client, deps, tmp_path) -> None:
    run_id = client.enqueue("probe", {"log": str(tmp_path / "steps.log")})
    run = client.cancel(run_id, "customer closed the account")
    assert run is not None and run.status == "cancelled"
    assert run.error == "customer closed the account"
    assert loop.run(run_id, deps) == "cancelled"
    assert not (tmp_path / "steps.log").exists()
    with pytest.raises(errors.UnknownRun):
        client.cancel("no-such-run")


def test_a_run_stops_before_the_model_call_that_would_pass_its_budget(
    client, deps, model: ModelServer, tmp_path
) -> None:
    run_id = client.enqueue("probe", {"log": str(tmp_path / "steps.log")}, max_cost_usd=1e-6)
    assert loop.run(run_id, deps) == "budget_exceeded"
    run = client.get(run_id)
    assert run.status == "budget_exceeded" and run.cursor == "two"
    assert "over the cap of $0.000001" in run.error
    assert model.stats()["requests"] == 0


PAID = {"customer": "acme", "email": "billing@acme.test", "await_payment": True}


def test_a_waiting_run_holds_no_worker_and_its_signal_resumes_it(
    client, deps, leases, tmp_path
) -> None:
    run_id = client.enqueue("invoice", PAID)
    assert loop.run(run_id, deps) == "waiting"
    run = client.get(run_id)
    assert (run.status, run.cursor) == ("waiting", "settle")
    assert leases.holder(run_id) is None  # no worker slot held while it waits
    # Its epoch counter stays, so the wake's claim needs no second lease.
    assert leases.client.exists(keys.epoch(run_id))
    assert loop.run(run_id, deps) == "waiting"  # a stray delivery changes nothing
    assert client.signal(run_id, "payment", {"amount_cents": 4200}, signal_id="pay-1")
    assert not client.signal(run_id, "payment", {"amount_cents": 4200}, signal_id="pay-1")
    assert loop.run(run_id, deps) == "done"
    run = client.get(run_id)
    assert run.state["outcome"] == "paid" and run.state["payment"] == {"amount_cents": 4200}
    assert loop.run(run_id, deps) == "done"  # the duplicate signal delivered nothing more
    assert not leases.client.exists(keys.epoch(run_id))
    assert [s.cursor for s in client.history(run_id)][-2:] == ["await_payment", "settle"]


def test_a_signal_sent_before_the_run_waits_is_not_lost(client, deps) -> None:
    run_id = client.enqueue("invoice", PAID)
    assert client.signal(run_id, "payment", {"early": True})
    # The run reaches its wait with the signal already there: it goes on by itself.
    with pytest.raises(errors.HandOff, match="had come"):
        loop.run(run_id, deps)
    assert loop.run(run_id, deps) == "done"
    assert client.get(run_id).state["payment"] == {"early": True}


def test_the_timeout_resumes_a_waiting_run_on_its_timeout_cursor(client, deps, sql) -> None:
    run_id = client.enqueue("invoice", {**PAID, "payment_timeout_s": 3600})
    assert loop.run(run_id, deps) == "waiting"
    sql("UPDATE checkpoints SET wait_until = now() - interval '1 second'")
    assert loop.run(run_id, deps) == "done"
    assert client.get(run_id).state["outcome"] == "unpaid"


def test_cancel_stops_a_waiting_run_at_once_and_a_late_signal_wakes_nothing(client, deps) -> None:
    run_id = client.enqueue("invoice", PAID)
    assert loop.run(run_id, deps) == "waiting"
    assert client.cancel(run_id, "order withdrawn").status == "cancelled"
    assert client.signal(run_id, "payment", {})  # stored, but nobody is woken
    assert loop.run(run_id, deps) == "cancelled"
    assert client.get(run_id).state["outcome"] == "sent"


def test_a_run_saved_by_an_older_workflow_version_is_migrated_when_loaded(
    client, deps, sql
) -> None:
    run_id = client.enqueue("evolving", {})
    sql("UPDATE checkpoints SET flow_version = 1, state = '{\"n\": 5}'")  # saved by v1
    assert loop.run(run_id, deps) == "done"
    assert client.get(run_id).state == {"count": 5, "final": 6}
    assert sql("SELECT flow_version FROM checkpoints") == [(2,)]


def test_a_run_saved_by_a_newer_workflow_version_is_incompatible(client, deps, sql) -> None:
    run_id = client.enqueue("evolving", {})
    sql("UPDATE checkpoints SET flow_version = 3")  # a newer deploy wrote it
    assert loop.run(run_id, deps) == "incompatible"
    assert "version 3" in client.get(run_id).error
