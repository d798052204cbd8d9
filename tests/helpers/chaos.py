"""What the chaos tests share (tests/fleet/test_chaos.py and the LangGraph and pydantic-ai
crews): the seed that picks the kills, and the server the crews make their databases on."""

from __future__ import annotations

from tests.helpers.services import BASE_DB, via_pgbouncer

SEED = 1234
# PgBouncer in transaction mode when scripts/test runs the chaos test again behind it.
CHAOS_DB = via_pgbouncer(BASE_DB)
