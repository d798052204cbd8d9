"""Counts by status read two ways, for the counts tests: the store's (count_by_status)
and the truth (a GROUP BY over the checkpoints)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from cairn.store import PgStore
from cairn.store.sql import QUERIES

GROUP_BY = "SELECT status, count(*) FROM checkpoints GROUP BY status"


def store_counts(store: PgStore) -> dict[str, int]:
    """The store's counts by status."""
    return {status: int(row["n"]) for status, row in store.counts().items()}


def true_counts(sql: Callable[..., list[tuple[Any, ...]]]) -> dict[str, int]:
    """The counts by status of a GROUP BY over the checkpoints."""
    return {status: int(n) for status, n in sql(GROUP_BY)}


def consistent(conn: psycopg.Connection[Any]) -> tuple[dict[str, int], dict[str, int]]:
    """count_by_status and a GROUP BY read in one snapshot: equal at any moment, even with
    transitions and folds in flight, or the counts are not exact."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        counted = {r[0]: int(r[1]) for r in conn.execute(QUERIES["count_by_status"])}
        grouped = {r[0]: int(r[1]) for r in conn.execute(GROUP_BY)}
    return counted, grouped
