"""A partition's take-over does not wait for a free pool process: the reaper runs on beat's
own thread, so a fleet whose every pool process is on a long run still has its lost run
sent again within a lease TTL, and a worker with room takes it over at once."""

from __future__ import annotations

import signal
import time

import pytest

from cairn.testing import fleet
from cairn.workers import broker
from tests.helpers.runs import done, holder_pid, sleeping, wait_for
from tests.helpers.services import LEASE_TTL

# scripts/test runs these again behind PgBouncer in transaction mode.
pytestmark = pytest.mark.pgbouncer


def test_a_partitioned_run_is_taken_over_within_a_ttl_and_2s_with_every_pool_process_busy(
    start_worker, start_beat, worker_env, create, store, leases, tmp_path, request
) -> None:
    """A holds the run and is partitioned (SIGSTOP: alive, silent). B consumes every queue
    (the control queue too) and has both its pool processes on long runs; C takes runs
    only. Before, the reaper was a task on the control queue: no process that served it
    was free, so nothing sent the run again until a long run ended (12.8 s on a loaded
    machine). Now beat's reaper sends it once the lease expires, and C takes it over
    within CAIRN_LEASE_TTL + 2 s of the partition."""
    log = tmp_path / "steps.log"
    a = start_worker(concurrency=1)
    run_id = create("probe", {"log": str(log), "before": {"two": 120}})
    wait_for(lambda: sleeping(log, "two", "before"), 30, "step two")
    zombie = holder_pid(leases, run_id)
    b = start_worker(concurrency=2)
    long = [
        create("probe", {"log": str(tmp_path / f"long-{i}.log"), "before": {"one": 300}})
        for i in range(2)
    ]
    wait_for(
        lambda: {holder_pid(leases, r) for r in long} == set(b.children()),
        30,
        "B's two pool processes on the long runs",
    )
    runs = ",".join(broker.RUN_QUEUES)
    c = fleet.start_worker(worker_env, tmp_path / "c.log", "c", 1, queues=runs)
    request.addfinalizer(c.kill)
    beat = start_beat()
    wait_for(lambda: "beat ticking" in beat.text(), 60, "beat's first passes")
    a.signal_all(signal.SIGSTOP)  # a partition: the process lives but says nothing
    partitioned = time.monotonic()
    wait_for(
        lambda: holder_pid(leases, run_id) not in (None, zombie), LEASE_TTL + 30, "a take-over"
    )
    took = time.monotonic() - partitioned
    print(f"take-over after a partition, every pool process busy: {took:.2f}s")
    assert holder_pid(leases, run_id) == c.children()[0]
    assert took < LEASE_TTL + 2, took
    assert all(holder_pid(leases, r) in b.children() for r in long)  # still on them
    done(store, run_id, timeout=60)
    a.signal_all(signal.SIGCONT)
