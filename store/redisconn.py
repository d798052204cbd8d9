"""The one place cairn's own Redis clients are made: leases, event streams, rate limits,
the fleet's beats and the tools all take a URL and get their client here.

A URL is redis-py's (`redis://`, `rediss://`, `unix://`) or kombu's Sentinel list with the
master's name in it (cairn.core.redisurl; Settings.redis builds it).

A Sentinel client asks the sentinels for the master's address at every new connection and
drops its connections when the master it knew is gone or turned replica (redis-py's
SentinelManagedConnection turns a READONLY answer into a ConnectionError): a failover is
met by reconnecting to whichever server was promoted. The calls that fail meanwhile fail
as StoreUnavailable, retried where cairn already retries Redis (redis-py's own bounded
retry, the lease's TTL of grace, the outbox's next flush).
"""

from __future__ import annotations

from typing import Any, cast

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

from cairn.core.redisurl import is_sentinel, parse_sentinel


class _BlockingSentinelPool(redis.sentinel.SentinelConnectionPool, redis.BlockingConnectionPool):
    """A Sentinel pool that waits for a free connection (as cairn's plain pools do)
    instead of raising past max_connections."""


def client(url: str, *, blocking: bool = False, **kwargs: Any) -> redis.Redis:
    """A client for url; blocking: a pool that waits up to `timeout` for a connection
    among `max_connections` (the kwargs of BlockingConnectionPool)."""
    if is_sentinel(url):
        address = parse_sentinel(url)
        sockets = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
        sentinel = redis.sentinel.Sentinel(list(address.sentinels), sentinel_kwargs=sockets)
        pool_class = _BlockingSentinelPool if blocking else redis.sentinel.SentinelConnectionPool
        master = sentinel.master_for(
            address.master,
            connection_pool_class=pool_class,
            **address.master_kwargs(),
            **kwargs,
        )
        return cast("redis.Redis", master)
    if blocking:
        pool = redis.BlockingConnectionPool.from_url(url, **kwargs)
        return redis.Redis(connection_pool=pool)
    return redis.Redis.from_url(url, **kwargs)


class _AsyncBlockingSentinelPool(
    redis.asyncio.sentinel.SentinelConnectionPool, redis.asyncio.BlockingConnectionPool
):
    """The asyncio twin of _BlockingSentinelPool."""


def async_client(url: str, **kwargs: Any) -> redis.asyncio.Redis:
    """An asyncio client for url over a blocking pool (kwargs: BlockingConnectionPool's)."""
    if is_sentinel(url):
        address = parse_sentinel(url)
        sockets = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
        sentinel = redis.asyncio.sentinel.Sentinel(list(address.sentinels), sentinel_kwargs=sockets)
        master = sentinel.master_for(
            address.master,
            connection_pool_class=_AsyncBlockingSentinelPool,
            **address.master_kwargs(),
            **kwargs,
        )
        return cast("redis.asyncio.Redis", master)
    pool = redis.asyncio.BlockingConnectionPool.from_url(url, **kwargs)
    return redis.asyncio.Redis(connection_pool=pool)


def close_sentinels(client: redis.Redis) -> None:
    """Close the connections a Sentinel client keeps to the sentinels (its pool's are the
    caller's to close); nothing for a plain client."""
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    for s in manager.sentinels if manager else ():
        s.close()


async def aclose_sentinels(client: redis.asyncio.Redis) -> None:
    """close_sentinels for asyncio."""
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    for s in manager.sentinels if manager else ():
        await s.aclose()
