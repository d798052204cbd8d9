"""The OpenAI Agents SDK's sessions on cairn's Postgres (migration 0014): the SQL half of
cairn.openai_agents.CairnSession, which decides the connection.

Inside a step the session passes the step's own transaction (ctx.db), so a turn's items
commit with the step's checkpoint: a killed step writes none, and a zombie's save is
fenced and rolls them back. Outside a step (a web app showing a chat) SessionStore runs
the same queries on a pool of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from cairn.store.db import Database, opened, translated
from cairn.store.payloads import each
from cairn.store.sql import QUERIES


def _limit(limit: int | None) -> int | None:
    # The SDK's SQLiteSession reads a negative limit as no limit (SQLite's LIMIT does).
    return None if limit is None or limit < 0 else limit


def items(conn: psycopg.Connection[Any], session_id: str, limit: int | None = None) -> list[Any]:
    """The session's newest limit items (all: None), oldest first."""
    if limit == 0:
        return []
    with translated():
        rows = (
            opened(conn)
            .execute(
                QUERIES["agent_session_items"], {"session_id": session_id, "limit": _limit(limit)}
            )
            .fetchall()
        )
    return [_item(r) for r in rows]


def add(
    conn: psycopg.Connection[Any], session_id: str, new: Sequence[Any], run_id: str | None
) -> None:
    """Append new to the session, in order; run_id: the run writing them, if any."""
    if not new:
        return
    params = {
        "session_id": session_id,
        "items": each(new),
        "run_id": run_id,
    }
    with translated():
        conn.execute(QUERIES["agent_session_add"], params)


def pop(conn: psycopg.Connection[Any], session_id: str) -> Any | None:
    """Remove the session's newest item and return it; None if it has none."""
    with translated():
        row = (
            opened(conn)
            .execute(QUERIES["agent_session_pop"], {"session_id": session_id})
            .fetchone()
        )
    return _item(row) if row is not None else None


def clear(conn: psycopg.Connection[Any], session_id: str) -> None:
    with translated():
        conn.execute(QUERIES["agent_session_clear"], {"session_id": session_id})


def _item(row: dict[str, Any] | tuple[Any, ...]) -> Any:
    # A step's connection hands out dicts (the pool's row factory); be plain about either.
    return row["item"] if isinstance(row, dict) else row[0]


class SessionStore:
    """Sessions outside a step: each call its own short transaction on db (retried while
    Postgres is briefly away, as every store read is)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def items(self, session_id: str, limit: int | None = None) -> list[Any]:
        def attempt() -> list[Any]:
            with self.db.connection() as conn:
                return items(conn, session_id, limit)

        return self.db.retry(attempt)

    def add(self, session_id: str, new: Sequence[Any]) -> None:
        # Not retried: a lost commit reply would append the items twice.
        with self.db.connection() as conn, conn.transaction():
            add(conn, session_id, new, None)

    def pop(self, session_id: str) -> Any | None:
        with self.db.connection() as conn, conn.transaction():
            return pop(conn, session_id)

    def clear(self, session_id: str) -> None:
        def attempt() -> None:
            with self.db.connection() as conn, conn.transaction():
                clear(conn, session_id)

        self.db.retry(attempt)
