"""Enqueue in the caller's transaction, in each state the caller's psycopg connection can
be in when `enqueue(..., connection=conn)` is called: never a commit or a rollback of
what the caller owns. On an idle connection that is not autocommit (the enqueue is the
transaction's first statement, as in a SQLAlchemy Session or a Django atomic block) the
run joins the transaction the caller's next commit or rollback ends; inside a transaction
or a `conn.transaction()` block the same; on an autocommit connection outside a block
the run commits at once, in a transaction of its own (the caller has none); a connection
in a failed transaction is refused in one line. Each for psycopg's sync and async
connections, with beat's dispatcher (a real listener) counting what it sends."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from cairn.client.aio import AsyncClient
from cairn.client.client import Client
from cairn.core.errors import InvalidInput, RunIdConflict, StoreError
from cairn.core.settings import Settings
from cairn.store.checkpoints import PgStore
from cairn.workers.dispatch import Dispatcher
from cairn.workers.wake import Waker
from tests.integration.test_inputs import OK

SENT_WITHIN = 5.0  # seconds from a commit to the dispatcher's send, at most
QUIET = 1.0  # seconds a dispatcher that heard a notification has sent its run by

Enqueue = Callable[[], Any]


@pytest.fixture
def sent(store: PgStore) -> Iterator[list[str]]:
    """The run ids beat's dispatcher sends, heard from this test's database."""
    sent: list[str] = []
    lock = threading.Lock()

    def send(run_id: str, priority: int = 0) -> None:
        with lock:
            sent.append(run_id)

    dispatcher = Dispatcher(store=store, send=send, tick=0.2)
    stop = dispatcher.start()
    assert dispatcher.listening.wait(10)
    yield sent
    stop.set()


def _sent_once(sent: list[str], run_id: str) -> None:
    deadline = time.monotonic() + SENT_WITHIN
    while run_id not in sent:
        assert time.monotonic() < deadline, f"{run_id} was not sent after its commit"
        time.sleep(0.02)
    time.sleep(0.3)  # a second send would have come by now
    assert sent.count(run_id) == 1, sent


# -- the caller's code, in each state: it enqueues, then commits (True) or rolls back ----
def _idle(conn: psycopg.Connection[Any], enqueue: Enqueue, commit: bool) -> None:
    assert conn.info.transaction_status == TransactionStatus.IDLE
    enqueue()  # the transaction's first statement
    assert conn.info.transaction_status == TransactionStatus.INTRANS  # open: the caller's
    conn.execute("INSERT INTO orders VALUES ('o')")
    conn.commit() if commit else conn.rollback()


def _in_transaction(conn: psycopg.Connection[Any], enqueue: Enqueue, commit: bool) -> None:
    conn.execute("INSERT INTO orders VALUES ('o')")
    enqueue()
    conn.commit() if commit else conn.rollback()


def _block(conn: psycopg.Connection[Any], enqueue: Enqueue, commit: bool) -> None:
    with conn.transaction():  # commits at its end, or rolls back on psycopg.Rollback
        enqueue()
        conn.execute("INSERT INTO orders VALUES ('o')")
        if not commit:
            raise psycopg.Rollback()


def _autocommit(conn: psycopg.Connection[Any], enqueue: Enqueue, commit: bool) -> None:
    conn.autocommit = True
    enqueue()  # the caller has no transaction: the run's own commits at once
    assert conn.info.transaction_status == TransactionStatus.IDLE
    conn.execute("INSERT INTO orders VALUES ('o')")
    conn.commit() if commit else conn.rollback()  # nothing to end


def _autocommit_block(conn: psycopg.Connection[Any], enqueue: Enqueue, commit: bool) -> None:
    conn.autocommit = True
    _block(conn, enqueue, commit)


async def _aidle(conn: psycopg.AsyncConnection[Any], enqueue: Enqueue, commit: bool) -> None:
    assert conn.info.transaction_status == TransactionStatus.IDLE
    await enqueue()
    assert conn.info.transaction_status == TransactionStatus.INTRANS
    await conn.execute("INSERT INTO orders VALUES ('o')")
    await (conn.commit() if commit else conn.rollback())


async def _ain_transaction(
    conn: psycopg.AsyncConnection[Any], enqueue: Enqueue, commit: bool
) -> None:
    await conn.execute("INSERT INTO orders VALUES ('o')")
    await enqueue()
    await (conn.commit() if commit else conn.rollback())


async def _ablock(conn: psycopg.AsyncConnection[Any], enqueue: Enqueue, commit: bool) -> None:
    async with conn.transaction():
        await enqueue()
        await conn.execute("INSERT INTO orders VALUES ('o')")
        if not commit:
            raise psycopg.Rollback()


async def _aautocommit(conn: psycopg.AsyncConnection[Any], enqueue: Enqueue, commit: bool) -> None:
    await conn.set_autocommit(True)
    await enqueue()
    assert conn.info.transaction_status == TransactionStatus.IDLE
    await conn.execute("INSERT INTO orders VALUES ('o')")
    await (conn.commit() if commit else conn.rollback())


async def _aautocommit_block(
    conn: psycopg.AsyncConnection[Any], enqueue: Enqueue, commit: bool
) -> None:
    await conn.set_autocommit(True)
    await _ablock(conn, enqueue, commit)


# name, the sync caller, the async one, whether the run outlives the caller's rollback
STATES = [
    ("idle", _idle, _aidle, False),
    ("in_transaction", _in_transaction, _ain_transaction, False),
    ("transaction_block", _block, _ablock, False),
    ("autocommit", _autocommit, _aautocommit, True),
    ("autocommit_transaction_block", _autocommit_block, _aautocommit_block, False),
]
IDS = [s[0] for s in STATES]


@pytest.fixture
def orders(settings: Settings) -> None:
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY)")


def _connect(settings: Settings) -> psycopg.Connection[Any]:
    return psycopg.connect(settings.database_url, prepare_threshold=None)


def _orders(settings: Settings) -> int:
    with psycopg.connect(settings.database_url) as conn:
        row = conn.execute("SELECT count(*) FROM orders").fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
@pytest.mark.parametrize(("name", "caller", "acaller", "kept"), STATES, ids=IDS)
def test_a_sync_connection_in_each_state_commits_the_run_with_the_caller_or_never(
    settings: Settings,
    store: PgStore,
    sent: list[str],
    orders: None,
    name: str,
    caller: Callable[[psycopg.Connection[Any], Enqueue, bool], None],
    acaller: Any,
    kept: bool,
    commit: bool,
) -> None:
    run_id = f"{name}-{commit}"
    never = []  # the Client itself sends nothing
    with (
        Client(settings=settings, store=store, send=lambda r, p: never.append(r)) as client,
        _connect(settings) as conn,
    ):
        caller(conn, lambda: client.enqueue("invoice", OK, run_id=run_id, connection=conn), commit)
        assert conn.info.transaction_status == TransactionStatus.IDLE  # all the caller's ended
    _verdict(store, sent, run_id, commit or kept)
    assert _orders(settings) == int(commit or name == "autocommit")
    assert never == []


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
@pytest.mark.parametrize(("name", "caller", "acaller", "kept"), STATES, ids=IDS)
def test_an_async_connection_in_each_state_commits_the_run_with_the_caller_or_never(
    settings: Settings,
    store: PgStore,
    sent: list[str],
    orders: None,
    name: str,
    caller: Any,
    acaller: Callable[[psycopg.AsyncConnection[Any], Enqueue, bool], Awaitable[None]],
    kept: bool,
    commit: bool,
) -> None:
    run_id = f"async-{name}-{commit}"

    async def main() -> None:
        async with (
            AsyncClient(settings=settings, store=store, send=lambda r, p: None) as client,
            await psycopg.AsyncConnection.connect(settings.database_url) as conn,
        ):

            def enqueue() -> Awaitable[str]:
                return client.enqueue("invoice", OK, run_id=run_id, connection=conn)

            await acaller(conn, enqueue, commit)
            assert conn.info.transaction_status == TransactionStatus.IDLE

    asyncio.run(main())
    _verdict(store, sent, run_id, commit or kept)


def _verdict(store: PgStore, sent: list[str], run_id: str, kept: bool) -> None:
    if kept:
        assert store.get(run_id) is not None
        _sent_once(sent, run_id)
    else:
        time.sleep(QUIET)
        assert store.get(run_id) is None
        assert run_id not in sent, sent


def test_a_connection_in_a_failed_transaction_is_refused_in_one_line(
    settings: Settings, store: PgStore, sent: list[str]
) -> None:
    async def aborted() -> str:
        async with (
            AsyncClient(settings=settings, store=store, send=lambda r, p: None) as client,
            await psycopg.AsyncConnection.connect(settings.database_url) as conn,
        ):
            with contextlib.suppress(psycopg.errors.DivisionByZero):
                await conn.execute("SELECT 1/0")
            with pytest.raises(InvalidInput) as refused:
                await client.enqueue("invoice", OK, run_id="async-aborted", connection=conn)
            assert conn.info.transaction_status == TransactionStatus.INERROR  # untouched
            return str(refused.value)

    with (
        Client(settings=settings, store=store, send=lambda r, p: None) as client,
        _connect(settings) as conn,
    ):
        with contextlib.suppress(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        with pytest.raises(InvalidInput) as refused:
            client.enqueue("invoice", OK, run_id="aborted", connection=conn)
        assert conn.info.transaction_status == TransactionStatus.INERROR
        conn.rollback()  # what the message says to do; then the enqueue goes through
        client.enqueue("invoice", OK, run_id="after", connection=conn)
        conn.commit()
        conn.close()
        with pytest.raises(InvalidInput, match="connection= is closed"):
            client.enqueue("invoice", OK, run_id="closed", connection=conn)
    for message in (str(refused.value), asyncio.run(aborted())):
        assert "failed transaction" in message and "roll it back" in message, message
        assert "\n" not in message
    _sent_once(sent, "after")
    assert store.get("aborted") is None and store.get("async-aborted") is None
    assert store.get("closed") is None


def test_a_refusal_as_the_first_statement_leaves_the_callers_transaction_usable(
    settings: Settings, store: PgStore, sent: list[str], orders: None
) -> None:
    """A refusal in Python (RunIdConflict) and one by Postgres (a lock timeout while
    another transaction holds the same run id) each undo the enqueue alone: the caller's
    transaction, begun by the enqueue, goes on and commits what the caller wrote."""
    with (
        Client(settings=settings, store=store, send=lambda r, p: None) as client,
        _connect(settings) as conn,
        _connect(settings) as other,
    ):
        client.enqueue("invoice", OK, run_id="taken", connection=conn)
        conn.commit()
        with pytest.raises(RunIdConflict):
            client.enqueue("invoice", {**OK, "customer": "other"}, run_id="taken", connection=conn)
        assert conn.info.transaction_status == TransactionStatus.INTRANS  # the caller's, usable
        conn.execute("INSERT INTO orders VALUES ('o-1')")
        conn.commit()
        # Another transaction's run with this id, not committed: the insert waits for it.
        client.enqueue("invoice", OK, run_id="held", connection=other)
        conn.execute("SET lock_timeout = '200ms'")
        conn.commit()
        with pytest.raises(StoreError, match="lock timeout"):
            client.enqueue("invoice", OK, run_id="held", connection=conn)
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        conn.execute("INSERT INTO orders VALUES ('o-2')")
        conn.commit()
        other.rollback()
    assert _orders(settings) == 2
    assert store.get("held") is None
    _sent_once(sent, "taken")


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_a_sqlalchemy_session_commits_its_run_with_the_session_or_never(
    settings: Settings, store: PgStore, sent: list[str], orders: None, commit: bool
) -> None:
    """The enqueue as the Session's first statement (SQLAlchemy begins the DBAPI
    transaction implicitly, so the psycopg connection is idle until then)."""
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    url = settings.database_url.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = sqlalchemy.create_engine(url)
    run_id = f"session-{commit}"
    try:
        with (
            Client(settings=settings, store=store, send=lambda r, p: None) as client,
            Session(engine) as session,
        ):
            conn = session.connection().connection.driver_connection
            assert isinstance(conn, psycopg.Connection)
            assert conn.info.transaction_status == TransactionStatus.IDLE
            client.enqueue("invoice", OK, run_id=run_id, connection=conn)
            session.execute(sqlalchemy.text("INSERT INTO orders VALUES ('o')"))
            session.commit() if commit else session.rollback()
    finally:
        engine.dispose()
    _verdict(store, sent, run_id, commit)
    assert _orders(settings) == int(commit)


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_a_debounce_as_the_first_statement_commits_with_the_caller_or_never(
    settings: Settings, store: PgStore, commit: bool
) -> None:
    """debounce_in, sync and async, on an idle connection: the run the wake pass sends once
    its quiet period ends is there only if the caller committed."""
    woken: list[str] = []
    waker = Waker(store=store, send=woken.append)

    def options(key: str) -> dict[str, Any]:
        return {"debounce_key": key, "debounce": 0.3}

    async def main() -> str:
        async with (
            AsyncClient(settings=settings, store=store, send=lambda r, p: None) as client,
            await psycopg.AsyncConnection.connect(settings.database_url) as conn,
        ):
            got = await client.enqueue("invoice", OK, connection=conn, **options("async"))
            await (conn.commit() if commit else conn.rollback())
            return str(got)

    with (
        Client(settings=settings, store=store, send=lambda r, p: None) as client,
        _connect(settings) as conn,
    ):
        assert conn.info.transaction_status == TransactionStatus.IDLE
        run_id = client.enqueue("invoice", OK, connection=conn, **options("sync"))
        conn.commit() if commit else conn.rollback()
    ids = [run_id, asyncio.run(main())]
    time.sleep(0.5)
    assert sorted(waker.wake()) == (sorted(ids) if commit else [])
    assert [store.get(r) is not None for r in ids] == [commit, commit]
    assert waker.wake() == []  # once
