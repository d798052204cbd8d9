"""Which code versions have live workers, and which pinned runs wait for one.

Each worker's main process beats into one Redis sorted set (keys.WORKERS); a version
whose last beat is older than CAIRN_PIN_ORPHAN_AFTER while pinned runs of it are under
way has orphans: `cairn deploy status`, the server's metrics and the reaper's log line
say so. Nothing here stops or moves a run: a worker of that version started again takes
its runs back.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

import redis

from cairn.store import keys, redisconn
from cairn.store.lease import translated

if TYPE_CHECKING:
    from cairn.store.contract import Maintenance

BEAT_EVERY = 5.0
# A worker is live while its last beat is this recent: three beats missed.
LIVE_WITHIN = 3 * BEAT_EVERY
# A killed worker's entry is pruned after a week: its version's last sign of life stays
# known that long, which the orphan report measures from.
KEEP = 7 * 24 * 3600.0
TELL_EVERY = 300.0
# A payload key a worker lacked counts this long after the last time one met it: long
# enough for a probe to see it, short enough that a key retired after a deploy that
# handed runs around is forgotten soon.
KEYS_SEEN = 600.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Version:
    """One code version as the fleet sees it: its live workers, its pinned runs under
    way (of which waiting), when a worker of it last beat (None: never, or pruned), and
    whether its pinned runs are orphaned (no live worker for over orphan_after)."""

    version: str
    workers: tuple[str, ...] = ()
    pinned: int = 0
    waiting: int = 0
    last_seen: float | None = None
    orphaned: bool = False


class Fleet:
    """The workers' beats, over one Redis client."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    @classmethod
    def from_url(cls, url: str) -> Fleet:
        return cls(redisconn.client(url, socket_timeout=5, socket_connect_timeout=5))

    def beat(self, version: str, node: str) -> None:
        now = time.time()
        with translated():
            pipe = self.client.pipeline(transaction=False)
            pipe.zadd(keys.WORKERS, {f"{version}|{node}": now})
            pipe.zremrangebyscore(keys.WORKERS, 0, now - KEEP)
            pipe.execute()

    def gone(self, version: str, node: str) -> None:
        """A worker that stops well: its version's live count drops at once."""
        with translated():
            self.client.zrem(keys.WORKERS, f"{version}|{node}")

    def versions(self, pinned: dict[str, tuple[int, int]], orphan_after: float) -> list[Version]:
        """Every version with a worker beat or a pinned run under way, sorted; pinned is
        the store's pinned_runs()."""
        now = time.time()
        with translated():
            beats = cast(
                "list[tuple[bytes, float]]",
                self.client.zrange(keys.WORKERS, 0, -1, withscores=True),
            )
        seen: dict[str, float] = {}
        live: dict[str, list[str]] = {}
        for member, at in beats:
            version, _, node = member.decode().rpartition("|")
            seen[version] = max(seen.get(version, 0.0), at)
            if at >= now - LIVE_WITHIN:
                live.setdefault(version, []).append(node)
        found = []
        for version in sorted(seen.keys() | pinned.keys()):
            runs, waiting = pinned.get(version, (0, 0))
            last = seen.get(version)
            orphaned = (
                bool(runs) and not live.get(version) and (last is None or last < now - orphan_after)
            )
            workers = tuple(sorted(live.get(version, ())))
            found.append(
                Version(
                    version=version,
                    workers=workers,
                    pinned=runs,
                    waiting=waiting,
                    last_seen=last,
                    orphaned=orphaned,
                )
            )
        return found

    def lacked(self, key_id: str) -> None:
        """A worker met a payload sealed under key_id, which its key ring lacks."""
        now = time.time()
        with translated():
            pipe = self.client.pipeline(transaction=False)
            pipe.zadd(keys.KEYS_MISSING, {key_id: now})
            pipe.zremrangebyscore(keys.KEYS_MISSING, 0, now - KEYS_SEEN)
            pipe.execute()

    def lacking(self, held: Iterable[str]) -> dict[str, float]:
        """The key ids workers lacked within KEYS_SEEN that are not in held, each with
        when one was last met."""
        with translated():
            met = cast(
                "list[tuple[bytes, float]]",
                self.client.zrangebyscore(
                    keys.KEYS_MISSING, time.time() - KEYS_SEEN, "+inf", withscores=True
                ),
            )
        return {kid.decode(): at for kid, at in met if kid.decode() not in set(held)}

    def tell(self, version: str) -> bool:
        """True once every TELL_EVERY seconds per version, across the fleet: whether to log
        its orphans now."""
        with translated():
            return bool(self.client.set(keys.orphan_told(version), 1, nx=True, ex=int(TELL_EVERY)))

    def close(self) -> None:
        self.client.close()
        redisconn.close_sentinels(self.client)


def fleet_versions(store: Maintenance, redis_url: str, orphan_after: float) -> list[Version]:
    """The fleet's versions as `cairn deploy status` and the server's metrics read them:
    the store's pinned runs against the workers' beats."""
    fleet = Fleet.from_url(redis_url)
    try:
        return fleet.versions(store.pinned_runs(), orphan_after)
    finally:
        fleet.close()
