"""The one place cairn's own Redis clients are made: leases, event streams, rate limits,
the fleet's beats and the tools all take a URL and get their client here.

A URL is either redis-py's (`redis://`, `rediss://`, `unix://`) or kombu's Sentinel form,
`sentinel://[:password@]host:port[/db][;sentinel://host:port...]`, with the master's name
given apart (Settings.redis_sentinel_master, kombu's `master_name` transport option) and
carried here as the first address's `master_name` query parameter. As in kombu, the first
address's password and database are the master's; the sentinels take no password.

A Sentinel client asks the sentinels for the master's address at every new connection and
drops its connections when the master it knew is gone or turned replica (redis-py's
SentinelManagedConnection turns a READONLY answer into a ConnectionError): a failover is
met by reconnecting to whichever server was promoted. The calls that fail meanwhile fail
as StoreUnavailable, retried where cairn already retries Redis (redis-py's own bounded
retry, the lease's TTL of grace, the outbox's next flush).
"""

from __future__ import annotations

from typing import Any

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
        return sentinel.master_for(
            address.master,
            connection_pool_class=pool_class,
            **address.master_kwargs(),
            **kwargs,
        )
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
        return sentinel.master_for(
            address.master,
            connection_pool_class=_AsyncBlockingSentinelPool,
            **address.master_kwargs(),
            **kwargs,
        )
    pool = redis.asyncio.BlockingConnectionPool.from_url(url, **kwargs)
    return redis.asyncio.Redis(connection_pool=pool)
