"""Postgres connections, and the one place driver errors become domain errors."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads
from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

from cairn.core import sealing
from cairn.core.errors import StoreError, StoreUnavailable
from cairn.store.sql import QUERIES, migrations

if TYPE_CHECKING:
    from cairn.store.steering import SteerListener
    from cairn.store.waits import Listener

logger = logging.getLogger(__name__)
T = TypeVar("T")

# SQLSTATEs worth a retry: the link or the server is gone for now (class 08, admin or
# crash shutdown, "cannot connect now", too many connections), the transaction lost a
# race (serialization failure, deadlock), or the server ended a transaction that sat idle
# past its hold (a fenced write's process paused: nothing of it committed, and the retry
# meets the fence). Anything else (a value Postgres refuses, a program limit such as an
# index row too large) fails at once with its real message.
_RETRY_CLASSES = ("08",)
_RETRY_STATES = frozenset({"57P01", "57P02", "57P03", "53300", "40001", "40P01", "25P03"})


def _heals(exc: BaseException) -> bool:
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg.InterfaceError):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate
    if state is None:  # raised by the client itself: the connection failed or dropped
        return isinstance(exc, psycopg.OperationalError)
    return state[:2] in _RETRY_CLASSES or state in _RETRY_STATES


def outage(exc: BaseException) -> StoreUnavailable | None:
    """The domain error for a driver error that can heal (also when raised by a step's own
    ctx.db query: the run retries, not fails); else None."""
    if _heals(exc):
        return StoreUnavailable(f"postgres unavailable: {exc}".strip())
    return None


@contextlib.contextmanager
def translated(url: str | None = None) -> Iterator[None]:
    try:
        yield
    except psycopg_pool.PoolTimeout as exc:
        # "couldn't get a connection" hides why: ask the server once, directly.
        raise StoreUnavailable(_why_unreachable(url) if url else str(exc)) from exc
    except psycopg.Error as exc:
        if _heals(exc):
            raise StoreUnavailable(f"postgres unavailable: {exc}".strip()) from exc
        if exc.sqlstate == "42P01":  # undefined table: the schema was never applied
            first = str(exc).strip().splitlines()[0]
            raise StoreError(f"{first}: run `cairn db upgrade` to create the schema") from exc
        raise StoreError(f"postgres refused: {exc}".strip()) from exc


def _why_unreachable(url: str) -> str:
    where = psycopg.conninfo.conninfo_to_dict(url)
    # A multi-host DSN (a primary and its standbys) names its hosts and ports as lists.
    hosts = str(where.get("host", "localhost")).split(",")
    ports = str(where.get("port", 5432)).split(",")
    ports = ports * len(hosts) if len(ports) == 1 else ports
    at = ",".join(f"{h}:{p}" for h, p in zip(hosts, ports, strict=False))
    try:
        psycopg.connect(url, connect_timeout=2).close()
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"postgres at {at} is unreachable: {first.rsplit('failed: ', 1)[-1]}"
    return f"postgres at {at} answered, but no pooled connection came in time (pool busy?)"


def channel(run_id: str) -> str:
    """The run's notification channel (the trigger in migration 0006 names it alike)."""
    return "cairn_" + hashlib.md5(run_id.encode()).hexdigest()[:16]  # a name, not a secret


def retrying(give_up_after: float) -> Retrying:
    """Backoff for StoreUnavailable: a restarted server is waited for, then we fail clearly."""
    return Retrying(
        retry=retry_if_exception_type(StoreUnavailable),
        wait=wait_random_exponential(multiplier=0.2, max=3.0),
        stop=stop_after_delay(give_up_after),
        before_sleep=before_sleep_log(logger, logging.WARNING),
        reraise=True,
    )


def opening(conn: psycopg.Connection[Any]) -> None:
    """A pooled connection opens the sealed payloads it loads (cairn.core.sealing): the
    json and jsonb it reads pass through open_text, which costs an unsealed value one
    search of its bytes."""
    set_json_loads(sealing.open_text, conn)


def plain(conn: psycopg.Connection[Any]) -> None:
    """A connection handed to a step's own code (ctx.db) loads JSON as it is: what a user
    reads from their own tables is never taken for cairn's (a sealed or escaped value);
    cairn's statements on it go through opened(). StepTransaction.close restores opening."""
    set_json_loads(json.loads, conn)


def opened(conn: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    """A cursor on conn (a step's own connection) whose json and jsonb are opened, for
    cairn's statements on it (a save, a record, the session items)."""
    cur = conn.cursor()
    set_json_loads(sealing.open_text, cur)
    return cur


class _Held:
    """A thread's held connection (Database.held), and whether a statement has it now."""

    __slots__ = ("conn", "lent")

    def __init__(self) -> None:
        self.conn: psycopg.Connection[Any] | None = None
        self.lent = False


class Database:
    """A small pool plus named-query helpers (procrastinate's connector shape)."""

    def __init__(
        self,
        url: str,
        *,
        max_size: int = 4,
        give_up_after: float = 30.0,
        prepare: bool = True,
        hold: float = 10.0,
        listen_url: str | None = None,
    ) -> None:
        self.url = url
        # Where waits LISTEN (CAIRN_LISTEN_URL): straight to Postgres when url goes
        # through PgBouncer in transaction mode, which passes no notifications.
        self.listen_url = listen_url
        self._listener: Listener | None = None
        self._steers: SteerListener | None = None
        self._listener_lock = threading.Lock()
        self.give_up_after = give_up_after
        self.prepare = prepare
        # How long a fenced write's transaction may sit idle holding its run's row (the
        # lease TTL: a pause shorter than that is no zombie's), as Postgres takes it.
        self.hold = str(max(1, int(hold * 1000)))
        options: dict[str, Any] = {
            "autocommit": True,
            "row_factory": dict_row,
            "connect_timeout": 5,
        }
        if not prepare:
            # PgBouncer < 1.21 in transaction mode hands each transaction any server
            # connection: a statement prepared on one is unknown on the next.
            options["prepare_threshold"] = None
        self.pool = psycopg_pool.ConnectionPool(
            url,
            min_size=1,
            max_size=max_size,
            kwargs=options,
            configure=opening,
            open=False,
            # A caller waits for a connection no longer than it would retry in all,
            # the 2 s diagnosis of a timeout (_why_unreachable) included.
            timeout=max(1.0, min(10.0, give_up_after) - 2.0),
        )
        self._opened = False
        # A thread's held connection (held()): its statements skip the pool's checkout.
        self._held = threading.local()

    def open(self) -> Database:
        if not self._opened:
            with translated():
                self.pool.open(wait=False)
            self._opened = True
        return self

    def close(self) -> None:
        with self._listener_lock:
            listener, self._listener = self._listener, None
            steers, self._steers = self._steers, None
        if listener is not None:
            listener.close()
        if steers is not None:
            steers.close()
        self.pool.close()
        self._opened = False

    def listener(self) -> Listener:
        """The one connection every wait on this database listens on (store/waits.py),
        opened with the first wait."""
        from cairn.store.waits import Listener

        with self._listener_lock:
            if self._listener is None:
                self._listener = Listener(
                    self.listen_url or self.url,
                    prepare=self.prepare,
                    give_up_after=self.give_up_after,
                )
            return self._listener

    def steers(self) -> SteerListener:
        """The one connection this process hears interrupting steer messages on
        (store/steering.py), opened with the first call that may be interrupted."""
        from cairn.store.steering import SteerListener

        with self._listener_lock:
            if self._steers is None:
                self._steers = SteerListener(self.listen_url or self.url, prepare=self.prepare)
            return self._steers

    def retry(self, fn: Callable[[], T]) -> T:
        # The first try runs bare: building a tenacity Retrying costs ~30 us, a tenth of
        # a step's budget. Only a failure pays for the backoff machinery.
        started = time.monotonic()
        try:
            return fn()
        except StoreUnavailable:
            left = self.give_up_after - (time.monotonic() - started)
            if left <= 0:
                raise
            return retrying(left)(fn)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Until the block ends, this thread's statements share one pooled connection,
        taken at the first: a checkout and its return cost a statement 15-35 us of CPU,
        a tenth of a no-op step's. For a thread that runs one delivery at a time (a
        prefork pool process); its nested statements, and other threads', still check
        out. A statement that raises gives the connection back (the pool replaces a
        broken one), and the next takes another. A pool of one holds nothing: the
        thread's step would keep the only connection from its own async steps' and
        parallel calls' records, made on other threads."""
        if getattr(self._held, "slot", None) is not None or self.pool.max_size < 2:
            yield  # held already, further out; or a pool too small to lend one out
            return
        slot = self._held.slot = _Held()
        try:
            yield
        finally:
            self._held.slot = None
            if slot.conn is not None:
                self.pool.putconn(slot.conn)

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        slot: _Held | None = getattr(self._held, "slot", None)
        if slot is None or slot.lent:
            self.open()
            with translated(self.url), self.pool.connection() as conn:
                yield conn
            return
        with translated(self.url):
            if slot.conn is None:
                self.open()
                slot.conn = self.pool.getconn()
            conn, slot.lent = slot.conn, True
            try:
                yield conn
            except BaseException as exc:
                slot.conn = None
                try:
                    conn.__exit__(type(exc), exc, exc.__traceback__)  # rolls back, as ever
                finally:
                    self.pool.putconn(conn)  # which replaces a broken one
                raise
            finally:
                slot.lent = False
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                slot.conn = None  # left in a transaction, or closed: ended as ever, given back
                try:
                    conn.__exit__(None, None, None)
                finally:
                    self.pool.putconn(conn)

    @contextlib.contextmanager
    def hearing(self, name: str) -> Iterator[Callable[[float], str | None]]:
        """LISTEN on channel name over a connection of its own (a pooled one goes back to
        the pool between statements); yields heard(seconds): the payload of the next
        notification on it within that time, else None. Behind PgBouncer in transaction
        mode none ever comes."""
        options: dict[str, Any] = {"autocommit": True, "connect_timeout": 5}
        if not self.prepare:
            options["prepare_threshold"] = None
        with translated(self.url), psycopg.connect(self.url, **options) as conn:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(name)))

            said: collections.deque[str] = collections.deque()

            def heard(seconds: float) -> str | None:
                if not said:
                    # Drained whole: psycopg reads the notifications that came together in
                    # one batch, and a generator left after the first drops the others.
                    with translated(self.url):
                        said.extend(n.payload for n in conn.notifies(timeout=seconds, stop_after=1))
                return said.popleft() if said else None

            yield heard

    def one(self, name: str, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        def attempt() -> dict[str, Any] | None:
            with self.connection() as conn:
                return conn.execute(QUERIES[name], params or {}).fetchone()

        return self.retry(attempt)

    def all(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        def attempt() -> list[dict[str, Any]]:
            with self.connection() as conn:
                return conn.execute(QUERIES[name], params or {}).fetchall()

        return self.retry(attempt)

    def hold_row(self, conn: psycopg.Connection[Any]) -> None:
        """In a transaction about to make its fenced write and commit: from here it may sit
        idle for at most `hold` (queries.sql: hold)."""
        conn.execute(QUERIES["hold"], {"hold": self.hold})

    def each(self, names: Sequence[str], params: dict[str, Any]) -> list[dict[str, Any] | None]:
        """The named queries in one transaction, in order: each one's first row."""
        if len(names) == 1:
            # One statement is a transaction of its own: no BEGIN and COMMIT round trips
            # (an enqueue's insert, two fifths of its time).
            return [self.one(names[0], params)]

        def attempt() -> list[dict[str, Any] | None]:
            with self.connection() as conn, conn.transaction():
                return [conn.execute(QUERIES[name], params).fetchone() for name in names]

        return self.retry(attempt)


def upgrade(url: str, directory: Path | None = None) -> list[int]:
    """Apply the numbered migrations not yet recorded; returns the versions applied.

    Without directory: cairn's own, recorded in cairn_migrations. With it: the user's
    NNNN_name.sql files there (their ctx.db tables), recorded apart in user_migrations so
    the two numberings never collide.
    """
    table = "user_migrations" if directory is not None else "cairn_migrations"
    if directory is not None and not directory.is_dir():
        raise StoreError(f"no migrations folder {str(directory)!r}")
    applied_now = []
    with translated(), psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(sql.Identifier(table))
        )
        # Two processes upgrading at once (demo and a worker) must not both apply one.
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (table,))
            recorded = sql.SQL("SELECT version FROM {}").format(sql.Identifier(table))
            done = {row[0] for row in conn.execute(recorded)}
            record = sql.SQL("INSERT INTO {} (version, name) VALUES (%s, %s)").format(
                sql.Identifier(table)
            )
            for version, name, text in migrations(directory):
                if version in done:
                    continue
                conn.execute(text)  # a script: several statements, no params
                conn.execute(record, (version, name))
                applied_now.append(version)
    return applied_now
