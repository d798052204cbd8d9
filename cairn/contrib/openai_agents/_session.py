"""The Agents SDK's Session (a conversation's memory across runs) in cairn's Postgres."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from agents import TResponseInputItem
from agents.memory import SessionSettings

from cairn.core.errors import CairnError
from cairn.core.settings import Settings
from cairn.steps.context import Context, current
from cairn.store import sessions
from cairn.store.db import Database
from cairn.store.sessions import SessionStore

_NEEDS_POSTGRES = (
    "CairnSession needs PgStore (Postgres): a turn's items commit with the step's checkpoint "
    "in one Postgres transaction, which MemoryStore cannot give"
)


class CairnSession:
    """An Agents SDK session (the SDK's Session protocol) kept in cairn's Postgres, table
    agent_session_items: pass it as Runner.run(..., session=...), or let
    agent_workflow(..., session=True) make one per run from its input's "session_id".

    Inside a cairn step every read and write goes through the step's own transaction
    (ctx.db): the step sees the items it added, and they commit with its checkpoint, so a
    step killed before its save leaves none and a zombie's (a worker paused past its
    lease) are rolled back when its save is fenced; the retried step writes the turn once.
    Outside a step (a script, a web app) each call is its own transaction on a pool this
    session opens (settings: where Postgres is, by default the CAIRN_* environment;
    store: a SessionStore to use instead). Turns of one session are meant to run one at a
    time, as a chat's do (a concurrency key on the session id keeps them so).
    """

    def __init__(
        self,
        session_id: str,
        *,
        settings: Settings | None = None,
        store: SessionStore | None = None,
        session_settings: SessionSettings | None = None,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise CairnError("a CairnSession wants a non-empty session id")
        self.session_id = session_id
        self.session_settings = session_settings
        self._settings = settings
        self._store = store
        self._opened = False  # whether close() has a pool of ours to close
        self._lock = threading.Lock()

    # -- the SDK's Session protocol ------------------------------------------------------
    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The newest limit items (all: None), oldest first; in a step, its own too."""
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        if (ctx := current()) is not None:
            return sessions.items(_step_db(ctx), self.session_id, limit)
        return await asyncio.to_thread(self.store.items, self.session_id, limit)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append items; in a step, committed with its checkpoint."""
        if (ctx := current()) is not None:
            sessions.add(_step_db(ctx), self.session_id, items, ctx.run_id)
            return
        await asyncio.to_thread(self.store.add, self.session_id, items)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item (None: empty); in a step, with its save."""
        if (ctx := current()) is not None:
            item: TResponseInputItem | None = sessions.pop(_step_db(ctx), self.session_id)
            return item
        popped: TResponseInputItem | None = await asyncio.to_thread(self.store.pop, self.session_id)
        return popped

    async def clear_session(self) -> None:
        """Delete every item of the session; in a step, with its save."""
        if (ctx := current()) is not None:
            sessions.clear(_step_db(ctx), self.session_id)
            return
        await asyncio.to_thread(self.store.clear, self.session_id)

    # -- outside a step --------------------------------------------------------------------
    @property
    def store(self) -> SessionStore:
        """The SessionStore calls outside a step use (opened on first use)."""
        with self._lock:
            if self._store is None:
                s = self._settings or Settings.from_env()
                db = Database(
                    s.database_url,
                    max_size=2,
                    prepare=s.database_prepare,
                    give_up_after=s.store_give_up_after,
                )
                self._store = SessionStore(db.open())
                self._opened = True
            return self._store

    def close(self) -> None:
        """Close the pool this session opened (not a store it was given)."""
        with self._lock:
            if not self._opened or self._store is None:
                return
            store, self._store, self._opened = self._store, None, False
        store.db.close()


def _step_db(ctx: Context) -> Any:
    # ctx.db: the step's transaction (a journaled call's own inside one), taken after the
    # lease check, committed by the step's save. Synchronous, as ctx.db is in async steps:
    # the queries are short, and a thread would not make the commit any less the save's.
    try:
        return ctx.db
    except CairnError as exc:
        # MemoryStore's refusal is a bare CairnError (a lost lease is a subclass): say what
        # needs Postgres here, the session, not a ctx.db the user never wrote.
        if type(exc) is CairnError:
            raise CairnError(_NEEDS_POSTGRES) from exc
        raise


def session_items(
    session_id: str, *, limit: int | None = None, settings: Settings | None = None
) -> list[TResponseInputItem]:
    """The items of a session, oldest first (the newest limit of them): what a web app
    shows of a chat, read outside any step. Opens a connection for the call and closes it;
    hold a CairnSession (await get_items()) to read often."""
    s = settings or Settings.from_env()
    db = Database(
        s.database_url,
        max_size=1,
        prepare=s.database_prepare,
        give_up_after=s.store_give_up_after,
    )
    try:
        return SessionStore(db.open()).items(session_id, limit)
    finally:
        db.close()
