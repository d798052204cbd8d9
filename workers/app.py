"""The Celery app factory: at-least-once delivery, and cairn's run, reaper and sweep tasks."""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading

from celery import Celery, signals

from cairn.errors import Superseded, Transient
from cairn.steps import registry
from cairn.steps.model import ModelClient, preload_sdk
from cairn.store.checkpoints import PgStore
from cairn.store.db import Database
from cairn.store.lease import Leases
from cairn.workers import broker, loop, metrics
from cairn.workers.hooks import NO_HOOKS, StepHooks
from cairn.workers.settings import Settings

logger = logging.getLogger(__name__)


class Runtime:
    """Settings, hooks, and each process's own connections (made after the prefork pool
    forks, never shared between processes)."""

    def __init__(self, settings: Settings, hooks: StepHooks = NO_HOOKS) -> None:
        self.settings, self.hooks = settings, hooks
        self._deps: dict[int, loop.Deps] = {}
        self._lock = threading.Lock()
        # Made before the pool forks, so every pool process sees the main process set it
        # when a warm shutdown (SIGTERM) begins.
        self.stopping = multiprocessing.Event()

    def deps(self) -> loop.Deps:
        # One Deps per process, shared by its threads (the threads pool): the connection
        # pool, the Redis client and the model client are all thread-safe.
        pid, s = os.getpid(), self.settings
        with self._lock:
            if pid not in self._deps:
                self._deps[pid] = loop.Deps(
                    settings=s,
                    store=PgStore(
                        Database(
                            s.database_url,
                            max_size=s.database_pool_size,
                            give_up_after=s.store_give_up_after,
                            prepare=s.database_prepare,
                        )
                    ),
                    leases=Leases.from_url(s.redis_url),
                    model=ModelClient(base_url=s.anthropic_base_url, default_model=s.model),
                    hooks=self.hooks,
                    stopping=self.stopping.is_set,
                )
            return self._deps[pid]


def create_app(settings: Settings, hooks: StepHooks = NO_HOOKS) -> Celery:
    """The worker's Celery app. Imports the shipped workflows and settings.workflows, so
    their steps are registered in every pool process."""
    registry.import_modules(("cairn.steps.invoice", *settings.workflows))
    # Loaded once here, before the pool forks: each pool process (and each replacement
    # of a killed one) would otherwise pay about a second of CPU for it.
    preload_sdk()
    app = Celery("cairn")
    app.conf.update(
        broker.conf(settings),
        # A message is acked only when the task returns, and a task whose worker process
        # died is requeued: a crash loses nothing. Redelivery is why the task is a resume.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # Hold one message per process: a dying worker strands as little as possible.
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        beat_schedule={
            "cairn-reaper": {"task": broker.REAP_TASK, "schedule": settings.reaper_interval},
            "cairn-sweep": {"task": broker.SWEEP_TASK, "schedule": 3600.0},
        },
    )
    runtime = Runtime(settings, hooks)
    app.cairn = runtime  # type: ignore[attr-defined]

    @signals.worker_shutting_down.connect(weak=False)
    def _shutting_down(**_: object) -> None:
        # Runs in the worker's main process: each run in hand stops at its next step
        # boundary and is handed back to the queue, so a deploy waits one step, not a run.
        runtime.stopping.set()

    @app.task(name=broker.RUN_TASK, bind=True, max_retries=None)
    def run_task(self, run_id: str) -> str:  # type: ignore[no-untyped-def]
        """Resume or start one run: the whole recovery path is calling this again."""
        outcome = "error"
        try:
            outcome = loop.run(run_id, runtime.deps())
            return outcome
        except loop.Deferred as exc:
            outcome = "deferred"
            logger.info("run %s: %s; retrying in %ss", run_id, exc, settings.defer_seconds)
            raise self.retry(
                countdown=broker.delay(settings, settings.defer_seconds), queue=broker.RESUME
            ) from None
        except loop.RetryLater as exc:
            # The attempt is recorded in the checkpoint (and bounds the chain); the reaper
            # leaves the run alone until this retry is due.
            outcome = "retry"
            raise self.retry(
                countdown=broker.delay(settings, exc.delay), queue=broker.RESUME
            ) from None
        except loop.HandOff as exc:
            outcome = "handed_off"
            logger.warning("%s; handing it back to the queue", exc)
            run_task.apply_async((run_id,), queue=broker.RESUME)
            return outcome
        except Superseded as exc:
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
            raise self.retry(
                countdown=broker.delay(settings, countdown), queue=broker.RESUME
            ) from None
        finally:
            metrics.run_ended(outcome)

    @app.task(name=broker.REAP_TASK)
    def reap() -> int:
        """Re-enqueue runs that are running with no live lease (their worker died).

        Without this a run on a worker lost whole waits for the broker's visibility
        timeout and kombu's restore sweep: an hour by default.
        """
        d = runtime.deps()
        stalled = [
            r["run_id"] for r in d.store.stalled(settings.pending_after, settings.lease_ttl / 2)
        ]
        unclaimed = d.store.unclaimed(settings.lost_after)
        if unclaimed:
            # More runs waiting for a message than messages the broker holds: the oldest
            # of them lost theirs. A long backlog holds a message for each: no storm.
            lost = len(unclaimed) - broker.in_flight(app)
            stalled += unclaimed[: max(lost, 0)]
        n = 0
        for run_id in d.leases.unheld(stalled):
            if d.leases.mark_reaped(run_id, settings.lease_ttl):
                run_task.apply_async((run_id,), queue=broker.RESUME)
                n += 1
        if n:
            logger.warning("reaper re-enqueued %d run(s)", n)
        return n

    @app.task(name=broker.SWEEP_TASK)
    def sweep() -> int:
        """Delete terminal runs older than CAIRN_RETENTION_SECONDS, 1,000 per transaction."""
        return runtime.deps().store.sweep(
            settings.retention, progress=lambda n: logger.info("sweep: %d runs deleted", n)
        )

    return app


@signals.worker_process_shutdown.connect
def _process_exited(pid: int | None = None, **_: object) -> None:
    metrics.process_exited(pid or os.getpid())
