"""Postgres connections, and the one place driver errors become domain errors."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg.rows import dict_row
from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

from cairn.errors import StoreUnavailable
from cairn.store.sql import QUERIES, migrations

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Errors that mean "the server or the link is gone", as opposed to a bug in a query.
_TRANSIENT = (psycopg.OperationalError, psycopg.InterfaceError, psycopg_pool.PoolTimeout)


def outage(exc: BaseException) -> StoreUnavailable | None:
    """The domain error for a driver error that means the server or link is gone (also
    when raised by a step's own ctx.db query: the run retries, not fails); else None."""
    if isinstance(exc, _TRANSIENT):
        return StoreUnavailable(f"postgres unavailable: {exc}".strip())
    return None


@contextlib.contextmanager
def translated() -> Iterator[None]:
    try:
        yield
    except _TRANSIENT as exc:
        raise outage(exc) from exc  # type: ignore[misc]


def retrying(give_up_after: float) -> Retrying:
    """Backoff for StoreUnavailable: a restarted server is waited for, then we fail clearly."""
    return Retrying(
        retry=retry_if_exception_type(StoreUnavailable),
        wait=wait_random_exponential(multiplier=0.2, max=3.0),
        stop=stop_after_delay(give_up_after),
        before_sleep=before_sleep_log(logger, logging.WARNING),
        reraise=True,
    )


class Database:
    """A small pool plus named-query helpers (procrastinate's connector shape)."""

    def __init__(self, url: str, *, max_size: int = 4, give_up_after: float = 30.0) -> None:
        self.url = url
        self.give_up_after = give_up_after
        self.pool = psycopg_pool.ConnectionPool(
            url,
            min_size=1,
            max_size=max_size,
            kwargs={"autocommit": True, "row_factory": dict_row},
            open=False,
            timeout=10.0,
        )
        self._opened = False

    def open(self) -> Database:
        if not self._opened:
            with translated():
                self.pool.open(wait=False)
            self._opened = True
        return self

    def close(self) -> None:
        self.pool.close()
        self._opened = False

    def retry(self, fn: Callable[[], T]) -> T:
        # The first try runs bare: building a tenacity Retrying costs ~30 us, a tenth of
        # a step's budget. Only a failure pays for the backoff machinery.
        try:
            return fn()
        except StoreUnavailable:
            return retrying(self.give_up_after)(fn)

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        self.open()
        with translated(), self.pool.connection() as conn:
            yield conn

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


def upgrade(url: str) -> list[int]:
    """Apply the numbered migrations not yet recorded; returns the versions applied."""
    applied_now = []
    with translated(), psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS cairn_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        # Two processes upgrading at once (demo and a worker) must not both apply one.
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('cairn_migrations'))")
            done = {row[0] for row in conn.execute("SELECT version FROM cairn_migrations")}
            for version, name, text in migrations():
                if version in done:
                    continue
                conn.execute(text)
                conn.execute(
                    "INSERT INTO cairn_migrations (version, name) VALUES (%s, %s)",
                    (version, name),
                )
                applied_now.append(version)
    return applied_now
