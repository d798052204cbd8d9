"""A run's life on real workers: bounded retries, poison, cancel, waits and signals, hand-off
at a step boundary on SIGTERM.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from cairn.testing.standins import MailServer
from tests.helpers.runs import starts, step_log, wait_for

PAID = {"customer": "acme", "email": "billing@acme.test", "await_payment": True}


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_failing_run_is_delivered_a_bounded_number_of_times(
    start_worker, start_beat, client, tmp_path
) -> None:
    calls = tmp_path / "calls"
    start_worker(concurrency=1)
    start_beat()  # the reaper must not add retry chains of its own
    run_id = client.enqueue("slow_hiccup", {"log": str(calls), "fail": 99})
    wait_for(lambda: client.get(run_id).status == "failed", 40, "the run to fail")
    assert len(_lines(calls)) == 3
    # Each retry came when its backoff said (3 s, then 6 s), not when the reaper noticed
    # a running run without a lease (after lease TTL / 2 = 1.5 s).
    at = [float(line.split()[2]) for line in _lines(calls)]
    assert at[1] - at[0] >= 2.9 and at[2] - at[1] >= 5.9, at
    time.sleep(5)  # ten reaper passes later
    assert len(_lines(calls)) == 3
    assert client.get(run_id).status == "failed"


def test_a_step_that_kills_its_process_every_time_is_poison(start_worker, client, tmp_path) -> None:
    calls = tmp_path / "calls"
    start_worker(concurrency=1, CAIRN_MAX_DELIVERIES="2")
    run_id = client.enqueue("oom", {"log": str(calls)})
    wait_for(lambda: client.get(run_id).status == "failed", 90, "the run to be called poison")
    assert "poison" in client.get(run_id).error
    assert len(_lines(calls)) == 2  # deliveries 1 and 2 ran the step; the 3rd refused it
    time.sleep(3)
    assert len(_lines(calls)) == 2


def test_cancel_a_running_run_stops_it_before_its_next_effect(
    start_worker, client, mail: MailServer, sql, tmp_path
) -> None:
    log = tmp_path / "steps.log"
    start_worker(concurrency=1)
    run_id = client.enqueue("probe", {"log": str(log), "before": {"mail": 3}})
    wait_for(lambda: any(e == "sleep-before" for *_, e in step_log(log)), 30, "the mail step")
    assert client.cancel(run_id, "stop").status == "running"  # it stops at its boundary
    wait_for(lambda: client.get(run_id).status == "cancelled", 20, "the run to stop")
    assert mail.stats()["attempts"] == 0  # the send came after the cancel: never made
    assert sql("SELECT count(*) FROM invoice_ledger") == [(0,)]
    assert starts(log) == ["one", "two", "mail"]
    assert [s.outcome for s in client.history(run_id)][-1] == "cancelled"


def test_sigterm_hands_the_run_back_at_the_next_step_boundary(
    start_worker, client, tmp_path
) -> None:
    log = tmp_path / "steps.log"
    step_seconds = 3.0
    a = start_worker(concurrency=1)
    run_id = client.enqueue("probe", {"log": str(log), "after": {"two": step_seconds}})
    wait_for(lambda: any(e == "sleep-after" for *_, e in step_log(log)), 30, "step two")
    a.proc.send_signal(signal.SIGTERM)  # what a rolling deploy sends to the worker
    stopped_at = time.monotonic()
    b = start_worker(concurrency=1)
    a.proc.wait(timeout=step_seconds + 15)
    shutdown = time.monotonic() - stopped_at
    wait_for(lambda: client.get(run_id).status == "done", 30, "the run to finish on B")
    # One step, then Celery's warm shutdown (2.4-2.8 s on a quiet 2-core machine, before
    # and after issue 51; 6 s once beside the whole suite): not the rest of the run, which
    # the pids below also show ran on B.
    assert shutdown < step_seconds + 8, shutdown
    assert starts(log) == ["one", "two", "mail", "ledger", "once"]  # no step ran twice
    by_pid = {c: pid for c, _, pid, e in step_log(log) if e == "start"}
    assert by_pid["two"] != by_pid["mail"]  # A finished two; the rest ran elsewhere
    assert "handing it back" in a.text()
    assert b.alive()


def test_waiting_and_signals_through_real_workers(
    start_worker, start_beat, client, mail: MailServer
) -> None:
    start_worker(concurrency=2)
    start_beat()
    early = client.enqueue("invoice", PAID)
    client.signal(early, "payment", {"n": 1}, signal_id="s-early")  # before it waits
    late = client.enqueue("invoice", PAID)
    wait_for(lambda: client.get(late).status == "waiting", 30, "the run to wait")
    client.signal(late, "payment", {"n": 2}, signal_id="s-late")
    client.signal(late, "payment", {"n": 2}, signal_id="s-late")
    timeout = client.enqueue("invoice", {**PAID, "payment_timeout_s": 1})
    for run_id, outcome in ((early, "paid"), (late, "paid"), (timeout, "unpaid")):
        wait_for(lambda r=run_id: client.get(r).status == "done", 30, f"{run_id} to finish")
        assert client.get(run_id).state["outcome"] == outcome
    assert mail.stats()["deliveries"] == 3 and mail.stats()["duplicate_deliveries"] == 0
