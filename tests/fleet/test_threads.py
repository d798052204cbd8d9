"""The threads pool: many runs per worker process, Postgres connections bounded by
CAIRN_DATABASE_POOL_SIZE, and a whole worker SIGKILLed with all its runs in hand."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from cairn.testing import fleet
from cairn.testing.standins import MailServer
from tests.helpers.runs import wait_for
from tests.helpers.services import PGBOUNCER_PORT

# scripts/test runs these again behind PgBouncer in transaction mode.
pytestmark = pytest.mark.pgbouncer

RUNS = 24


def _all_done(store: Any, ids: list[str], timeout: float) -> None:
    def done() -> bool:
        return all((store.load(r) or object()).status == "done" for r in ids)  # type: ignore[attr-defined]

    wait_for(done, timeout, f"{len(ids)} runs done")


@pytest.mark.skipif(
    bool(PGBOUNCER_PORT), reason="behind PgBouncer the server connections are PgBouncer's"
)
def test_one_process_drives_many_runs_at_once_on_a_few_connections(
    start_worker: Callable[..., fleet.Proc],
    create: Callable[..., str],
    store: Any,
    sql: Callable[..., list[tuple[Any, ...]]],
    settings: Any,
) -> None:
    def connections() -> int:
        query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        return sql(query, "threads-worker")[0][0]

    start_worker(
        concurrency=RUNS,
        CAIRN_POOL="threads",
        CAIRN_DATABASE_POOL_SIZE="3",
        # Its connections named, to count them apart from the test's own.
        CAIRN_DATABASE_URL=settings.database_url + "?application_name=threads-worker",
    )
    peak = 0
    sampling = True

    def sample() -> None:
        nonlocal peak
        while sampling:
            peak = max(peak, connections())
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    # Each run: 3 steps of 1 s. One at a time that is 72 s; all at once, about 3.
    sleep = {str(i): 1.0 for i in range(3)}
    started = time.monotonic()
    try:
        ids = [create("loop", {"visits": 3, "sleep_after_visit": sleep}) for _ in range(RUNS)]
        _all_done(store, ids, 60)
    finally:
        sampling = False
        sampler.join()
    took = time.monotonic() - started
    assert took < 15, f"{RUNS} runs of 3 s took {took:.1f} s: not run at once"
    assert 1 <= peak <= 3, peak  # the worker's pool, not a connection per run


def test_a_whole_threads_worker_lost_with_all_its_runs(
    start_worker: Callable[..., fleet.Proc],
    start_beat: Callable[[], fleet.Proc],
    create: Callable[..., str],
    store: Any,
    mail: MailServer,
) -> None:
    first = start_worker(concurrency=RUNS, CAIRN_POOL="threads")
    start_beat()
    sleep = {str(i): 0.5 for i in range(6)}
    ids = [create("loop", {"visits": 6, "sleep_after_visit": sleep}) for _ in range(RUNS)]
    wait_for(lambda: mail.stats()["deliveries"] >= RUNS, 30, "every run under way")
    first.kill()  # SIGKILL: the process and every run it was driving
    start_worker(concurrency=RUNS, CAIRN_POOL="threads")
    _all_done(store, ids, 90)
    stats = mail.stats()
    assert stats["deliveries"] == RUNS * 6  # each visit's email delivered once
    assert stats["duplicate_deliveries"] == 0
    assert sum(store.load(r).resumes for r in ids) >= 1  # type: ignore[union-attr]


def test_model_calls_from_many_threads_keep_to_small_connection_pools() -> None:
    """One process, a hundred runs calling the model at once: each thread keeps to one of
    model.POOLS pools, so no pool (which httpcore scans whole on every request and
    response) holds more than its share of the connections."""
    from cairn.steps import model
    from cairn.testing.standins import ModelServer

    threads, calls = 100, 2
    with ModelServer(delay_ms=200) as server:
        client = model.ModelClient(base_url=server.url, give_up_after=10.0)
        answers: list[str] = []

        def call() -> None:
            for _ in range(calls):
                message, _cost = client.create(messages=[{"role": "user", "content": "hi"}])
                answers.append(model.text_of(message))

        pool = [threading.Thread(target=call) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        transport = client.client._client._transport
        made = [p for p in transport._pools if p is not None]
        sizes = [len(p._pool.connections) for p in made]
        client.close()
        served = server.stats()["requests"]
    assert len(answers) == served == threads * calls and all(answers)
    assert len(made) == model.POOLS
    # Threads are dealt to pools in turn: ceil(100 / POOLS) each, reused for the second call.
    assert max(sizes) <= -(-threads // model.POOLS), sizes
