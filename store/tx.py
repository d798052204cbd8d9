"""A step's own Postgres connection, in a transaction that commits with its checkpoint."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

    from cairn.store.db import Database

    Connection = psycopg.Connection[Any]  # what ctx.db is, for the steps' annotations


class StepTransaction:
    """Owns one pooled connection for one step attempt.

    The connection is taken on first use (most steps never touch it). `PgStore.save`
    runs the checkpoint's upsert on it and commits both together; `close` rolls back
    whatever was not committed and gives the connection back to the pool.
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        self._stack: contextlib.ExitStack | None = None
        self._conn: psycopg.Connection[Any] | None = None

    @property
    def connection(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            from cairn.store.db import opening, plain

            stack = contextlib.ExitStack()
            conn = stack.enter_context(self._db.connection())
            stack.callback(opening, conn)  # the pool's way again, before it goes back
            plain(conn)  # the step's own reads: its JSON as it is, never opened
            conn.autocommit = False
            self._stack, self._conn = stack, conn
        return self._conn

    @property
    def open(self) -> psycopg.Connection[Any] | None:
        """The connection if the step used it, else None (the save then uses any)."""
        return self._conn

    def close(self) -> None:
        if self._conn is None or self._stack is None:
            return
        conn, stack, self._conn, self._stack = self._conn, self._stack, None, None
        with stack:
            if not conn.closed:
                conn.rollback()
                conn.autocommit = True
