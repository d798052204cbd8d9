"""The one place bench/ imports cairn's internals. The rest of bench/ goes through the
public API (`import cairn`, `cairn.testing`, `cairn.langgraph`, `cairn.pydantic_ai`), so a
refactoring of cairn's internals asks an edit here and nowhere else in bench/.

Each name below is here because a benchmark measures, or stands up, something under the
public API: the loop without a broker, the store without a Client, the event path without
a worker, the floor a step is measured against.
"""

from __future__ import annotations

from cairn.core import tracing  # the tracer a traced in-process run installs (tracing overhead)
from cairn.core.events import encode  # a token event as a worker writes it (stream section)
from cairn.steps.model import (
    ModelClient,  # the model client under the fleet-wide rate limiter (ratelimit section)
    preload_sdk,  # the anthropic SDK loaded before the clock starts (ratelimit section)
)
from cairn.store import (
    Database,  # the store's own pool: the in-process loop and store timings
    Leases,  # the Redis leases of the in-process loop and of the stream producers
    LeaseToken,  # a lease as Redis holds it: who held a run when it was killed (recovery)
    PgStore,  # saves and loads timed without a Client (per step, growth, million)
    RunFilter,  # the listing the CLI and the pages ask for (million)
    admin,  # the bench's databases dropped and its Redis databases flushed between runs
    keys,  # the Redis keys of a run's stream and of the serve hub's wake streams (stream)
    upgrade,  # a fresh database migrated as `cairn db upgrade` does
)
from cairn.store.db import channel  # a run's notification channel, heard bare (waits)
from cairn.store.events import RedisEvents  # the event log under a worker's Outbox (stream)
from cairn.store.ratelimit import Limit, RateLimiter  # the limiter itself (ratelimit section)
from cairn.store.sql import (
    QUERIES,  # each named query EXPLAINed at a million runs (million)
    migrations,  # a database built up to a migration, to time the next one (million)
)
from cairn.testing import fleet  # real worker, beat and server processes, as the tests start
from cairn.workers import (
    broker,  # Celery's configuration of cairn's broker, for the bench's own sender
    loop,  # a run driven in process, no broker: the loop's own cost per step
)
from cairn.workers.broker import reset_broker  # the bench's RabbitMQ vhost emptied (recovery)
from cairn.workers.metrics import Metrics  # a worker's middleware, so the loop timed is its
from cairn.workers.middleware import Chain  # the middleware chain a worker builds
from cairn.workers.outbox import Outbox  # a worker's path of run events to Redis
from cairn.workers.reaper import Reaper  # one reaper pass timed in process (backlog)
from cairn.workers.tracing import Tracing  # the tracing middleware (tracing overhead)

__all__ = [
    "QUERIES",
    "Chain",
    "Database",
    "LeaseToken",
    "Leases",
    "Limit",
    "Metrics",
    "ModelClient",
    "Outbox",
    "PgStore",
    "RateLimiter",
    "Reaper",
    "RedisEvents",
    "RunFilter",
    "Tracing",
    "admin",
    "broker",
    "channel",
    "encode",
    "fleet",
    "keys",
    "loop",
    "migrations",
    "preload_sdk",
    "reset_broker",
    "tracing",
    "upgrade",
]
