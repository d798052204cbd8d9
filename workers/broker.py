"""What the enqueuers and the workers must agree on: task names, queues, broker options.

Light on purpose (no Celery import): the Client reads it to send a run by name.

Two brokers. Redis (the default, no setup): a worker lost whole strands its messages
until the visibility timeout, so recovery is the leases' and the reaper's job. RabbitMQ
(`CAIRN_BROKER_URL=amqp://...`, for production): a lost worker's unacked messages are
requeued as soon as its connection drops, and quorum queues count each message's
deliveries, so one that keeps killing its worker is dropped by the broker itself.
"""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, Any

from cairn.core.redisurl import is_sentinel

if TYPE_CHECKING:
    from cairn.core.settings import Settings

RUN_TASK = "cairn.run"
REAP_TASK = "cairn.reap"
SWEEP_TASK = "cairn.sweep"
# Workers consume four queues: the control queue, resumed runs, new runs of high
# priority, then the others, in that order (on Redis: kombu's "sorted" queue order, which
# these names sort into, so a free worker takes from the first that holds a message; on
# RabbitMQ each queue has its own prefetch, so a message of one never waits behind
# another's backlog, only behind what a worker already took). A run already started,
# whose worker died, goes on before any new run starts: its recovery does not wait
# behind the backlog. The control queue carries only what an older beat sent: beat runs
# the reaper, the wake pass, the firer and the sweep on its own threads
# (cairn.workers.control), so no control pass waits for a pool process or holds one.
RUNS = "celery"
HIGH = "cairn.runs.high"  # priority > 0
RESUME = "cairn.resume"
CONTROL = "cairn.control"
QUEUES = (RUNS, HIGH, RESUME, CONTROL)
RUN_QUEUES = (RUNS, HIGH, RESUME)
assert sorted(QUEUES) == [CONTROL, RESUME, HIGH, RUNS], "the Redis priority order is by name"

# RabbitMQ only. A message delivered this many times more is dropped: the backstop for a
# run that kills its worker before cairn counts the delivery. Above CAIRN_MAX_DELIVERIES
# (10) so that cairn's own verdict, with its error recorded, comes first; a dropped run's
# message is sent again by the reaper. A constant: a quorum queue's arguments cannot
# change once it exists (a different value fails every declare with PRECONDITION_FAILED).
DELIVERY_LIMIT = 20
# Where Celery parks countdown messages on RabbitMQ ("native delayed delivery": queues
# celery_delayed_0..27, one per bit of the delay); Celery declares them at worker start.
DELAYED_QUEUES = tuple(f"celery_delayed_{level}" for level in range(28))


def pinned_queue(version: str) -> str:
    """The queue of one code version's workers: its pinned runs' resumes (versions="pin").
    Sorts after RESUME and before HIGH: on Redis a pinned run's resume waits behind
    resumes, never behind new runs."""
    return f"{RESUME}.v.{version}"


def queue_for(priority: int) -> str:
    """The queue a new run of this priority is sent to."""
    return HIGH if priority > 0 else RUNS


def is_amqp(url: str) -> bool:
    return url.split("://", 1)[0] in ("amqp", "amqps", "pyamqp")


def delay(settings: Settings, seconds: float) -> float:
    """A retry's countdown as the broker can keep it: RabbitMQ's delayed delivery counts
    whole seconds and refuses less than one (Celery raises on a countdown under 1 s)."""
    return max(1, math.ceil(seconds)) if is_amqp(settings.broker) else seconds


def in_flight(app: Any, taken_within: float | None = None) -> int:
    """Run messages the broker holds: ready in the run queues, plus (Redis) those taken
    by a worker and not yet acked, which include countdown retries a worker keeps, or
    (RabbitMQ) countdown retries parked in the delayed-delivery queues.

    taken_within (Redis): count only messages taken that recently. A worker takes a
    message when it can start it (one per process or thread), so one taken long ago
    whose run is still unclaimed sits with a worker that died whole: not in flight.

    RabbitMQ does not say how many messages are taken and unacked (AMQP's queue.declare
    counts ready ones only). A worker takes up to its concurrency from each queue it
    consumes (quorum queues apply prefetch per consumer); a run it holds but has not
    started for CAIRN_LOST_AFTER may then be sent once more, which the lease makes a
    no-op."""
    held = 0
    with app.connection_for_read() as conn:
        amqp = conn.transport.driver_type == "amqp"
        for queue in (*RUN_QUEUES, *(DELAYED_QUEUES if amqp else ())):
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
            client = channel.client
            if taken_within is None:
                raws = client.hvals(unacked_key)
            else:
                since = time.time() - taken_within
                tags = client.zrangebyscore(channel.unacked_index_key, since, "+inf")
                raws = [r for r in client.hmget(unacked_key, tags) if r] if tags else []
            for raw in raws:
                if json.loads(raw)[2] in RUN_QUEUES:
                    held += 1
    return held


def queues(settings: Settings) -> list[Any]:
    """cairn's queues, as the broker in settings declares them."""
    return [declared(settings, name) for name in QUEUES]


def declared(settings: Settings, name: str) -> Any:
    """One queue as the broker in settings declares it: a sender declares a version's
    queue as its workers do, so a message sent before any of them started waits there
    (an undeclared queue on Redis drops it; a queue declared with other arguments on
    RabbitMQ refuses it)."""
    from kombu import Exchange, Queue

    if not is_amqp(settings.broker):
        return Queue(name)
    # Quorum queues: replicated, durable, and they count deliveries. A topic exchange
    # per queue, because Celery's delayed delivery (countdown retries on quorum queues,
    # which do not support the global QoS that worker-side countdowns need) cannot
    # route through direct exchanges. The consumer timeout (RabbitMQ 3.12+; older
    # servers take `consumer_timeout` from their config) is how long a worker may hold a
    # message, which is a whole run until it ends, waits or hands off: as long as the
    # Redis visibility timeout, and a consumer argument, so it can change between deploys.
    return Queue(
        name,
        Exchange(name, type="topic"),
        routing_key=name,
        queue_arguments={"x-queue-type": "quorum", "x-delivery-limit": DELIVERY_LIMIT},
        consumer_arguments={"x-consumer-timeout": int(settings.visibility_timeout * 1000)},
    )


def conf(settings: Settings) -> dict[str, Any]:
    """Celery configuration shared by the worker app and the Client's producer."""
    amqp = is_amqp(settings.broker)
    options: dict[str, Any] = (
        # A publish returns once RabbitMQ has the message (a quorum queue: on a majority
        # of its replicas), so an enqueue that returned is not lost with the broker.
        {"confirm_publish": True}
        if amqp
        # See Settings.visibility_timeout: long on purpose; recovery is the reaper's job.
        else {"visibility_timeout": settings.visibility_timeout, "queue_order_strategy": "sorted"}
    )
    if is_sentinel(settings.broker) and settings.redis_sentinel_master:
        # kombu's Sentinel transport: the same sentinels and master as cairn's own client.
        options["master_name"] = settings.redis_sentinel_master
    return {
        "broker_url": settings.broker,
        "broker_transport_options": {**options, **settings.broker_transport_options},
        "broker_connection_retry_on_startup": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_ignore_result": True,
        "task_queues": queues(settings),
        "task_default_queue": RUNS,
        "task_default_exchange_type": "topic" if amqp else "direct",
        "task_routes": {REAP_TASK: {"queue": CONTROL}, SWEEP_TASK: {"queue": CONTROL}},
    }


def reset_broker(url: str) -> None:
    """Delete cairn's queues, and Celery's delayed-delivery ones, on a RabbitMQ vhost:
    what flushing a Redis database is to the tests, chaos and the bench. The workers
    declare them again when they start."""
    from kombu import Connection

    with Connection(url, connect_timeout=5) as conn:
        channel = conn.channel()
        for queue in (*QUEUES, *DELAYED_QUEUES):
            channel.queue_delete(queue)  # RabbitMQ: deleting a missing queue is no error
