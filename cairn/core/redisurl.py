"""Redis URLs as cairn takes them: redis-py's (`redis://`, `rediss://`, `unix://`) or
kombu's Sentinel list, `sentinel://[:password@]host:port[/db][;sentinel://host:port...]`,
whose master's name is given apart (CAIRN_REDIS_SENTINEL_MASTER, kombu's `master_name`
transport option) and carried in the URL cairn's store takes as the first address's
`master_name` query parameter (Settings.redis). As in kombu, the first address's password
and database are the master's; the sentinels take no password. Pure parsing: the clients
are made in cairn.store.redisconn.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from typing import Any

SENTINEL_PORT = 26379


class RedisUrlError(ValueError):
    """A Redis URL that names no server cairn can use (a one-line message)."""


@dataclasses.dataclass(frozen=True)
class SentinelAddress:
    sentinels: tuple[tuple[str, int], ...]
    master: str
    password: str | None = None
    username: str | None = None
    db: int = 0
    ssl: bool = False

    def master_kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"db": self.db, "ssl": self.ssl}
        if self.password is not None:
            out["password"] = self.password
        if self.username:
            out["username"] = self.username
        return out


def is_sentinel(url: str) -> bool:
    return url.strip().lower().startswith("sentinel://")


def with_master(url: str, master: str) -> str:
    """A Sentinel URL with its master's name added as the first address's master_name."""
    first, sep, rest = url.partition(";")
    parts = urllib.parse.urlsplit(first)
    query = urllib.parse.parse_qsl(parts.query)
    query = [(k, v) for k, v in query if k != "master_name"] + [("master_name", master)]
    return parts._replace(query=urllib.parse.urlencode(query)).geturl() + sep + rest


def strip_master(url: str) -> str:
    """The URL without the master_name cairn carries in it (kombu's own form)."""
    first, sep, rest = url.partition(";")
    parts = urllib.parse.urlsplit(first)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "master_name"]
    return parts._replace(query=urllib.parse.urlencode(query)).geturl() + sep + rest


def parse_sentinel(url: str) -> SentinelAddress:
    """kombu's `sentinel://...;sentinel://...` list, checked: RedisUrlError says what is
    wrong in one line (the password is never repeated in it)."""
    sentinels: list[tuple[str, int]] = []
    first: urllib.parse.SplitResult | None = None
    for i, raw in enumerate(p.strip() for p in url.split(";")):
        if not raw:
            continue
        parts = urllib.parse.urlsplit(raw)
        if parts.scheme.lower() != "sentinel":
            raise RedisUrlError(
                f"CAIRN_REDIS_URL: address {i + 1} is not sentinel://host:port "
                "(a Sentinel URL lists sentinels only, separated by ';')"
            )
        try:
            port = parts.port or SENTINEL_PORT
        except ValueError:
            raise RedisUrlError(f"CAIRN_REDIS_URL: address {i + 1} has a bad port") from None
        if not parts.hostname:
            raise RedisUrlError(f"CAIRN_REDIS_URL: address {i + 1} names no host")
        sentinels.append((parts.hostname, port))
        first = first or parts
    if first is None:
        raise RedisUrlError("CAIRN_REDIS_URL: a Sentinel URL names no sentinel")
    query = dict(urllib.parse.parse_qsl(first.query))
    master = query.get("master_name", "")
    if not master:
        raise RedisUrlError(
            "CAIRN_REDIS_URL is a Sentinel URL: set CAIRN_REDIS_SENTINEL_MASTER to the "
            "master's name (kombu's master_name)"
        )
    path = first.path.strip("/") or "0"
    if not path.isdigit():
        raise RedisUrlError(f"CAIRN_REDIS_URL: database {path!r} is not a number")
    return SentinelAddress(
        sentinels=tuple(sentinels),
        master=master,
        password=urllib.parse.unquote(first.password) if first.password else None,
        username=urllib.parse.unquote(first.username) if first.username else None,
        db=int(path),
        ssl=query.get("ssl", "").lower() in ("1", "true", "yes"),
    )
