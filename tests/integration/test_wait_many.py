"""Waiting at a web app's scale: every wait of a client shares one listening connection
(store/waits.py). A thousand AsyncClient waits hold two Postgres connections; threads'
Client.wait share it too; a listening connection killed while runs stop still wakes their
waiters, as the runs are read again once it is back; one that cannot come back fails the
waits within the client's give-up time."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from cairn.client import AsyncClient, Client
from cairn.core.errors import StoreUnavailable
from cairn.core.records import Run
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.store import PgStore
from cairn.store.db import Database
from tests.helpers.runs import wait_for
from tests.helpers.services import PGBOUNCER_PORT

pytestmark = pytest.mark.skipif(
    bool(PGBOUNCER_PORT), reason="PgBouncer in transaction mode passes no notifications"
)
SQL = Callable[..., list[tuple[Any, ...]]]


def _runs(store: PgStore, prefix: str, n: int) -> list[str]:
    ids = [f"{prefix}-{i:04d}" for i in range(n)]
    for run_id in ids:
        store.create_run(run_id, "probe", {})
    return ids


def _stop(sql: SQL, ids: list[str]) -> None:
    sql("UPDATE checkpoints SET status = 'done' WHERE run_id = ANY(%s)", ids)


def _connections(sql: SQL) -> int:
    """The database's connections but the test's own."""
    rows = sql(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    return int(rows[0][0])


def test_a_thousand_async_waits_hold_two_connections_and_each_wakes_for_its_own_run(
    settings: Settings, store: PgStore, sql: SQL
) -> None:
    ids = _runs(store, "many", 1000)
    store.db.close()  # the test's own: from here every connection is the client's
    first, second = ids[::2], ids[1::2]

    async def main() -> None:
        async with AsyncClient(settings=settings) as client:
            # The pool's connection, settled (a first call that finds it still opening
            # opens a second): a web app's pool, which its other calls size.
            client.store.db.open().pool.wait(5)  # type: ignore[attr-defined]
            assert (await client.get(ids[0])) is not None
            tasks = {run_id: asyncio.create_task(client.wait(run_id, timeout=60)) for run_id in ids}
            listener = client.store.db.listener()  # type: ignore[attr-defined]
            while listener.looked() < len(ids):
                await asyncio.sleep(0.05)
            held = await asyncio.to_thread(_connections, sql)
            assert held <= 2, f"{held} connections for {len(ids)} waits"
            started = time.monotonic()
            await asyncio.to_thread(_stop, sql, first)
            done = [await tasks[run_id] for run_id in first]
            assert time.monotonic() - started < 5  # heard, not polled run by run
            assert [r.run_id for r in done] == first  # each its own run, none other
            assert all(r.status == RunStatus.DONE for r in done)
            assert not any(tasks[run_id].done() for run_id in second)
            await asyncio.to_thread(_stop, sql, second)
            assert [(await tasks[run_id]).run_id for run_id in second] == second
            assert await asyncio.to_thread(_connections, sql) <= 2

    asyncio.run(main())


def test_waits_in_threads_share_the_clients_one_connection(
    settings: Settings, store: PgStore, sql: SQL
) -> None:
    ids = _runs(store, "threads", 40)
    store.db.close()
    got: dict[str, Run] = {}
    with Client(settings=settings) as client:
        client.store.db.open().pool.wait(5)  # type: ignore[attr-defined]
        assert client.get(ids[0]) is not None
        threads = [
            # Half with no limit, as a worker waiting on a child might.
            threading.Thread(
                target=lambda r=r, t=t: got.update({r: client.wait(r, timeout=t)}),
                daemon=True,
            )
            for r, t in zip(ids, [60.0, None] * 20, strict=True)
        ]
        for t in threads:
            t.start()
        listener = client.store.db.listener()  # type: ignore[attr-defined]
        wait_for(lambda: listener.looked() == len(ids), 10, "every wait to be listened for")
        assert _connections(sql) <= 2
        _stop(sql, ids[:10])
        wait_for(lambda: len(got) == 10, 5, "the first ten to wake")
        assert sorted(got) == ids[:10]
        _stop(sql, ids[10:])
        for t in threads:
            t.join(10)
        assert sorted(got) == ids and all(r.run_id == k for k, r in got.items())
    # Closed with the client: no connection stays behind.
    wait_for(lambda: _connections(sql) == 0, 5, "the client's connections to close")


@pytest.fixture
def gated(settings: Settings, sql: SQL) -> Iterator[Callable[[bool], None]]:
    """Open or shut the test's database to new connections (those open stay), from the
    server's maintenance database: Postgres refuses it from inside."""
    name = psycopg.sql.Identifier(sql("SELECT current_database()")[0][0])
    base = settings.database_url.rsplit("/", 1)[0] + "/postgres"

    def allow(yes: bool) -> None:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(
                name, psycopg.sql.SQL("true" if yes else "false")))  # fmt: skip

    yield allow
    allow(True)


def test_waiters_wake_for_runs_that_stopped_while_their_connection_was_down(
    settings: Settings, store: PgStore, sql: SQL, gated: Callable[[bool], None]
) -> None:
    ids = _runs(store, "drop", 12)
    sync_ids, async_ids = ids[:6], ids[6:]
    # A look every 60 s: a run that wakes its waiter in this test was heard or read again.
    db = Database(settings.database_url, give_up_after=30)
    waits = PgStore(db)
    got: dict[str, Run] = {}
    loop_done = threading.Event()

    def wait_async() -> None:
        async def main() -> None:
            runs = await asyncio.gather(*(waits.wait_async(r, 30, poll=60) for r in async_ids))
            got.update({r.run_id: r for r in runs})

        asyncio.run(main())
        loop_done.set()

    threads = [
        threading.Thread(target=lambda r=r: got.update({r: waits.wait(r, 30, poll=60)}))
        for r in sync_ids
    ] + [threading.Thread(target=wait_async)]
    try:
        for t in threads:
            t.start()
        listener = db.listener()
        wait_for(lambda: listener.looked() == len(ids), 10, "every wait to be listened for")
        pid = listener.backend_pid
        gated(False)  # the listener cannot come back until the runs have stopped
        assert sql("SELECT pg_terminate_backend(%s)", pid) == [(True,)]
        wait_for(lambda: not sql("SELECT 1 FROM pg_stat_activity WHERE pid = %s", pid), 5, "kill")
        _stop(sql, ids)  # their notifications go to nobody
        time.sleep(0.5)
        assert got == {}
        gated(True)
        started = time.monotonic()
        for t in threads:
            t.join(15)
        assert loop_done.is_set() and sorted(got) == ids
        assert all(r.status == RunStatus.DONE for r in got.values())
        assert time.monotonic() - started < 5  # the backoff's bound, not the 60 s look
        assert listener.backend_pid != pid
    finally:
        db.close()


def test_a_wait_on_an_unreachable_postgres_fails_within_the_clients_give_up(
    settings: Settings,
) -> None:
    down = dataclasses.replace(
        settings, database_url="postgresql://postgres@127.0.0.1:9/cairn", client_give_up_after=1.0
    )
    with Client(settings=down) as client:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="port 9"):
            client.wait("any", timeout=30)
        assert time.monotonic() - started < 4  # the give-up and one backoff, not the timeout
