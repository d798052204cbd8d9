"""How a Client sends a run's message: Celery's producer on the broker (made on first use,
one per process), or nothing at all for a store with no broker behind it."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, NoReturn

from cairn.core.errors import CairnError, StoreUnavailable
from cairn.core.settings import Settings
from cairn.workers import broker

if TYPE_CHECKING:
    from celery import Celery


def no_broker(run_id: str, priority: int = 0) -> NoReturn:
    raise CairnError(
        f"run {run_id} is recorded but this Client has no broker to send it to: its store "
        "is not a PgStore; pass send= (in a test, cairn.testing.LocalWorker's send)"
    )


class Sender:
    """The broker's producer, made on the first send (Celery imports then)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._producer: Celery | None = None
        # AsyncClient sends from several threads at once: celery's lazy module does not
        # survive being imported by two of them together ("cannot import name 'Celery'").
        self._lock = threading.Lock()

    @property
    def producer(self) -> Celery:
        """Celery's app, made on first use (the Client never hands it out)."""
        with self._lock:
            if self._producer is None:
                from celery import Celery

                app = Celery("cairn-client")
                app.conf.update(broker.conf(self.settings))
                self._producer = app
            return self._producer

    def send(self, run_id: str, priority: int = 0) -> None:
        try:
            self.producer.send_task(
                broker.RUN_TASK, args=[run_id], queue=broker.queue_for(priority)
            )
        except Exception as exc:
            from kombu.exceptions import OperationalError

            if not isinstance(exc, OperationalError):
                raise
            raise StoreUnavailable(
                f"run {run_id} is recorded but the broker is unreachable ({exc}); enqueue "
                "the same run id again once it is back, or the reaper will after "
                "CAIRN_LOST_AFTER"
            ) from exc

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
