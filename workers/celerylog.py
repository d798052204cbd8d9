"""How Celery's worker and beat log for cairn.

Celery logs each task at INFO when received, retried and succeeded, and beat each task it
sends: for cairn that is lines every second (the schedules' pass), every reaper pass, and
two a delivery of a run, whether anything happened or not. Those lines are DEBUG here;
what cairn did is in its own lines (a run's start and stop, cairn.workers.runlog; runs a
reaper pass sent, runs a schedule fired, runs swept), at INFO only when there was
something to do.

CAIRN_LOG_FORMAT=json: every line the process writes, to stdout or stderr, is a JSON
object, so a log collector parses all of them. Celery's banners are left out by its
--quiet flag (`cairn worker` and `cairn beat` pass it); its log handlers get the JSON
formatter; a warning is logged, not printed; and what the worker prints on its own (its
shutdown line, from a signal handler) is written as JSON lines.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

from celery import signals
from celery.app.trace import LOG_RECEIVED, LOG_RETRY, LOG_SUCCESS
from celery.utils.log import get_multiprocessing_logger

from cairn.core import logs
from cairn.core.settings import Settings
from cairn.workers import broker, schedules
from cairn.workers.wake import WAKE_TASK

logger = logging.getLogger(__name__)

TASKS = frozenset(
    {broker.RUN_TASK, broker.REAP_TASK, broker.SWEEP_TASK, schedules.FIRE_TASK, WAKE_TASK}
)
# Celery's per-task lines: the worker's (received, retry, succeeded) and beat's (sent).
_TASK_LINES = (LOG_RECEIVED, LOG_RETRY, LOG_SUCCESS)
_BEAT_SENDS = "Scheduler: Sending due task"
_LOGGERS = ("celery.app.trace", "celery.worker.strategy", "celery.beat")


class Routine(logging.Filter):
    """Lowers Celery's INFO lines about cairn's tasks to DEBUG (dropped unless the logger
    logs DEBUG). A filter, as Celery logs them at INFO with no setting to change that."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or _task(record) not in TASKS:
            return True
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return True


def _task(record: logging.LogRecord) -> Any:
    """The task a record of Celery's is about, or None."""
    args = record.args
    if record.msg in _TASK_LINES and isinstance(args, Mapping):
        return args.get("name")  # trace and strategy log fmt % {"name": ..., "id": ...}
    if isinstance(record.msg, str) and record.msg.startswith(_BEAT_SENDS):
        return args[1] if isinstance(args, tuple) and len(args) > 1 else None  # (entry, task)
    return None


_ROUTINE = Routine()  # one instance: addFilter skips it when an app is made again


def setup(settings: Settings) -> None:
    """Called by create_app in every process that makes the app (worker, beat)."""
    for name in _LOGGERS:
        logging.getLogger(name).addFilter(_ROUTINE)

    def ready(**_: object) -> None:
        # What the tests and a deploy wait for: beat's first passes are DEBUG lines now.
        logger.info(
            "beat ticking: the reaper every %gs, due schedules every %gs, the sweep hourly",
            settings.reaper_interval,
            settings.schedule_tick,
            extra=logs.run(None, "beat_ready"),
        )

    signals.beat_init.connect(ready, weak=False, dispatch_uid="cairn.beat_ready")
    if settings.log_format == "json":
        _json()


def _json() -> None:
    root = logging.getLogger()
    if not any(isinstance(h.formatter, logs.JsonFormatter) for h in root.handlers):
        # Now, not when Celery sets its logging up: the worker warns (running as root,
        # say) before then, and with a handler here Celery adds no text one of its own.
        handler = logging.StreamHandler(sys.__stderr__)
        handler.setFormatter(logs.JsonFormatter())
        root.addHandler(handler)
    logging.captureWarnings(True)
    # Celery's own handlers (the task logger's, the pool's multiprocessing logger's).
    for setup in (signals.after_setup_logger, signals.after_setup_task_logger):
        setup.connect(_use_json, weak=False, dispatch_uid="cairn.logs.use_json")
    signals.celeryd_init.connect(_json_stdout, weak=False, dispatch_uid="cairn.json_stdout")


def _use_json(logger: logging.Logger, **_: object) -> None:
    logs.use_json(logger)
    mp = get_multiprocessing_logger()
    if mp is not None:  # billiard's: a pool process lost, in Celery's text format
        logs.use_json(mp)


def _json_stdout(**_: object) -> None:
    """The worker's main process prints to sys.__stdout__ on its own: its banner
    (without --quiet) and, from its signal handlers, straight to the descriptor, its
    shutdown lines. In their place, JSON lines."""
    out = sys.__stdout__
    if out is None or isinstance(out, logs.JsonLines):
        return
    lines = logs.JsonLines(out.fileno(), "celery.apps.worker")
    sys.__stdout__ = lines  # type: ignore[assignment,misc]  # not a TextIOWrapper

    def shutting_down(how: str = "Warm", **_: object) -> None:
        # In the signal handler too: JsonLines takes no lock.
        lines.write(f"worker: {how} shutdown (MainProcess)\n")

    signals.worker_shutting_down.connect(
        shutting_down, weak=False, dispatch_uid="cairn.json_shutdown"
    )
