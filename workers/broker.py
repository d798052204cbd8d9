"""What the enqueuers and the workers must agree on: task names, queues, broker options.

Light on purpose (no Celery import): the Client reads it to send a run by name.
"""

from __future__ import annotations

import json
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


def in_flight(app: Any) -> int:
    """Run messages the broker holds: ready in the run queues, plus (Redis) those taken
    by a worker and not yet acked, which include countdown retries a worker keeps."""
    held = 0
    with app.connection_for_read() as conn:
        for queue in (RUNS, RESUME):
            try:
                with conn.channel() as channel:
                    held += channel.queue_declare(queue, passive=True).message_count
            except conn.channel_errors:  # no such queue (yet, or flushed): nothing in it
                pass
        channel = conn.default_channel
        unacked_key = getattr(channel, "unacked_key", None)  # kombu's Redis transport
        if unacked_key is not None:
            # [message, exchange, routing key] per unacked message, of every queue: count
            # the runs' (the reaper's own tick is one of the others).
            for raw in channel.client.hvals(unacked_key):
                if json.loads(raw)[2] in (RUNS, RESUME):
                    held += 1
    return held


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
