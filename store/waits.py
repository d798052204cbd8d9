"""Waiting for runs at a web app's scale: one LISTEN connection carries every wait of a
Database (Client.wait, AsyncClient.wait), its notifications fanned out by run.

A thread of the Listener's own owns the connection. It LISTENs on each waited run's channel
(store/db.py channel), then reads the runs it was asked about in one statement: a run that
stopped before its LISTEN began is seen there, one that stops after is heard. A
notification reads its channel's runs again. A dropped connection is opened again (backoff
up to MAX_BACKOFF) and every waited run read again: one that stopped while nobody listened
still wakes its waiter. Behind PgBouncer in transaction mode no notification ever comes, so
each waiter's run is also read every `poll` seconds, the due ones in one statement.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from cairn.core.errors import CairnError, StoreError, StoreUnavailable, UnknownRun
from cairn.core.records import Run
from cairn.core.status import SETTLED
from cairn.store.rows import settled
from cairn.store.sql import QUERIES

logger = logging.getLogger(__name__)

# Between attempts to open the connection again: quick for a blip (a restarted PgBouncer,
# a killed backend), bounded so a waiter hears of a server back within MAX_BACKOFF.
FIRST_BACKOFF, MAX_BACKOFF = 0.05, 2.0


@dataclasses.dataclass(eq=False)
class Waiter:
    """One wait, as the Listener's thread sees it: the last read of its run, and how to
    tell the waiting thread or task that something changed (wake, called from the
    Listener's thread)."""

    run_id: str
    channel: str
    poll: float
    wake: Callable[[], None]
    next_look: float = 0.0
    looked: bool = False
    run: Run | None = None
    done: bool = False
    error: CairnError | None = None

    def outcome(self, timeout: float | None, deadline: float) -> Run | float:
        """The run once settled, else the seconds to wait for news. Raises UnknownRun,
        StoreUnavailable, or WaitTimedOut past the deadline."""
        if self.error is not None:
            raise self.error
        if self.done:
            assert self.run is not None
            return self.run
        if not self.looked:  # the first read decides, even for a timeout of 0
            return max(deadline - time.monotonic(), 0.05)
        left = settled(self.run_id, self.run, timeout, deadline)
        return left if left is not None else 0.0


class Listener:
    """Every wait of one client on one connection, opened on the first wait (url: the
    database's, or CAIRN_LISTEN_URL straight to Postgres), closed with the client. A
    waiter fails with StoreUnavailable once the connection stayed down give_up_after."""

    def __init__(self, url: str, *, prepare: bool = True, give_up_after: float = 30.0) -> None:
        self.url = url
        self.give_up_after = give_up_after
        self._options: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": 5,
            "row_factory": dict_row,
            "application_name": "cairn-wait",
        }
        if not prepare:
            self._options["prepare_threshold"] = None
        self._lock = threading.Lock()
        self._waiters: dict[str, set[Waiter]] = {}  # by channel
        self._fresh: list[Waiter] = []  # joined (or back after a drop): to be read
        self._listening: set[str] = set()  # the thread's own, as is all below
        self._heard: set[str] = set()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._nudge_r, self._nudge_w = socket.socketpair()
        self._nudge_w.setblocking(False)
        self.backend_pid: int | None = None  # the connection's server process, for tests

    # -- the waiters' side -----------------------------------------------------------
    def wait(self, run_id: str, timeout: float | None, poll: float) -> Run:
        """PgStore.wait: blocks this thread on an Event the Listener sets."""
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        news = threading.Event()
        with self._joined(run_id, poll, news.set) as waiter:
            while not isinstance(got := waiter.outcome(timeout, deadline), Run):
                news.wait(_bounded(got))
                news.clear()
            return got

    async def wait_async(self, run_id: str, timeout: float | None, poll: float) -> Run:
        """PgStore.wait_async: the task awaits an asyncio.Event, holding no thread."""
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        news, loop = asyncio.Event(), asyncio.get_running_loop()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the waiter's loop has closed
                loop.call_soon_threadsafe(news.set)

        with self._joined(run_id, poll, wake) as waiter:
            while not isinstance(got := waiter.outcome(timeout, deadline), Run):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_bounded(got)):
                        await news.wait()
                news.clear()
            return got

    @contextlib.contextmanager
    def _joined(self, run_id: str, poll: float, wake: Callable[[], None]) -> Any:
        from cairn.store.db import channel

        waiter = Waiter(run_id, channel(run_id), poll, wake)
        with self._lock:
            if self._closed:
                raise StoreError("the client is closed: open another to wait")
            self._waiters.setdefault(waiter.channel, set()).add(waiter)
            self._fresh.append(waiter)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="cairn-wait", daemon=True)
                self._thread.start()
        self._nudge()
        try:
            yield waiter
        finally:
            with self._lock:
                self._drop(waiter)  # its UNLISTEN goes with the thread's next round

    def looked(self) -> int:
        """How many waits in progress had their run read since they began: each of them is
        listened for (what a test waits for before it stops their runs)."""
        with self._lock:
            return sum(w.looked for ws in self._waiters.values() for w in ws)

    def close(self) -> None:
        """Stop the thread and close the connection; a wait still going raises StoreError."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._nudge()
        if thread is not None:
            thread.join(10)
        self._nudge_r.close()
        self._nudge_w.close()

    # -- the thread ------------------------------------------------------------------
    def _serve(self) -> None:
        try:
            self._listen()
        except Exception:  # a bug here: every wait hears of it rather than waiting on
            logger.exception("waits: the listening thread failed")
            self._fail(StoreError, "the client's listening thread failed; see its log")
        finally:
            with self._lock:
                self._thread = None  # the next wait starts another
            self._fail(StoreError, "the client was closed while waiting")

    def _listen(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        backoff, down_since = FIRST_BACKOFF, None
        try:
            while not self._closed:
                try:
                    if conn is None and not self._waiters:
                        self._pause(None)  # nobody waits: connect for the next one to come
                        continue
                    if conn is None:
                        conn = self._connect()
                        backoff, down_since = FIRST_BACKOFF, None
                    self._round(conn)
                except (psycopg.Error, OSError) as exc:
                    if conn is not None:
                        conn.close()
                        conn = None
                    down_since = down_since or time.monotonic()
                    logger.warning("waits: lost the listening connection (%s); again in %.2fs",
                                   str(exc).strip(), backoff)  # fmt: skip
                    if time.monotonic() - down_since >= self.give_up_after:
                        self._fail(StoreUnavailable, f"postgres unavailable: {exc}".strip())
                    self._pause(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF)
        finally:
            if conn is not None:
                conn.close()

    def _connect(self) -> psycopg.Connection[Any]:
        from cairn.store.db import opening

        conn = psycopg.connect(self.url, **self._options)
        opening(conn)  # it reads the runs it wakes for: their sealed state opened
        conn.add_notify_handler(lambda n: self._heard.add(n.channel))
        self.backend_pid = conn.info.backend_pid
        self._listening = set()
        with self._lock:
            # Whatever changed while nobody listened was not heard: read every run again.
            self._fresh = [w for ws in self._waiters.values() for w in ws]
        return conn

    def _round(self, conn: psycopg.Connection[Any]) -> None:
        """LISTEN and UNLISTEN to match the waiters, read the runs that need it (joined,
        heard, or due a look), else sleep until news, a nudge or the next look."""
        with self._lock:
            wanted = set(self._waiters)
            fresh, self._fresh = self._fresh, []
        add, drop = wanted - self._listening, self._listening - wanted
        if add or drop:
            conn.execute(_listens(add, drop))
            self._listening = wanted
        now = time.monotonic()
        heard, self._heard = self._heard, set()
        with self._lock:
            due = [
                w for ws in self._waiters.values() for w in ws if w.next_look - w.poll / 2 <= now
            ]
            heard_by = [w for c in heard for w in self._waiters.get(c, ())]
            look = {w for w in (*fresh, *due, *heard_by) if w in self._waiters.get(w.channel, ())}
            nexts = [w.next_look for ws in self._waiters.values() for w in ws if w.looked]
        if look:
            ids = sorted({w.run_id for w in look})
            rows = conn.execute(QUERIES["get_runs"], {"run_ids": ids}).fetchall()
            self._deliver(look, {r["run_id"]: Run.from_row(r) for r in rows}, now)
            return  # round again at once: the ended waits' UNLISTENs, news meanwhile
        self._sleep(conn, max(0.0, min(nexts) - now) if nexts else None)

    def _deliver(self, look: Iterable[Waiter], runs: dict[str, Run], now: float) -> None:
        woken = []
        with self._lock:
            for w in look:
                run = runs.get(w.run_id)
                w.run, w.looked, w.next_look = run, True, now + w.poll
                if run is None:
                    w.error = UnknownRun(f"no run {w.run_id!r}")
                elif run.status in SETTLED:
                    w.done = True
                else:
                    continue
                self._drop(w)
                woken.append(w)
        for w in woken:
            w.wake()

    def _sleep(self, conn: psycopg.Connection[Any], seconds: float | None) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(conn.fileno(), selectors.EVENT_READ)
            sel.register(self._nudge_r, selectors.EVENT_READ)
            ready = {key.fileobj for key, _ in sel.select(seconds)}
        if self._nudge_r in ready:
            with contextlib.suppress(BlockingIOError):
                self._nudge_r.recv(4096, socket.MSG_DONTWAIT)
        if conn.fileno() in ready:
            pg = conn.pgconn
            pg.consume_input()  # raises OperationalError once the link is gone
            if pg.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("the listening connection was closed")
            while (n := pg.notifies()) is not None:
                self._heard.add(n.relname.decode())

    def _pause(self, seconds: float | None) -> None:
        """Sleep until a nudge (None: a waiter joining, or close), or for seconds, which
        only close cuts short: a flood of waits during an outage keeps the backoff."""
        end = None if seconds is None else time.monotonic() + seconds
        with selectors.DefaultSelector() as sel:
            sel.register(self._nudge_r, selectors.EVENT_READ)
            while not self._closed:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return
                if sel.select(left):
                    with contextlib.suppress(BlockingIOError):
                        self._nudge_r.recv(4096, socket.MSG_DONTWAIT)
                    if end is None:
                        return

    def _fail(self, kind: type[CairnError], message: str) -> None:
        with self._lock:
            failed = [w for ws in self._waiters.values() for w in ws]
            for w in failed:
                w.error = kind(message)  # one each: a raised error keeps its waiter's traceback
                self._drop(w)
        for w in failed:
            w.wake()

    def _drop(self, waiter: Waiter) -> None:  # under the lock
        ws = self._waiters.get(waiter.channel)
        if ws is not None:
            ws.discard(waiter)
            if not ws:
                del self._waiters[waiter.channel]

    def _nudge(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full: a nudge is already due
            self._nudge_w.send(b"!")


def _bounded(seconds: float) -> float | None:
    """A wait of no limit (timeout None) as Event.wait and asyncio.timeout take it."""
    return None if seconds == float("inf") else seconds


def _listens(add: set[str], drop: set[str]) -> sql.Composed:
    """One round trip for every channel to start or stop hearing."""
    statements = [sql.SQL("LISTEN {}").format(sql.Identifier(c)) for c in sorted(add)]
    statements += [sql.SQL("UNLISTEN {}").format(sql.Identifier(c)) for c in sorted(drop)]
    return sql.SQL("; ").join(statements)
