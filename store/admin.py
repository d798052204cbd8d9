"""Operator's tools on the servers cairn uses: whole databases, Redis databases and RabbitMQ
vhosts, for the demo, `cairn chaos`, the bench and the tests (kept here, the drivers' one
home)."""

from __future__ import annotations

import urllib.parse
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from cairn.store import redisconn
from cairn.store.db import translated
from cairn.store.lease import translated as redis_translated


def with_path(url: str, path: str) -> str:
    """url with its path replaced by "/" + path (a database name or a Redis index)."""
    return urllib.parse.urlsplit(url)._replace(path="/" + path).geturl()


def create_database(base_url: str, name: str, template: str | None = None) -> str:
    """CREATE DATABASE name (from template) on base_url's server; returns its URL."""
    query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template:
        query += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    with translated(), psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(query)
    return with_path(base_url, name)


def drop_database(base_url: str, name: str) -> None:
    """Drop database name on base_url's server, even if clients are connected."""
    query = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with translated(), psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(query)


def execute(url: str, query: str, params: Any = None) -> list[dict[str, Any]]:
    """One statement (or a script without params) on its own connection; its rows."""
    with translated(), psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


class RedisDatabase:
    """One Redis database, for tooling that flushes it, watches a queue or a key."""

    def __init__(self, url: str) -> None:
        self.client = redisconn.client(url, socket_timeout=10, socket_connect_timeout=5)

    def flush(self) -> None:
        with redis_translated():
            self.client.flushdb()

    def set(self, key: str, value: str = "1") -> None:
        with redis_translated():
            self.client.set(key, value)

    def exists(self, key: str) -> bool:
        with redis_translated():
            return bool(self.client.exists(key))

    def queue_length(self, queue: str) -> int:
        """Messages waiting in a Celery queue on the Redis broker."""
        with redis_translated():
            return int(self.client.llen(queue))

    def close(self) -> None:
        self.client.close()
