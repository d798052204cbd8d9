"""The servers this pytest process uses, as scripts/services.sh started them: read once,
when tests/conftest.py imports this, before it clears the CAIRN_* variables (but for
CAIRN_TEST_*)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cairn.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
# Kept as CAIRN_TEST_* (which tests/conftest.py does not clear) for pytest-xdist's workers,
# started after the controller cleared CAIRN_DATABASE_URL and CAIRN_REDIS_URL.
BASE_DB = os.environ.setdefault("CAIRN_TEST_DATABASE_URL", Settings.from_env().database_url)
BASE_REDIS = os.environ.setdefault("CAIRN_TEST_REDIS_URL", Settings.from_env().redis_url)
# CAIRN_TEST_PGBOUNCER_PORT: the tests' runs, workers and clients reach Postgres through
# PgBouncer in transaction mode on that port (scripts/test runs the crash tests so).
PGBOUNCER_PORT = os.environ.get("CAIRN_TEST_PGBOUNCER_PORT")
# scripts/services.sh's RabbitMQ: user guest (loopback only), vhosts cairn-1..cairn-45.
RABBITMQ = f"amqp://guest:guest@127.0.0.1:{os.environ.get('CAIRN_RABBITMQ_PORT', '5672')}"
LEASE_TTL = 3.0
# A test that takes the broker_url fixture this way runs once per broker.
both_brokers = pytest.mark.parametrize("broker_url", ["redis", "amqp"], indirect=True)


def via_pgbouncer(url: str) -> str:
    """url through PgBouncer when the tests run behind it (CAIRN_TEST_PGBOUNCER_PORT)."""
    if not PGBOUNCER_PORT:
        return url
    host, _, name = url.rpartition("/")
    return f"{host.rsplit(':', 1)[0]}:{PGBOUNCER_PORT}/{name}"


def with_db(url: str, name: str) -> str:
    """url naming the database name on the same server (its query string kept)."""
    base, _, query = url.partition("?")
    return base.rsplit("/", 1)[0] + "/" + name + (f"?{query}" if query else "")
