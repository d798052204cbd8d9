"""RabbitMQ as the broker (CAIRN_BROKER_URL=amqp://...): the queues cairn declares there,
and the messages the reaper counts as held by it. The crash tests run on it too."""

from __future__ import annotations

import uuid

import pytest
from celery import Celery
from kombu import Connection
from kombu.transport.native_delayed_delivery import (
    bind_queue_to_native_delayed_delivery_exchange,
    declare_native_delayed_delivery_exchanges_and_queues,
)

from cairn.workers import broker
from tests.helpers.runs import wait_for

on_rabbitmq = pytest.mark.parametrize("broker_url", ["amqp"], indirect=True)
OK = {"customer": "acme", "email": "a@acme.test"}


def _ready(settings, queue: str) -> int:
    with Connection(settings.broker) as conn, conn.channel() as channel:
        return channel.queue_declare(queue, passive=True).message_count


@on_rabbitmq
def test_a_message_that_keeps_coming_back_is_dropped_at_the_delivery_limit(
    client, settings
) -> None:
    deliveries = 0
    with Connection(settings.broker) as conn:
        channel = conn.channel()
        # The queues as a worker declares them at start: the Client's producer declares a
        # queue once per connection, and an earlier test on this vhost may have met it.
        for queue in broker.queues(settings):
            queue(channel).declare()
        client.enqueue("invoice", OK)
        # What a worker killed mid-task amounts to: the message goes back to the queue.
        while (message := channel.basic_get(broker.RUNS, no_ack=False)) is not None:
            deliveries += 1
            channel.basic_reject(message.delivery_tag, requeue=True)
            assert deliveries <= broker.DELIVERY_LIMIT + 1, "the queue has no delivery limit"
    assert deliveries == broker.DELIVERY_LIMIT + 1
    assert _ready(settings, broker.RUNS) == 0


@on_rabbitmq
def test_in_flight_counts_ready_and_delayed_run_messages_but_not_the_reapers(
    client, settings
) -> None:
    app = Celery("test-producer")  # the Client hands out no Celery app: the test's own
    app.conf.update(broker.conf(settings))
    try:
        with app.connection_for_write() as conn:  # what each worker does at start
            declare_native_delayed_delivery_exchanges_and_queues(conn, "quorum")
            for queue in broker.queues(settings):
                queue(conn.default_channel).declare()
                bind_queue_to_native_delayed_delivery_exchange(conn, queue)
        assert broker.in_flight(app) == 0
        client.enqueue("invoice", OK)
        # A deferred run's retry, as the run task sends it: under a second is rounded up.
        app.send_task(
            broker.RUN_TASK,
            args=[f"later-{uuid.uuid4().hex[:6]}"],
            queue=broker.RESUME,
            countdown=broker.delay(settings, 0.5),
        )
        app.send_task(broker.REAP_TASK)  # routed to the control queue: not a run
        assert _ready(settings, broker.CONTROL) == 1
        assert _ready(settings, broker.RESUME) == 0  # parked in a delayed-delivery queue
        assert broker.in_flight(app) == 2
        # and then delivered where it was sent
        wait_for(lambda: _ready(settings, broker.RESUME) == 1, 10, "the delayed message")
        assert broker.in_flight(app) == 2
    finally:
        app.close()


def test_redis_keeps_its_visibility_timeout_and_rabbitmq_gets_confirms(settings) -> None:
    redis_conf = broker.conf(settings)
    assert redis_conf["broker_transport_options"]["visibility_timeout"] == 3600.0
    assert all(not q.queue_arguments for q in redis_conf["task_queues"])
    amqp = settings.with_options(broker_url="amqp://guest:guest@127.0.0.1:5672//")
    amqp_conf = broker.conf(amqp)
    assert amqp_conf["broker_transport_options"] == {"confirm_publish": True}
    assert {q.name: q.queue_arguments["x-queue-type"] for q in amqp_conf["task_queues"]} == {
        broker.RUNS: "quorum",
        broker.HIGH: "quorum",
        broker.RESUME: "quorum",
        broker.CONTROL: "quorum",
    }
    assert broker.delay(amqp, 0.2) == 1 and broker.delay(settings, 0.2) == 0.2
