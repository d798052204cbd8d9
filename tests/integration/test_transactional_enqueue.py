"""Enqueue in the caller's transaction (Client.enqueue(connection=...)): the run commits
or rolls back with the caller's own rows, and is sent only after the commit, by a real
listener (the dispatcher beat runs) on real Postgres."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from cairn.client.aio import AsyncClient
from cairn.client.client import Client
from cairn.core.errors import InvalidInput, RunIdConflict
from cairn.core.records import RunFilter
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.store.checkpoints import PgStore
from cairn.testing import MemoryStore
from cairn.workers.dispatch import Dispatcher
from tests.integration.test_inputs import BAD, OK

SENT_WITHIN = 5.0  # seconds from the commit to the dispatcher's send, at most


class Sends:
    """What was sent, by whom: the Client itself, or the dispatcher."""

    def __init__(self) -> None:
        self.by_client: list[str] = []
        self.by_dispatcher: list[str] = []
        self._lock = threading.Lock()

    def client(self, run_id: str, priority: int = 0) -> None:
        with self._lock:
            self.by_client.append(run_id)

    def dispatcher(self, run_id: str, priority: int = 0) -> None:
        with self._lock:
            self.by_dispatcher.append(run_id)

    def until(self, run_id: str, within: float = SENT_WITHIN) -> float:
        started = time.monotonic()
        while run_id not in self.by_dispatcher:
            assert time.monotonic() - started < within, f"{run_id} not sent in {within}s"
            time.sleep(0.01)
        return time.monotonic() - started


@pytest.fixture
def sends(store: PgStore) -> Iterator[Sends]:
    sends = Sends()
    dispatcher = Dispatcher(store=store, send=sends.dispatcher, tick=0.2)
    stop = dispatcher.start()
    assert dispatcher.listening.wait(10)
    yield sends
    stop.set()


@pytest.fixture
def tx_client(settings: Settings, store: PgStore, sends: Sends) -> Iterator[Client]:
    with Client(settings=settings, store=store, send=sends.client) as client:
        yield client


@pytest.fixture
def app_conn(settings: Settings) -> Iterator[psycopg.Connection[Any]]:
    """The web app's own connection, with its own table."""
    with psycopg.connect(settings.database_url, prepare_threshold=None) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY)")
        conn.commit()
        yield conn


def test_a_committed_enqueue_is_sent_after_the_commit_and_not_before(
    tx_client: Client, store: PgStore, sends: Sends, app_conn: psycopg.Connection[Any]
) -> None:
    app_conn.execute("INSERT INTO orders VALUES ('o-1')")
    run_id = tx_client.enqueue("invoice", OK, run_id="order-o-1", connection=app_conn)
    time.sleep(0.3)
    assert store.get(run_id) is None  # not committed: no one else sees it
    assert sends.by_client == sends.by_dispatcher == []
    app_conn.commit()
    took = sends.until(run_id)
    run = store.get(run_id)
    assert run is not None and run.status == RunStatus.PENDING
    assert sends.by_client == []
    assert took < SENT_WITHIN


def test_a_rolled_back_enqueue_leaves_no_run_and_sends_nothing(
    tx_client: Client, store: PgStore, sends: Sends, app_conn: psycopg.Connection[Any]
) -> None:
    app_conn.execute("INSERT INTO orders VALUES ('o-2')")
    run_id = tx_client.enqueue("invoice", OK, connection=app_conn)
    app_conn.rollback()
    time.sleep(1.0)  # a dispatcher that heard anything has sent it by now
    assert store.get(run_id) is None
    assert sends.by_client == sends.by_dispatcher == []
    assert app_conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)


def test_the_same_run_id_in_two_transactions_is_one_run(
    tx_client: Client, store: PgStore, sends: Sends, app_conn: psycopg.Connection[Any]
) -> None:
    first = tx_client.enqueue("invoice", OK, run_id="order-o-3", connection=app_conn)
    app_conn.commit()
    sends.until(first)
    again = tx_client.enqueue("invoice", OK, run_id="order-o-3", connection=app_conn)
    app_conn.commit()
    assert again == first
    assert [r.run_id for r in tx_client.list()] == [first]
    # Another input under that id is refused in one line, and the caller's transaction
    # goes on (the enqueue ran in a savepoint of it).
    app_conn.execute("INSERT INTO orders VALUES ('o-3')")
    with pytest.raises(RunIdConflict) as refused:
        tx_client.enqueue("invoice", {**OK, "customer": "other"}, run_id=first, connection=app_conn)
    assert "\n" not in str(refused.value)
    app_conn.commit()
    assert app_conn.execute("SELECT count(*) FROM orders").fetchone() == (1,)
    assert sends.by_client == []


def test_a_keyed_run_is_sent_when_its_key_lets_it_in(
    tx_client: Client, sends: Sends, app_conn: psycopg.Connection[Any]
) -> None:
    run_id = tx_client.enqueue("invoice", OK, concurrency_key="acme", connection=app_conn)
    app_conn.commit()
    sends.until(run_id)
    assert sends.by_client == []


@pytest.mark.parametrize(("what", "run_id", "data", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_as_without_a_connection(
    tx_client: Client, app_conn: psycopg.Connection[Any], what: str, run_id, data, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message) as refused:
        tx_client.enqueue("invoice", data, run_id=run_id, connection=app_conn)
    assert "\n" not in str(refused.value)
    app_conn.commit()
    assert tx_client.list() == []


CONNECTIONS: list[tuple[str, Callable[[psycopg.Connection[Any]], object], str]] = [
    (
        "a DSN string",
        lambda c: c.info.dsn,
        "must be a psycopg 3 Connection or AsyncConnection, not str",
    ),
    ("a cursor", lambda c: c.cursor(), "not Cursor"),
]


@pytest.mark.parametrize(("what", "make", "message"), CONNECTIONS, ids=[c[0] for c in CONNECTIONS])
def test_what_is_no_connection_is_refused_in_one_line(
    tx_client: Client,
    app_conn: psycopg.Connection[Any],
    what: str,
    make: Callable[[psycopg.Connection[Any]], object],
    message: str,
) -> None:
    with pytest.raises(InvalidInput, match=message) as refused:
        tx_client.enqueue("invoice", OK, connection=make(app_conn))
    assert "\n" not in str(refused.value)
    assert tx_client.list() == []


def test_the_in_memory_store_says_a_connection_needs_postgres(
    app_conn: psycopg.Connection[Any],
) -> None:
    with Client(store=MemoryStore(), send=lambda r, p: None) as client:
        with pytest.raises(InvalidInput, match="needs a Client on Postgres, not MemoryStore"):
            client.enqueue("invoice", OK, connection=app_conn)
        assert client.list() == []


def test_the_async_client_enqueues_on_an_async_connection_or_a_sync_one(
    settings: Settings, store: PgStore, sends: Sends, app_conn: psycopg.Connection[Any]
) -> None:
    async def main() -> list[str]:
        async with (
            AsyncClient(settings=settings, store=store, send=sends.client) as client,
            await psycopg.AsyncConnection.connect(settings.database_url) as aconn,
        ):
            await aconn.execute("INSERT INTO orders VALUES ('a-1')")
            gone = await client.enqueue("invoice", OK, run_id="async-gone", connection=aconn)
            await aconn.rollback()
            kept = await client.enqueue("invoice", OK, run_id="async-kept", connection=aconn)
            await aconn.commit()
            threaded = await client.enqueue("invoice", OK, connection=app_conn)
            app_conn.commit()
            sync = client.sync  # the Client refuses what it cannot drive from its thread
            with pytest.raises(InvalidInput, match="await AsyncClient.enqueue with it"):
                sync.enqueue("invoice", OK, connection=aconn)
            return [gone, kept, threaded]

    gone, kept, threaded = asyncio.run(main())
    sends.until(kept)
    sends.until(threaded)
    assert store.get(gone) is None and gone not in sends.by_dispatcher
    assert sends.by_client == []
    assert {r.run_id for r in store.list_runs(RunFilter())} == {kept, threaded}


def test_a_send_that_fails_leaves_the_dispatcher_listening(
    settings: Settings, store: PgStore, app_conn: psycopg.Connection[Any]
) -> None:
    sent: list[str] = []

    def send(run_id: str, priority: int) -> None:
        if not sent:
            sent.append("refused")
            raise ConnectionError("broker down")  # that run is left to the reaper
        sent.append(run_id)

    dispatcher = Dispatcher(store=store, send=send, tick=0.2)
    stop = dispatcher.start()
    try:
        assert dispatcher.listening.wait(10)
        with Client(settings=settings, store=store, send=send) as client:
            client.enqueue("invoice", OK, run_id="first", connection=app_conn)
            app_conn.commit()
            client.enqueue("invoice", OK, run_id="second", connection=app_conn)
            app_conn.commit()
        started = time.monotonic()
        while sent != ["refused", "second"]:
            assert time.monotonic() - started < SENT_WITHIN, sent
            time.sleep(0.01)
        first = store.get("first")
        assert first is not None and first.status == RunStatus.PENDING  # the reaper's now
    finally:
        stop.set()
