"""The Celery app factory: at-least-once delivery, and cairn's run, reaper and sweep tasks."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from billiard.einfo import ExceptionWithTraceback
from billiard.exceptions import WorkerLostError
from celery import Celery, Task, signals
from celery.worker import state as worker_state
from celery.worker.request import Request

from cairn.core import logs, tracing
from cairn.core.errors import (
    CairnError,
    Deferred,
    HandOff,
    Interrupted,
    Misrouted,
    RetryLater,
    StepStopped,
)
from cairn.core.sealing import KeyMissing, ring
from cairn.core.settings import Settings
from cairn.steps import registry
from cairn.steps.model import ModelClient, preload_sdk
from cairn.store.checkpoints import PgStore
from cairn.store.contract import LeaseManager, Maintenance
from cairn.store.db import Database
from cairn.store.events import RedisEvents
from cairn.store.fleet import Fleet
from cairn.store.lease import Leases
from cairn.store.schedules import ScheduleStore
from cairn.workers import broker, celerylog, control, fleet, loop, metrics, schedules
from cairn.workers.dispatch import Dispatcher
from cairn.workers.metrics import Metrics
from cairn.workers.middleware import NONE, Chain, Middleware
from cairn.workers.middleware import load as load_middleware
from cairn.workers.outbox import Outbox
from cairn.workers.reaper import Reaper
from cairn.workers.tracing import Tracing
from cairn.workers.wake import WAKE_TASK, Waker

logger = logging.getLogger(__name__)

# Counts a message's resends after lost pool processes (RunRequest).
LOST_HEADER = "cairn_lost"
SWEEP_EVERY = 3600.0  # seconds between retention sweeps


class Runtime:
    """Settings, the loop's middleware, and each process's own connections (made after
    the prefork pool forks, never shared between processes)."""

    def __init__(self, settings: Settings, middleware: Chain = NONE) -> None:
        self.settings, self.middleware = settings, middleware
        self._deps: dict[int, loop.Deps] = {}
        self._leases: dict[int, Leases] = {}
        self._fleets: dict[int, Fleet] = {}
        self._stores: dict[int, PgStore] = {}
        self._lock = threading.Lock()
        # Made before the pool forks, so every pool process sees the main process set it
        # when a warm shutdown (SIGTERM) begins.
        self.stopping = multiprocessing.Event()
        # The Celery app whose run task `send` puts messages for; set by create_app.
        self.app: Celery | None = None

    def send(
        self,
        run_id: str,
        resume: bool = True,
        priority: int = 0,
        *,
        countdown: float | None = None,
        headers: dict[str, Any] | None = None,
    ) -> None:
        """Put one message for the run on the broker: every send of the fleet comes here
        (a spawn's children, a gathered parent, a key's next run, a retry, a hand-off, a
        wake, the reaper's), so a pinned run's goes to its version's queue wherever it
        was sent from."""
        assert self.app is not None, "create_app sets the app"
        self.app.tasks[broker.RUN_TASK].apply_async(
            (run_id,), queue=self.queue(run_id, resume, priority), countdown=countdown,
            headers=headers,
        )  # fmt: skip

    def queue(self, run_id: str, resume: bool, priority: int = 0) -> Any:
        """Where the run's message goes: a new run's to the queue of its priority (a
        first delivery has no version yet: any worker starts it); a resume to the shared
        resume queue, or to its version's for a pinned run (one indexed read, per send,
        never per step)."""
        if not resume:
            return broker.queue_for(priority)
        version = self._routes().routes([run_id]).get(run_id)
        if version is None:
            return broker.RESUME
        return broker.declared(self.settings, broker.pinned_queue(version))

    def _routes(self) -> Maintenance:
        """Where routes are read: the process's store, or in the worker's main process
        (a resend after a lost pool process) a one-connection store of its own, as its
        leases are (leases()): the loop's Deps are the pool processes'."""
        if pid_deps := self._deps.get(os.getpid()):
            return pid_deps.store
        with self._lock:
            if os.getpid() not in self._stores:
                s = self.settings
                db = Database(s.database_url, max_size=1, prepare=s.database_prepare)
                self._stores[os.getpid()] = PgStore(db)
            return self._stores[os.getpid()]

    def deps(self) -> loop.Deps:
        # One Deps per process, shared by its threads (the threads pool): the connection
        # pool, the Redis client and the model client are all thread-safe.
        pid, s = os.getpid(), self.settings
        with self._lock:
            if pid not in self._deps:
                leases = Leases.from_url(s.redis)
                self._deps[pid] = loop.Deps(
                    settings=s,
                    store=PgStore(
                        Database(
                            s.database_url,
                            max_size=s.database_pool_size,
                            give_up_after=s.store_give_up_after,
                            prepare=s.database_prepare,
                            hold=s.lease_ttl,
                        )
                    ),
                    leases=leases,
                    model=ModelClient.from_settings(s, leases.client, observe=metrics.model_rate),
                    middleware=self.middleware,
                    stopping=self.stopping.is_set,
                    # Over the leases' Redis client: its pool, one more connection in use.
                    events=Outbox(RedisEvents(leases.client), s) if s.events_maxlen else None,
                    send=self.send,
                )
            return self._deps[pid]

    def fleet(self) -> Fleet:
        """The workers' beats (the reaper's orphan report reads them), per process."""
        with self._lock:
            if os.getpid() not in self._fleets:
                self._fleets[os.getpid()] = Fleet.from_url(self.settings.redis)
            return self._fleets[os.getpid()]

    def reaper(self) -> Reaper:
        """A Reaper over this process's store and leases, counting the broker's run
        messages and sending through this app."""
        d, app = self.deps(), self.app
        return Reaper(
            store=d.store,
            leases=d.leases,
            settings=self.settings,
            in_flight=lambda taken_within: broker.in_flight(app, taken_within=taken_within),
            send=self.send,
        )

    def leases(self) -> LeaseManager:
        """This process's Redis leases: the worker's main process needs only these."""
        if pid_deps := self._deps.get(os.getpid()):
            return pid_deps.leases
        with self._lock:
            if os.getpid() not in self._leases:
                self._leases[os.getpid()] = Leases.from_url(self.settings.redis)
            return self._leases[os.getpid()]

    def close(self) -> None:
        """Close this process's connections (a test's app; a worker's go with it)."""
        pid = os.getpid()
        if pid_deps := self._deps.pop(pid, None):
            pid_deps.store.db.close()  # type: ignore[attr-defined]
            pid_deps.leases.client.close()  # type: ignore[attr-defined]
            if pid_deps.model is not None:
                pid_deps.model.close()
        if store := self._stores.pop(pid, None):
            store.db.close()
        if beats := self._fleets.pop(pid, None):
            beats.close()

    def stop(self, **_: object) -> None:
        """A warm shutdown began (celery's worker_shutting_down, in the main process)."""
        self.stopping.set()


class RunRequest(Request):
    """On Redis, a run whose pool process died under it (SIGKILL, OOM) is sent again to
    the resume queue at once, and its message is acked.

    Celery's own answer, a rejected and requeued message, waits behind the whole backlog
    on Redis (kombu puts it back at the far end of its queue): under frequent kills that
    was most of the recovery time. The run is in Postgres and the dead owner's lease is
    broken on sight (Lease.dead_here), so the next free process goes on at once. Publish
    before ack: a crash between them sends the run twice, which the lease makes harmless.
    Bounded: after DELIVERY_LIMIT resends of one message Celery's requeue takes over.
    RabbitMQ requeues a rejected message at once, and counts its deliveries
    (DELIVERY_LIMIT), so there Celery's requeue stays.
    """

    def on_failure(self, exc_info, send_failed_event=True, return_ok=False):  # type: ignore[no-untyped-def]
        exc = exc_info.exception
        exc = exc.exc if isinstance(exc, ExceptionWithTraceback) else exc
        lost = int(self._request_dict.get(LOST_HEADER) or 0)
        if (
            isinstance(exc, WorkerLostError)
            and not worker_state.should_terminate
            and lost < broker.DELIVERY_LIMIT
            and not broker.is_amqp(self.task.app.cairn.settings.broker)
            and self._resend(lost + 1)
        ):
            worker_state.task_ready(self)
            self.acknowledge()
            return
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

    def _resend(self, lost: int) -> bool:
        (run_id,) = self.args
        runtime: Runtime = self.task.app.cairn
        try:
            runtime.leases().mark_sent(run_id, runtime.settings.resend_window)
            runtime.send(run_id, headers={LOST_HEADER: lost})
        except Exception:  # Redis or the broker down: Celery's requeue instead
            logger.exception(
                "run %s: not sent again after its process died",
                run_id,
                extra=logs.run(run_id, "resend_failed"),
            )
            return False
        logger.warning(
            "run %s: its pool process died; sent to %s again",
            run_id,
            broker.RESUME,
            extra=logs.run(run_id, "resend", lost=lost),
        )
        return True


def run_task(task: Task, run_id: str) -> str:
    """Resume or start one run: the whole recovery path is calling this again.

    Every way loop.run can end the delivery without ending the run (an Interrupted) is
    handled here by kind; a kind without a branch of its own is retried like Transient.
    """
    runtime: Runtime = task.app.cairn
    settings = runtime.settings

    def again(countdown: float) -> Exception:
        retry: Exception = task.retry(
            countdown=broker.delay(settings, countdown), queue=runtime.queue(run_id, True)
        )
        return retry

    try:
        return loop.run(run_id, runtime.deps())
    except Deferred as exc:
        logger.info(
            "run %s: %s; retrying in %ss",
            run_id,
            exc,
            settings.defer_seconds,
            extra=logs.run(run_id, "deferred"),
        )
        raise again(settings.defer_seconds) from None
    except RetryLater as exc:
        # The attempt is recorded in the checkpoint (and bounds the chain); the reaper
        # leaves the run alone until this retry is due.
        raise again(exc.delay) from None
    except HandOff as exc:
        logger.warning("%s; handing it back to the queue", exc, extra=logs.run(run_id, "hand_off"))
        runtime.send(run_id)
        return "handed_off"
    except Misrouted as exc:
        # Not claimed, not changed: only its message moves, to a worker of its version.
        logger.info(
            "%s; sent to %s",
            exc,
            broker.pinned_queue(exc.version),
            extra=logs.run(run_id, "misrouted", version=exc.version),
        )
        runtime.send(run_id)
        return "misrouted"
    except KeyMissing as exc:
        return _lacks_key(task, run_id, exc, again)
    except StepStopped as exc:  # Superseded, or a stop no branch of the loop took
        # Another worker owns the run now: it will finish it. Do nothing more.
        logger.warning("run %s: stopped, %s", run_id, exc, extra=logs.run(run_id, "superseded"))
        return "lost"
    except Interrupted as exc:  # Transient, and any kind without a branch of its own
        attempt = task.request.retries
        if attempt >= settings.transient_retries:
            logger.error(
                "run %s: giving up after %d retries: %s",
                run_id,
                attempt,
                exc,
                extra=logs.run(run_id, "give_up", retries=attempt),
            )
            raise
        countdown = min(2.0 * 2 ** min(attempt, 5), 60.0)
        logger.warning(
            "run %s: %s; retry %d in %.0fs",
            run_id,
            exc,
            attempt + 1,
            countdown,
            extra=logs.run(run_id, "transient", retries=attempt),
        )
        raise again(countdown) from None


def _lacks_key(
    task: Task, run_id: str, exc: KeyMissing, again: Callable[[float], Exception]
) -> str:
    """A payload of the run is sealed under a key this worker lacks (a key deploy under
    way, or a worker left out of one): the run goes back to the queue for a worker that
    has the key, never failed; said in one line, and kept for `cairn worker --check`.
    Backoff as for an outage; past CAIRN_TRANSIENT_RETRIES this message is let go, and
    the reaper sends the run again later."""
    runtime: Runtime = task.app.cairn
    settings = runtime.settings
    with contextlib.suppress(CairnError):  # Redis away: the hand-back matters more
        runtime.fleet().lacked(exc.key_id)
    attempt = task.request.retries
    held = ", ".join(ring().ids) or "none"
    if attempt >= settings.transient_retries:
        logger.error(
            "run %s: this worker lacks payload key %r (CAIRN_PAYLOAD_KEYS holds: %s); let "
            "go after %d hand-backs, the reaper sends it again",
            run_id, exc.key_id, held, attempt,
            extra=logs.run(run_id, "lacks_key", key_id=exc.key_id, retries=attempt),
        )  # fmt: skip
        return "lacks_key"
    countdown = min(settings.defer_seconds * 2 ** min(attempt, 5), loop.KEY_HOLD)
    logger.warning(
        "run %s: this worker lacks payload key %r (CAIRN_PAYLOAD_KEYS holds: %s); handed "
        "back for a worker that has it, again in %.0fs",
        run_id, exc.key_id, held, countdown,
        extra=logs.run(run_id, "lacks_key", key_id=exc.key_id, retries=attempt),
    )  # fmt: skip
    raise again(countdown) from None


def reap(runtime: Runtime, reaper: Reaper | None = None) -> int:
    """Send again runs whose worker or message was lost (see cairn.workers.reaper)."""
    d = runtime.deps()
    with tracing.spanning("cairn.reap"):
        sent = (reaper or runtime.reaper()).reap()
        tracing.note(runs_sent=sent)
        try:
            fleet.report_orphans(d.store, runtime.fleet(), runtime.settings.pin_orphan_after)
        except CairnError as exc:  # its runs were sent: the report waits for the next pass
            logger.warning("orphan report skipped: %s", exc, extra=logs.run(None, "orphaned"))
    return sent


def sweep(runtime: Runtime) -> int:
    """Delete terminal runs older than CAIRN_RETENTION_SECONDS, 1,000 per transaction."""
    with tracing.spanning("cairn.sweep"):
        deleted = runtime.deps().store.sweep(
            runtime.settings.retention,
            progress=lambda n: logger.info(
                "sweep: %d runs deleted", n, extra=logs.run(None, "sweep", deleted=n)
            ),
        )
        tracing.note(runs_deleted=deleted)
    return deleted


def fire_schedules(runtime: Runtime) -> int:
    """Fire the due schedules, each tick once (see cairn.workers.schedules)."""
    firer = schedules.Firer(
        store=ScheduleStore(runtime.deps().store.db),  # type: ignore[attr-defined]
        send=lambda run_id: runtime.send(run_id, resume=False),
        grace=max(schedules.GRACE, 3 * runtime.settings.schedule_tick),
    )
    with tracing.spanning("cairn.schedules.fire"):
        fired = firer.fire()
        tracing.note(runs_started=len(fired))
    return len(fired)


def wake(runtime: Runtime) -> int:
    """Send the waiting runs whose time came, each once (see cairn.workers.wake)."""
    waker = Waker(store=runtime.deps().store, send=runtime.send)
    with tracing.spanning("cairn.wake"):
        woken = waker.wake()
        tracing.note(runs_woken=len(woken))
    return len(woken)


def control_passes(runtime: Runtime) -> list[control.Periodic]:
    """What beat runs on its own threads (cairn.workers.control): the reaper (one Reaper,
    so each pass goes on where the last stopped), the wake pass, the schedules' firer,
    the sweep."""
    s, reaper = runtime.settings, runtime.reaper()
    return [
        control.Periodic("reaper", s.reaper_interval, lambda: reap(runtime, reaper)),
        control.Periodic("wake", s.schedule_tick, lambda: wake(runtime)),
        control.Periodic("schedules", s.schedule_tick, lambda: fire_schedules(runtime)),
        control.Periodic("sweep", SWEEP_EVERY, lambda: sweep(runtime)),
    ]


# The control passes as Celery tasks: a message an older beat put on the control queue
# is still served. This version's beat runs them itself and sends none.
def _reap_task(task: Task) -> int:
    return reap(task.app.cairn)


def _sweep_task(task: Task) -> int:
    return sweep(task.app.cairn)


def _fire_task(task: Task) -> int:
    return fire_schedules(task.app.cairn)


def _wake_task(task: Task) -> int:
    return wake(task.app.cairn)


def create_app(settings: Settings, middleware: Iterable[Middleware] = ()) -> Celery:
    """The worker's Celery app. Imports settings.workflows, so their steps are registered
    in every pool process. The loop's middleware: the metrics, then settings.middleware
    (CAIRN_MIDDLEWARE), then `middleware`."""
    registry.import_modules(settings.workflows)
    # Stated once the workflows are in: the default is a hash of them.
    settings = settings.with_options(code_version=registry.code_version(settings.code_version))
    app = Celery("cairn")
    app.conf.update(
        broker.conf(settings),
        # Its version's queue too, where the resumes of runs pinned to it go.
        task_queues=[
            *broker.queues(settings),
            broker.declared(settings, broker.pinned_queue(settings.code_version or "")),
        ],
        # A message is acked only when the task returns, and a task whose worker process
        # died is requeued: a crash loses nothing. Redelivery is why the task is a resume.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # Hold one message per process: a dying worker strands as little as possible.
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        # Nothing on beat's schedule: beat runs the reaper, the wake pass, the firer and
        # the sweep on threads of its own (cairn.workers.control), never on a worker.
        beat_schedule={},
    )
    # Tracing first: the other middleware's work falls inside the run's and step's spans.
    traced = [Tracing()] if tracing.setup(settings, "cairn-worker") else []
    metered = Metrics(settings.code_version)
    chain = Chain([*traced, metered, *load_middleware(settings.middleware), *middleware])
    ModelClient.check_settings(settings)
    # Loaded once here, before the pool forks: each pool process (and each replacement
    # of a killed one) would otherwise pay about a second of CPU for it. After the
    # middleware, so a misspelt CAIRN_MIDDLEWARE is told without that second.
    preload_sdk()
    runtime = Runtime(settings, chain)
    runtime.app = app
    app.cairn = runtime
    # A warm shutdown (SIGTERM) hands each run in hand back at its next step boundary,
    # so a deploy waits one step, not a run. Runs in the worker's main process.
    signals.worker_shutting_down.connect(runtime.stop, weak=False)
    # Its code version's beat, for `cairn deploy status` and the orphan report.
    signals.worker_ready.connect(_start_beats, weak=False, dispatch_uid="cairn-beats")
    # Celery's routine lines at DEBUG; CAIRN_LOG_FORMAT=json for the whole process.
    celerylog.setup(settings)
    app.task(name=broker.RUN_TASK, bind=True, max_retries=None, Request=RunRequest)(run_task)
    app.task(name=broker.REAP_TASK, bind=True)(_reap_task)
    app.task(name=broker.SWEEP_TASK, bind=True)(_sweep_task)
    app.task(name=schedules.FIRE_TASK, bind=True)(_fire_task)
    app.task(name=WAKE_TASK, bind=True)(_wake_task)
    # Beat (alone, or embedded in a worker) sends the runs enqueued in callers'
    # transactions as their commits land (cairn.workers.dispatch), and runs the control
    # passes (cairn.workers.control).
    signals.beat_init.connect(_start_dispatcher, weak=False, dispatch_uid="cairn-dispatch")
    signals.beat_init.connect(_start_control, weak=False, dispatch_uid="cairn-control")
    return app


def _start_beats(sender: Any = None, **_: object) -> None:
    runtime: Runtime = sender.app.cairn
    beats = fleet.start_beats(runtime.settings, sender.hostname)
    signals.worker_shutdown.connect(lambda **_: beats.set(), weak=False)


def _start_control(sender: Any = None, **_: object) -> None:
    control.start(control_passes(sender.app.cairn))


def _start_dispatcher(sender: Any = None, **_: object) -> None:
    runtime: Runtime = sender.app.cairn
    store, send, s = runtime.deps().store, runtime.send, runtime.settings
    if isinstance(store, PgStore):
        # LISTEN holds a session: through PgBouncer in transaction mode it hears nothing,
        # so it may go straight to Postgres (CAIRN_LISTEN_URL); one connection, no pool.
        listen = Database(s.listen_url, max_size=1) if s.listen_url else store.db
        Dispatcher(
            store=store, send=lambda run_id, prio: send(run_id, False, prio), listen=listen
        ).start()


@signals.worker_process_shutdown.connect
def _process_exited(pid: int | None = None, **_: object) -> None:
    metrics.process_exited(pid or os.getpid())
