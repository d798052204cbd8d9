"""Broker messages lost (a flushed or restarted Redis): their runs are sent again within
seconds, and a long backlog, which holds a message for every run, causes no re-sends."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cairn.client.client import Client
from cairn.store.admin import RedisDatabase
from cairn.testing import fleet
from cairn.workers import broker
from tests.helpers.runs import wait_for

OK = {"customer": "acme", "email": "a@acme.test"}


def test_runs_whose_messages_were_flushed_are_sent_again_within_seconds(
    client, worker_env, start_beat, tmp_path: Path, settings
) -> None:
    ids = [client.enqueue("invoice", OK, run_id=f"lost-{i:02d}") for i in range(30)]
    RedisDatabase(settings.redis_url).flush()  # FLUSHALL: every queued message is gone
    worker_env.update(CAIRN_LOST_AFTER="2")  # for beat's reaper too
    worker = fleet.start_worker(worker_env, tmp_path / "w.log", "lost", 2)
    try:
        started = time.monotonic()
        beat = start_beat()  # the reaper runs in beat's process, on a thread of its own
        wait_for(lambda: all(client.get(r).status == "done" for r in ids), 60, "the 30 runs")
        assert time.monotonic() - started < 60
        assert "reaper re-enqueued" in beat.text()
    finally:
        worker.kill()


def test_a_backlog_of_10k_runs_with_slow_workers_is_never_sent_again(
    client, worker_env, tmp_path: Path, settings
) -> None:
    """10,000 runs enqueued while the reaper runs every 0.5 s (CAIRN_LOST_AFTER=1) and one
    worker of two processes takes them far slower than they come: every run not done has
    its message queued or in a worker's hands, so no pass may send one again."""
    backlog, senders = 10_000, 4
    env = {**worker_env, "CAIRN_LOST_AFTER": "1"}
    # Only the new-runs queue: a run the reaper sent again would wait in cairn.resume.
    runner = fleet.start_worker(env, tmp_path / "w.log", "runs", 2, queues=broker.RUNS)
    # At DEBUG: the reaper's line about each pass, which passes() counts.
    beat = fleet.start_beat(
        {**env, "CAIRN_LOGLEVEL": "DEBUG"}, tmp_path / "beat.log", tmp_path / "beat-schedule"
    )
    redis = RedisDatabase(settings.redis_url)

    def passes() -> int:
        return beat.text().count("reaper pass:")

    def enqueue(part: int) -> None:
        with Client(settings=settings) as own:
            for i in range(part, backlog, senders):
                own.enqueue("invoice", OK, run_id=f"backlog-{i:05d}")

    try:
        started = time.monotonic()
        with ThreadPoolExecutor(senders) as pool:
            list(pool.map(enqueue, range(senders)))
        enqueued_s, after = time.monotonic() - started, passes()
        # The oldest runs are past CAIRN_LOST_AFTER long before the last is sent.
        wait_for(lambda: passes() >= after + 10, 60, "10 reaper passes over the whole backlog")
        queued = redis.queue_length(broker.RUNS)
        done = client.counts().get("done", 0)
        sent_again = sum(
            int(line.split("re-enqueued ")[1].split()[0])
            for line in beat.text().splitlines()
            if "reaper re-enqueued" in line
        )
        print(
            f"10k backlog: enqueued in {enqueued_s:.1f}s, {passes()} reaper passes "
            f"({passes() - after} after), {done} runs done, {queued} queued, "
            f"{sent_again} sent again, {time.monotonic() - started:.1f}s"
        )
        assert sent_again == 0
        assert redis.queue_length(broker.RESUME) == 0
        assert 0 < done < backlog - 1_000  # the worker ran, and stayed behind the backlog
        # Every run is accounted for: done, or its message queued or in the worker's hands.
        assert backlog - done - queued <= 2
    finally:
        runner.kill()
        beat.kill()
