"""Counts by status stay exact while a real fleet runs and the reaper folds them."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg

from cairn.store import PgStore
from cairn.testing import fleet
from tests.helpers.counts import consistent, store_counts, true_counts
from tests.helpers.runs import wait_for


def test_counts_are_exact_while_a_fleet_runs_and_the_reaper_folds(
    client, store: PgStore, worker_env, start_beat, tmp_path: Path, settings, sql
) -> None:
    """Real workers (6 processes) take 200 runs to done, failed or cancelled while a
    reader compares snapshots; the reaper's passes fold what they wrote."""
    workers = [fleet.start_worker(worker_env, tmp_path / f"w{i}.log", f"w{i}", 3) for i in range(2)]
    start_beat()
    stop, mismatches, samples = threading.Event(), [], [0]

    def reader() -> None:
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            while not stop.is_set():
                counted, truth = consistent(conn)
                samples[0] += 1
                if counted != truth:
                    mismatches.append((counted, truth))

    sampling = threading.Thread(target=reader)
    sampling.start()
    try:
        ok = {"customer": "acme", "email": "a@acme.test"}
        ids = [client.enqueue("invoice", ok, run_id=f"fleet-{i:03d}") for i in range(180)]
        ids += [client.enqueue("bad", {"mode": "raise"}, run_id=f"bad-{i:02d}") for i in range(20)]
        for run_id in ids[::20]:
            client.cancel(run_id)  # some still pending (cancelled), some already on their way
        wait_for(
            lambda: sum(true_counts(sql).get(s, 0) for s in ("done", "failed", "cancelled")) == 200,
            120,
            "the 200 runs",
        )
        # The reaper's passes fold what the fleet wrote.
        wait_for(
            lambda: sql("SELECT count(*) FROM run_count_deltas") == [(0,)], 15, "a reaper fold"
        )
    finally:
        stop.set()
        sampling.join(30)
        for w in workers:
            w.kill()
    assert not mismatches, mismatches[:3]
    assert samples[0] > 20
    truth = true_counts(sql)
    assert truth["failed"] >= 19 and truth["done"] >= 170, truth  # cancels landed somewhere
    assert store_counts(store) == truth
