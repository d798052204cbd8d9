"""Hearing steer messages sent with interrupt=True: one LISTEN connection a process (the
channel STEER_CHANNEL, whose payload is the run id), opened by the first call that may be
interrupted, fanning each notification out to that run's calls in flight (cairn.core.cuts).

A message stored while the connection was down interrupts nothing: it waits, as every
steer message does, for the step's next ctx.messages(). So does one behind PgBouncer in
transaction mode, which passes no notification (set CAIRN_LISTEN_URL straight to
Postgres)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import psycopg
from psycopg import sql

from cairn.core.cuts import Cut, Cuts

logger = logging.getLogger(__name__)

STEER_CHANNEL = "cairn_steer"  # queries.sql: steer_notify
READY_WAIT = 5.0  # how long the first call waits for the LISTEN before it runs uncut
FIRST_BACKOFF, MAX_BACKOFF = 0.05, 2.0


class SteerListener:
    """The process's LISTEN on STEER_CHANNEL, in a daemon thread of its own."""

    def __init__(self, url: str, *, prepare: bool = True) -> None:
        self.url = url
        self.prepare = prepare
        self.cuts = Cuts()
        self._ready = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def watch(self, run_id: str) -> Iterator[Cut | None]:
        """The run's Cut while its call runs; None if the LISTEN is not in place (the call
        then runs uncut rather than wait on a database that does not answer)."""
        self._start()
        if not self._ready.wait(READY_WAIT):
            yield None
            return
        with self.cuts.watch(run_id) as cut:
            yield cut

    def close(self) -> None:
        self._closed.set()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._ready.clear()  # a forked child's copy was its parent's
                self._thread = threading.Thread(
                    target=self._listen, name="cairn-steer-listener", daemon=True
                )
                self._thread.start()

    def _listen(self) -> None:
        backoff = FIRST_BACKOFF
        options: dict[str, object] = {"autocommit": True, "connect_timeout": 5}
        if not self.prepare:
            options["prepare_threshold"] = None
        while not self._closed.is_set():
            try:
                with psycopg.connect(self.url, **options) as conn:  # type: ignore[arg-type]
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(STEER_CHANNEL)))
                    self._ready.set()
                    backoff = FIRST_BACKOFF
                    while not self._closed.is_set():
                        for heard in conn.notifies(timeout=1.0):
                            self.cuts.fire(heard.payload)
            except psycopg.Error as exc:
                # Down: calls started meanwhile run uncut (ready is cleared), and what was
                # sent meanwhile waits for the next ctx.messages().
                self._ready.clear()
                logger.warning("steer listener: %s; listening again in %.2fs", exc, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
