"""Where asyncio waits on Postgres natively: LISTEN for a run's notification on an async
connection (PgStore.wait_async, AsyncClient.wait). Every other async call runs the sync
store in a worker thread: a short query needs no second, hand-kept async store.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql

from cairn.store.db import Database, translated


@contextlib.asynccontextmanager
async def listening(db: Database, name: str) -> AsyncIterator[Callable[[float], Awaitable[bool]]]:
    """Database.listening for asyncio: LISTEN on channel name over a connection of its own;
    yields heard(seconds), whether a notification came within that time. Behind PgBouncer
    in transaction mode none ever does: callers look again now and then."""
    options: dict[str, Any] = {"autocommit": True, "connect_timeout": 5}
    if not db.prepare:
        options["prepare_threshold"] = None
    with translated(db.url):
        conn = await psycopg.AsyncConnection.connect(db.url, **options)
    try:
        with translated(db.url):
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(name)))

        async def heard(seconds: float) -> bool:
            with translated(db.url):
                async for _ in conn.notifies(timeout=seconds, stop_after=1):
                    return True
            return False

        yield heard
    finally:
        await conn.close()
