"""Run events in Redis Streams: one stream per run, written in batches by a worker's
outbox (store/lua/emit.lua), read by the Client and the web server.

An entry is one field, "e": the event's JSON (kind, data, cursor, visit, attempt, seq,
ts); its id is the stream's ("<ms>-<n>"), monotonic per run. The stream is live delivery:
bounded (MAXLEN, approximate), expiring, and lost with Redis's data. What must outlive
it is in Postgres, and readers rebuild from there (cairn.workers.events).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import redis
import redis.asyncio
from redis.typing import KeyT, StreamIdT

from cairn.core.records import StreamInfo
from cairn.store import keys, redisconn
from cairn.store.lease import _script, translated

# (run_id, the writer's lease token, its events as flag + JSON): one emit.lua call.
Batch = tuple[str, str, Sequence[str]]
Entry = tuple[str, str]  # (stream id, the event's JSON)

FENCED, OVER_CAP = 0, 1
_READ_TIMEOUT = 30.0  # a socket's, for connections that block on XREAD (at most 5-10 s)


def _noscript(answer: Any) -> bool:
    return isinstance(answer, redis.exceptions.NoScriptError)


def _info(raw: Any) -> StreamInfo | None:
    if not raw or not raw.get("first-entry"):
        return None
    first_id, fields = raw["first-entry"]
    return StreamInfo(
        first=first_id.decode(),
        last=raw["last-entry"][0].decode(),
        trimmed=raw["entries-added"] > raw["length"],
        origin=is_origin(fields.get(b"e", b"").decode()),
    )


def is_origin(blob: str) -> bool:
    """Whether an entry is the first event of a run that had saved nothing (see
    workers.events.encode's origin): a stream that begins with one holds the run from its
    beginning; one that begins with anything else was started again, or lost its first
    events."""
    return blob.endswith(ORIGIN_MARK)


# How encode() ends an origin event's JSON, so a reader needs no parse to tell one.
ORIGIN_MARK = ',"origin":true}'


def _entries(raw: Any) -> list[Entry]:
    return [(i.decode(), fields[b"e"].decode()) for i, fields in raw or ()]


class RedisEvents:
    """Appends (the workers' outbox) and blocking reads (Client.events), over one client."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._emit = _script(client, "emit.lua")
        self._claim = _script(client, "claim.lua")

    @classmethod
    def from_url(cls, url: str, max_connections: int = 16) -> RedisEvents:
        client = redisconn.client(
            url,
            blocking=True,
            max_connections=max_connections,
            timeout=5,
            socket_connect_timeout=5,
            # Above the longest blocking read (followers block 5 s at a time): redis-py
            # takes the pool's `timeout` for the sockets' too, and a read blocked as long
            # as its socket's timeout fails instead of returning empty.
            socket_timeout=_READ_TIMEOUT,
        )
        return cls(client)

    def append(
        self, batches: Sequence[Batch], *, maxlen: int, ttl: float, cap: int
    ) -> list[list[Any]]:
        """Each batch's events appended, all in one round trip: per event its stream id
        (str), FENCED (the writer lost the run) or OVER_CAP.

        EVALSHA by hand, not redis-py's Script in a pipeline, which asks SCRIPT EXISTS
        before every execute: a second round trip a batch. A Redis that lost its scripts
        (a restart) answers NOSCRIPT, and those calls go again after a SCRIPT LOAD (one
        that NOSCRIPT refused did nothing)."""
        calls = [
            (
                keys.events(run_id),
                keys.event_count(run_id),
                keys.lease(run_id),
                keys.event_epoch(run_id),
                token,
                maxlen,
                max(1, int(ttl)),
                cap,
                *events,
            )
            for run_id, token, events in batches
        ]
        with translated():
            answers = self._evalsha(calls)
            missing = [i for i, a in enumerate(answers) if _noscript(a)]
            if missing:
                self.client.script_load(self._emit.script)
                for i, a in zip(missing, self._evalsha([calls[i] for i in missing]), strict=True):
                    answers[i] = a
        for a in answers:
            if isinstance(a, Exception):
                raise a
        return [[a.decode() if isinstance(a, bytes) else a for a in ids] for ids in answers]

    def _evalsha(self, calls: list[tuple[Any, ...]]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for call in calls:
            pipe.evalsha(self._emit.sha, 4, *call)
        return pipe.execute(raise_on_error=False)

    def claim(self, run_id: str, epoch: int, count: int, ttl: float) -> list[Entry]:
        """Fence the run's stream at epoch (no older writer's event is added from now on)
        and return its newest `count` entries, newest first: the tail a worker taking the
        run over must account for (store/lua/claim.lua)."""
        with translated():
            raw = self._claim(
                keys=[keys.events(run_id), keys.event_epoch(run_id)],
                args=[epoch, count, max(1, int(ttl))],
            )
        # A script's reply is RESP's: each entry [id, [field, value, ...]].
        return [
            (i.decode(), dict(zip(f[::2], f[1::2], strict=True))[b"e"].decode()) for i, f in raw
        ]

    def before(self, run_id: str, entry_id: str, count: int) -> list[Entry]:
        """The `count` entries before entry_id, newest first (paging back from a tail)."""
        with translated():
            raw = self.client.xrevrange(keys.events(run_id), f"({entry_id}", "-", count=count)
        return _entries(raw)

    def read(
        self, run_id: str, after: str = "0-0", count: int = 500, block: float | None = None
    ) -> list[Entry]:
        """Entries after `after`, oldest first; block: wait up to that many seconds for one."""
        with translated():
            if block is None:
                raw = self.client.xrange(keys.events(run_id), f"({after}", "+", count=count)
                return _entries(raw)
            # Any: redis-py types the reply as RESP3's dict; on RESP2 it is [[key, entries]].
            got: Any = self.client.xread(
                {keys.events(run_id): after}, count=count, block=max(1, int(block * 1000))
            )
        return _entries(got[0][1]) if got else []

    def info(self, run_id: str) -> StreamInfo | None:
        """The stream's first and last ids and the newest trimmed one; None: no stream."""
        with translated():
            try:
                return _info(self.client.xinfo_stream(keys.events(run_id)))
            except redis.ResponseError:  # no such key
                return None

    def close(self) -> None:
        self.client.close()
        self.client.connection_pool.disconnect()  # a pool given to the client is not its to close
        redisconn.close_sentinels(self.client)


class AsyncRedisEvents:
    """The reading side for asyncio (AsyncClient.events, the web server's SSE hub)."""

    def __init__(self, url: str, max_connections: int = 64) -> None:
        self.client = redisconn.async_client(
            url,
            max_connections=max_connections,
            timeout=5,
            socket_connect_timeout=5,
            socket_timeout=_READ_TIMEOUT,  # above the hub's and readers' blocking reads
        )

    async def read_many(
        self, after: dict[str, str], count: int = 500, block: float | None = None
    ) -> dict[str, list[Entry]]:
        """Entries of several runs' streams after each one's id (one XREAD); block: wait
        up to that many seconds for any."""
        if not after:
            return {}
        streams = {keys.events(r): i for r, i in after.items()}
        with translated():
            if block is None and len(after) == 1:
                ((key, i),) = streams.items()
                raw = await self.client.xrange(key, f"({i}", "+", count=count)
                return {next(iter(after)): _entries(raw)}
            got: Any = await self.client.xread(  # [[key, entries]], as in read()
                cast("dict[KeyT, StreamIdT]", streams),
                count=count,
                block=None if block is None else max(1, int(block * 1000)),
            )
        prefix = len(keys.events(""))
        return {k.decode()[prefix:]: _entries(entries) for k, entries in got or ()}

    async def info(self, run_id: str) -> StreamInfo | None:
        with translated():
            try:
                return _info(await self.client.xinfo_stream(keys.events(run_id)))
            except redis.ResponseError:
                return None

    async def poke(self, name: str) -> None:
        """Append a mark to stream `name`: an XREAD blocked on it returns."""
        with translated():
            await self.client.xadd(keys.events(name), {"e": "{}"}, maxlen=10)

    async def forget(self, name: str) -> None:
        with translated():
            await self.client.delete(keys.events(name))

    async def close(self) -> None:
        await self.client.aclose()
        await self.client.connection_pool.disconnect()
        await redisconn.aclose_sentinels(self.client)
