"""What the enqueuers and the workers must agree on: task names, queues, broker options.

Light on purpose (no Celery import): the Client reads it to send a run by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cairn.workers.settings import Settings

RUN_TASK = "cairn.run"
REAP_TASK = "cairn.reap"
SWEEP_TASK = "cairn.sweep"
# Workers consume three queues, round-robin: new runs, resumed runs and the reaper's
# ticks. A resumed run or a reaper tick then never waits behind the whole backlog.
RUNS = "celery"
RESUME = "cairn.resume"
CONTROL = "cairn.control"


def conf(settings: Settings) -> dict[str, Any]:
    """Celery configuration shared by the worker app and the Client's producer."""
    from kombu import Queue

    return {
        "broker_url": settings.broker,
        # See Settings.visibility_timeout: long on purpose; recovery is the reaper's job.
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout,
            **settings.broker_transport_options,
        },
        "broker_connection_retry_on_startup": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_ignore_result": True,
        "task_queues": [Queue(RUNS), Queue(RESUME), Queue(CONTROL)],
        "task_default_queue": RUNS,
        "task_routes": {REAP_TASK: {"queue": CONTROL}, SWEEP_TASK: {"queue": CONTROL}},
    }
