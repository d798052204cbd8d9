"""Broker messages lost (a flushed or restarted Redis): their runs are sent again within
seconds, and a long backlog, which holds a message for every run, causes no re-sends."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cairn.store.admin import RedisDatabase
from cairn.testing import fleet
from cairn.workers import broker
from tests.conftest import wait_for

pytestmark = pytest.mark.slow
OK = {"customer": "acme", "email": "a@acme.test"}


def test_runs_whose_messages_were_flushed_are_sent_again_within_seconds(
    client, worker_env, start_beat, tmp_path: Path, settings
) -> None:
    ids = [client.enqueue("invoice", OK, run_id=f"lost-{i:02d}") for i in range(30)]
    RedisDatabase(settings.redis_url).flush()  # FLUSHALL: every queued message is gone
    env = {**worker_env, "CAIRN_LOST_AFTER": "2"}
    worker = fleet.start_worker(env, tmp_path / "w.log", "lost", 2)
    try:
        started = time.monotonic()
        start_beat()
        wait_for(
            lambda: all(client.get(r).status == "done" for r in ids), 60, "the 30 runs"
        )
        assert time.monotonic() - started < 60
        assert "reaper re-enqueued" in worker.text()
    finally:
        worker.kill()


def test_a_backlog_with_a_message_for_every_run_is_not_sent_again(
    client, worker_env, tmp_path: Path, settings
) -> None:
    for i in range(1_000):
        client.enqueue("invoice", OK, run_id=f"backlog-{i:04d}")
    env = {**worker_env, "CAIRN_LOST_AFTER": "1"}
    # The reaper runs, but nothing consumes the runs: they wait in the queue.
    worker = fleet.start_worker(env, tmp_path / "w.log", "reaper", 1, queues=broker.CONTROL)
    beat = fleet.start_beat(env, tmp_path / "beat.log", tmp_path / "beat-schedule")
    try:
        wait_for(lambda: worker.text().count("cairn.reap") >= 8, 30, "several reaper passes")
        redis = RedisDatabase(settings.redis_url)
        assert redis.queue_length(broker.RUNS) == 1_000
        assert redis.queue_length(broker.RESUME) == 0  # no run was sent twice
        assert "reaper re-enqueued" not in worker.text()
    finally:
        worker.kill()
        beat.kill()
