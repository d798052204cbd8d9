"""Redis through Sentinel on real processes: a master, a replica and three sentinels; the
master SIGKILLed and the replica promoted while cairn's clients and a fleet work."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.core.errors import StoreUnavailable
from cairn.core.redisurl import with_master
from cairn.core.settings import Settings
from cairn.store import PgStore
from cairn.store.events import AsyncRedisEvents, RedisEvents
from cairn.store.lease import Leases, LeaseToken
from cairn.testing.standins import MailServer, ModelServer
from tests.helpers.runs import done, wait_for
from tests.helpers.sentinel import MASTER_NAME, SentinelGroup
from tests.helpers.services import LEASE_TTL, PGBOUNCER_PORT, via_pgbouncer


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    g = SentinelGroup(tmp_path / "sentinel")
    g.root.mkdir()
    try:
        yield g.start()
    finally:
        g.stop()


def _until_answers(call, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    """call() retried while Redis is unavailable (the promotion under way); its answer."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


async def _read_async(url: str, run: str) -> list[str]:
    """The run's stream as the web server's hub and AsyncClient read it."""
    events = AsyncRedisEvents(url)
    try:
        got = await events.read_many({run: "0-0"})
        return [blob for _, blob in got[run]]
    finally:
        await events.close()


def test_leases_and_streams_keep_working_through_a_promotion(group: SentinelGroup) -> None:
    url = with_master(group.url, MASTER_NAME)
    leases, events = Leases.from_url(url), RedisEvents.from_url(url)
    run = f"r-{uuid.uuid4().hex[:8]}"
    lease = leases.acquire(run, ttl=30)
    assert lease is not None
    before = events.append(
        [(run, str(lease.token), ['f{"kind":"before"}'])], maxlen=100, ttl=60, cap=0
    )
    # Replication is asynchronous: what the master took in its last moment may be lost
    # (see docs/explanation/failover.md). Here the writes are made to reach the replica.
    assert leases.client.wait(1, 5000) == 1

    old = group.kill_master()
    killed = time.monotonic()
    other = LeaseToken.mine()
    # The first answer after the kill comes from the promoted replica, through the same client.
    taken = _until_answers(lambda: leases.acquire(run, ttl=30, owner=other))
    recovery = time.monotonic() - killed
    print(f"\nredis sentinel failover: cairn's client answered again after {recovery:.1f}s")
    assert group.master_port() not in (None, old)
    assert taken is None  # the lease held before the failover is not given to another owner
    lease.renew()  # and its owner still holds it on the new master
    assert leases.holder(run) == lease.token
    after = _until_answers(
        lambda: events.append(
            [(run, str(lease.token), ['f{"kind":"after"}'])], maxlen=100, ttl=60, cap=0
        )
    )
    assert [blob for _, blob in events.read(run)] == ['{"kind":"before"}', '{"kind":"after"}']
    assert asyncio.run(_read_async(url, run)) == ['{"kind":"before"}', '{"kind":"after"}']
    assert before[0][0] < after[0][0]
    assert recovery < 30
    leases.client.close()
    events.close()


# The fleet test's own settings: the conftest's, with Redis (leases, events, broker) behind
# the sentinels instead of the shared server.
@pytest.fixture
def settings(db_url: str, group: SentinelGroup, mail: MailServer, model: ModelServer) -> Settings:
    return Settings(
        database_url=via_pgbouncer(db_url),
        database_prepare=not PGBOUNCER_PORT,
        redis_url=group.url,
        redis_sentinel_master=MASTER_NAME,
        lease_ttl=LEASE_TTL,
        mail_url=mail.url,
        anthropic_base_url=model.url,
        store_give_up_after=5.0,
    )


@pytest.fixture
def worker_env(worker_env: dict[str, str]) -> dict[str, str]:
    return {**worker_env, "CAIRN_REDIS_SENTINEL_MASTER": MASTER_NAME}


RUNS = 12


def test_a_fleet_under_load_rides_out_a_promotion(
    group: SentinelGroup,
    start_worker,
    start_beat,
    create,
    store: PgStore,
    mail: MailServer,
    model: ModelServer,
    tmp_path: Path,
) -> None:
    for _ in range(2):
        start_worker(concurrency=2)
    start_beat()
    logs = [tmp_path / f"steps-{i}.log" for i in range(RUNS)]
    runs = [create("probe", {"log": str(log), "after": {"two": 1.0}}) for log in logs]
    wait_for(lambda: sum(log.exists() for log in logs) >= 4, 60, "runs under way")

    old = group.kill_master()
    killed = time.monotonic()
    promoted = group.wait_promoted(old)
    for run_id in runs:
        done(store, run_id, timeout=180)
    finished = time.monotonic() - killed
    checkpoints = [store.load(r) for r in runs]
    stats = mail.stats()
    print(
        f"\nredis sentinel failover under load: {RUNS} runs, promoted after {promoted:.1f}s, "
        f"all done {finished:.1f}s after the kill; deliveries {stats['deliveries']}, "
        f"duplicates {stats['duplicate_deliveries']}, model requests "
        f"{model.stats()['requests']}"
    )
    assert all(cp is not None and cp.seq == 5 for cp in checkpoints)  # no save redone
    assert stats["deliveries"] == RUNS and stats["duplicate_deliveries"] == 0
