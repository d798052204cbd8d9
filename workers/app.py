"""The Celery app, configured for at-least-once delivery, and cairn's tasks."""

from __future__ import annotations

import logging
import os
import threading

from celery import Celery, signals
from kombu import Queue

from steps import registry
from steps.model import ModelClient
from store import Database, LeaseLost, Leases, PgStore, StaleWrite, Transient
from workers import loop, metrics
from workers.settings import Settings

logger = logging.getLogger(__name__)

settings = Settings.from_env()
# Workers, beat and enqueuers all need the registry: import the shipped workflows and
# the user's (CAIRN_WORKFLOWS) once, here, at the edge.
registry.import_modules(("steps.invoice", *settings.workflows))

app = Celery("cairn", broker=settings.broker)
app.conf.update(
    # A message is acked only when the task returns, and a task whose worker process
    # died is requeued: a crash loses nothing. Redelivery is why the task is a resume.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    # Hold one message per process: a dying worker strands as little as possible.
    worker_prefetch_multiplier=1,
    # See Settings.visibility_timeout: long on purpose; recovery is the reaper's job.
    broker_transport_options={
        "visibility_timeout": settings.visibility_timeout,
        **settings.broker_transport_options,
    },
    task_ignore_result=True,
    task_serializer="json",
    accept_content=["json"],
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    # Workers consume three queues, round-robin: new runs, resumed runs and the reaper's
    # ticks. A resumed run or a reaper tick then never waits behind the whole backlog.
    task_queues=[Queue("celery"), Queue("cairn.resume"), Queue("cairn.control")],
    task_routes={
        "cairn.reap": {"queue": "cairn.control"},
        "cairn.sweep": {"queue": "cairn.control"},
    },
    beat_schedule={
        "cairn-reaper": {"task": "cairn.reap", "schedule": settings.reaper_interval},
        "cairn-sweep": {"task": "cairn.sweep", "schedule": 3600.0},
    },
)

RESUME = "cairn.resume"
_deps: dict[int, loop.Deps] = {}
_deps_lock = threading.Lock()


def deps() -> loop.Deps:
    """Per-process connections, made after the prefork pool forks (never shared)."""
    pid = os.getpid()
    with _deps_lock:
        if pid not in _deps:
            db = Database(settings.database_url, give_up_after=settings.store_give_up_after)
            _deps[pid] = loop.Deps(
                settings=settings,
                store=PgStore(db),
                leases=Leases.from_url(settings.redis_url),
                model=ModelClient(
                    base_url=settings.anthropic_base_url, default_model=settings.model
                ),
            )
        return _deps[pid]


@signals.worker_process_shutdown.connect
def _process_exited(pid: int | None = None, **_: object) -> None:
    metrics.process_exited(pid or os.getpid())


@app.task(name="cairn.run", bind=True, max_retries=None)
def run_task(self, run_id: str) -> str:  # type: ignore[no-untyped-def]
    """Resume or start one run: the whole recovery path is calling this again."""
    outcome = "error"
    try:
        outcome = loop.run(run_id, deps())
        return outcome
    except loop.Deferred as exc:
        outcome = "deferred"
        logger.info("run %s: %s; retrying in %ss", run_id, exc, settings.defer_seconds)
        raise self.retry(countdown=settings.defer_seconds, queue=RESUME) from None
    except (LeaseLost, StaleWrite) as exc:
        # Another worker owns the run now: it will finish it. Do nothing more.
        logger.warning("run %s: stopped, %s", run_id, exc)
        outcome = "lost"
        return outcome
    except Transient as exc:
        outcome = "retry"
        attempt = self.request.retries
        if attempt >= settings.transient_retries:
            logger.error("run %s: giving up after %d retries: %s", run_id, attempt, exc)
            raise
        countdown = min(2.0 * 2 ** min(attempt, 5), 60.0)
        logger.warning("run %s: %s; retry %d in %.0fs", run_id, exc, attempt + 1, countdown)
        raise self.retry(countdown=countdown, queue=RESUME) from None
    finally:
        metrics.RUNS.labels(outcome).inc()


@app.task(name="cairn.reap")
def reap() -> int:
    """Re-enqueue runs that are running with no live lease (their worker died).

    Without this a run on a worker lost whole waits for the broker's visibility timeout
    and kombu's restore sweep: an hour by default.
    """
    d = deps()
    stalled = [r["run_id"] for r in d.store.stalled(settings.pending_after, settings.lease_ttl / 2)]
    n = 0
    for run_id in d.leases.unheld(stalled):
        if d.leases.mark_reaped(run_id, settings.lease_ttl):
            run_task.apply_async((run_id,), queue=RESUME)
            n += 1
    if n:
        logger.warning("reaper re-enqueued %d run(s)", n)
    return n


@app.task(name="cairn.sweep")
def sweep() -> int:
    """Delete terminal runs older than CAIRN_RETENTION_SECONDS."""
    return deps().store.sweep(settings.retention)
