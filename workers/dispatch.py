"""The dispatcher: beat's thread that sends the runs enqueued in a caller's transaction
(Client.enqueue(connection=...)) as soon as that transaction commits.

The enqueue wrote the run pending and a NOTIFY in the caller's transaction; Postgres
delivers it at the commit and drops it at a rollback, so a run is sent only once it exists.
The web process sends nothing, so its death between its commit and any send loses nothing.
What the dispatcher does not hear (it was down, or PgBouncer in transaction mode stood
between it and Postgres: LISTEN needs a session of its own, so set CAIRN_LISTEN_URL
straight to Postgres there) stays a pending run that was never claimed, and the reaper
sends it once it is CAIRN_LOST_AFTER old (the broker holds no message for it).

Two beats' dispatchers both send a plain run: a second message is harmless (the run's
lease lets one delivery run it). A run with a concurrency key is sent through `admitted`,
which hands each admitted run to one caller.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable

from cairn.core import logs
from cairn.core.errors import CairnError
from cairn.core.status import RunStatus
from cairn.store.checkpoints import PgStore
from cairn.store.db import Database
from cairn.store.transactional import enqueued

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Dispatcher:
    """Hears committed enqueues and sends each run through send(run_id, priority)."""

    store: PgStore
    send: Callable[[str, int], None]
    listen: Database | None = None  # where to LISTEN (default: the store's database)
    tick: float = 1.0  # how often a quiet listener looks at `stop`
    # Set once it listens: what commits after is heard (a test waits for it).
    listening: threading.Event = dataclasses.field(default_factory=threading.Event)

    def dispatch(self, run_id: str) -> list[str]:
        """Send the run if it waits for a message (or its key's runs it let in); the ids
        sent."""
        run = self.store.get(run_id)
        if run is None:  # swept since: nothing to start
            return []
        if run.concurrency_key is not None:
            sent = self.store.admitted(run.workflow, run.concurrency_key)
        elif run.status == RunStatus.PENDING:
            sent = [(run_id, run.priority)]
        else:  # an enqueue again of a run under way or stopped: its delivery has it
            sent = []
        for admitted, priority in sent:
            self.send(admitted, priority)
        return [admitted for admitted, _ in sent]

    def serve(self, stop: threading.Event) -> None:
        """Listen and send until stop is set; a lost connection is opened again (what was
        said meanwhile is the reaper's)."""
        while not stop.is_set():
            try:
                with enqueued(self.listen or self.store.db) as heard:
                    self.listening.set()
                    logger.info(
                        "dispatcher: listening for runs enqueued in callers' transactions",
                        extra=logs.run(None, "dispatch"),
                    )
                    while not stop.is_set():
                        run_id = heard(self.tick)
                        if run_id is not None:
                            self._dispatch(run_id)
            except CairnError as exc:
                logger.warning(
                    "dispatcher: %s; listening again in 1s (the reaper sends what it missed)",
                    exc,
                    extra=logs.run(None, "dispatch"),
                )
                stop.wait(1.0)

    def _dispatch(self, run_id: str) -> None:
        try:
            self.dispatch(run_id)
        except Exception:  # a broker or store outage must not end the thread: the run
            # stays pending and unclaimed, which the reaper sends after CAIRN_LOST_AFTER
            logger.exception(
                "dispatcher: run %s not sent; the reaper will send it",
                run_id,
                extra=logs.run(run_id, "dispatch"),
            )

    def start(self) -> threading.Event:
        """serve() on a daemon thread (it dies with beat); set the event returned to stop."""
        stop = threading.Event()
        threading.Thread(
            target=self.serve, args=(stop,), name="cairn-dispatch", daemon=True
        ).start()
        return stop
