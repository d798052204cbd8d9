"""The Celery app factory: at-least-once delivery, and cairn's run, reaper and sweep tasks."""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading

from billiard.einfo import ExceptionWithTraceback
from billiard.exceptions import WorkerLostError
from celery import Celery, signals
from celery.worker import state as worker_state
from celery.worker.request import Request

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

# Counts a message's resends after lost pool processes (RunRequest).
LOST_HEADER = "cairn_lost"


class Runtime:
    """Settings, hooks, and each process's own connections (made after the prefork pool
    forks, never shared between processes)."""

    def __init__(self, settings: Settings, hooks: StepHooks = NO_HOOKS) -> None:
        self.settings, self.hooks = settings, hooks
        self._deps: dict[int, loop.Deps] = {}
        self._leases: dict[int, Leases] = {}
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

    def leases(self) -> Leases:
        """This process's Redis leases: the worker's main process needs only these."""
        if pid_deps := self._deps.get(os.getpid()):
            return pid_deps.leases
        with self._lock:
            if os.getpid() not in self._leases:
                self._leases[os.getpid()] = Leases.from_url(self.settings.redis_url)
            return self._leases[os.getpid()]


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
    # How long a sent resume message may wait untaken before the reaper sends another.
    resend_window = max(settings.lease_ttl, settings.lost_after)
    amqp = broker.is_amqp(settings.broker)

    class RunRequest(Request):
        """On Redis, a run whose pool process died under it (SIGKILL, OOM) is sent again
        to the resume queue at once, and its message is acked.

        Celery's own answer, a rejected and requeued message, waits behind the whole
        backlog on Redis (kombu puts it back at the far end of its queue): under frequent
        kills that was most of the recovery time. The run is in Postgres and the dead
        owner's lease is broken on sight (Lease.dead_here), so the next free process goes
        on at once. Publish before ack: a crash between them sends the run twice, which
        the lease makes harmless. Bounded: after DELIVERY_LIMIT resends of one message
        Celery's requeue takes over. RabbitMQ requeues a rejected message at once, and
        counts its deliveries (DELIVERY_LIMIT), so there Celery's requeue stays.
        """

        def on_failure(self, exc_info, send_failed_event=True, return_ok=False):  # type: ignore[no-untyped-def]
            exc = exc_info.exception
            exc = exc.exc if isinstance(exc, ExceptionWithTraceback) else exc
            lost = int(self._request_dict.get(LOST_HEADER) or 0)
            if (
                isinstance(exc, WorkerLostError)
                and not worker_state.should_terminate
                and lost < broker.DELIVERY_LIMIT
                and not amqp
                and self._resend(lost + 1)
            ):
                worker_state.task_ready(self)
                self.acknowledge()
                return
            super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

        def _resend(self, lost: int) -> bool:
            (run_id,) = self.args
            try:
                runtime.leases().mark_sent(run_id, resend_window)
                self.task.apply_async((run_id,), queue=broker.RESUME, headers={LOST_HEADER: lost})
            except Exception:  # Redis or the broker down: Celery's requeue instead
                logger.exception("run %s: not sent again after its process died", run_id)
                return False
            logger.warning("run %s: its pool process died; sent to %s again", run_id, broker.RESUME)
            return True

    @signals.worker_shutting_down.connect(weak=False)
    def _shutting_down(**_: object) -> None:
        # Runs in the worker's main process: each run in hand stops at its next step
        # boundary and is handed back to the queue, so a deploy waits one step, not a run.
        runtime.stopping.set()

    @app.task(name=broker.RUN_TASK, bind=True, max_retries=None, Request=RunRequest)
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
        listed = {
            r["run_id"]: r for r in d.store.stalled(settings.pending_after, settings.lease_ttl / 2)
        }
        # How long each message sent may wait untaken before another is sent: a run
        # never taken waited out CAIRN_PENDING_AFTER already, and waits that again.
        window = {
            run_id: settings.pending_after
            if r["status"] == "pending" and not r["epoch"]
            else resend_window
            for run_id, r in listed.items()
        }
        if d.store.unclaimed(settings.lost_after, limit=1):
            # More runs waiting for a message than messages the broker holds: the oldest
            # of them lost theirs. A long backlog holds a message for each: no storm.
            # The broker read before and after the runs, the larger count kept: a run
            # taken, claimed and acked meanwhile is counted once and listed never, and a
            # message on its way from the queue to a worker's unacked set is counted on
            # one of the two reads. Either way no run is counted as lost by mistake.
            # A worker alive claims what it took at once; one that took a message over a
            # lease TTL (and CAIRN_LOST_AFTER) ago and never claimed its run died whole.
            taken_within = max(settings.lost_after, settings.lease_ttl)
            before = broker.in_flight(app, taken_within=taken_within)
            unclaimed = d.store.unclaimed(settings.lost_after)
            held = max(before, broker.in_flight(app, taken_within=taken_within))
            for r in unclaimed[: max(len(unclaimed) - held, 0)]:
                listed[r["run_id"]], window[r["run_id"]] = r, resend_window
        unheld = d.leases.unheld(list(window))
        # Listed, then no lease: either its worker died, or a worker took the run, ran it
        # and let go of it in between. The second look tells them apart.
        still = d.store.unchanged([listed[r] for r in unheld])
        sent = [r for r in unheld if r in still and d.leases.mark_sent(r, window[r])]
        for run_id in sent:
            run_task.apply_async((run_id,), queue=broker.RESUME)
        if sent:
            more = f" and {len(sent) - 10} more" if len(sent) > 10 else ""
            logger.warning(
                "reaper re-enqueued %d run(s): %s%s", len(sent), ", ".join(sent[:10]), more
            )
        # Each pass folds the status deltas written since the last, so counting runs
        # sums a few hundred rows, never the whole history.
        d.store.fold_counts()
        return len(sent)

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
