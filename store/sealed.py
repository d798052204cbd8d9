"""Sealing the payloads already stored again under the key ring's first key (`cairn db
rotate-key`): after a new key is put first in CAIRN_PAYLOAD_KEYS, or when encryption is
turned on over clear payloads. In batches, each its own transaction, each row locked while
it is read and written back, so a worker's save of the same row waits for it and then
writes its own (newer) value: nothing a run saves meanwhile is overwritten."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg import sql

from cairn.core import sealing
from cairn.core.records import STEERED
from cairn.core.status import RunStatus
from cairn.store.db import Database
from cairn.store.payloads import Payload

# (table, column, a condition the rows must meet): every payload column, each written as a
# store.payloads.Payload (tests/integration/test_sealed_columns.py checks this list against
# the columns it finds sealed, and every column of the schema against it). A steer read's
# journal record holds message numbers, and a stop over budget's error names the budget:
# the SQL reads both, never sealed.
PAYLOADS: tuple[tuple[str, str, str], ...] = (
    ("runs", "input", "true"),
    ("checkpoints", "state", "true"),
    ("checkpoints", "error", f"status <> '{RunStatus.BUDGET_EXCEEDED}'"),
    ("checkpoints", "cancel_reason", "true"),
    ("step_history", "error", "true"),
    ("window_messages", "message", "true"),
    ("step_history", "state", "true"),
    ("journal", "result", f"name <> '{STEERED}'"),
    ("journal", "error", "true"),
    ("effects", "result", "true"),
    ("signals", "payload", "true"),
    ("steer_messages", "message", "true"),
    ("agent_session_items", "item", "true"),
    ("schedules", "input", "true"),
    ("approvals", "request", "true"),
    ("approval_decisions", "payload", "true"),
)


def reseal(
    db: Database, batch: int = 500, progress: Callable[[str, int], None] | None = None
) -> dict[str, int]:
    """Seal every stored payload not yet sealed under the key ring's first key, clear ones
    included; how many were sealed, per table.column. Raises PayloadKeyError without a
    key, or for a value sealed under a key the ring no longer holds."""
    ring = sealing.ring()
    if ring.sealing is None:
        raise sealing.PayloadKeyError(
            "CAIRN_PAYLOAD_KEYS holds no key: set it (the new key first, the old ones after) "
            "to seal the stored payloads under its first key"
        )
    # Rows whose value is not sealed under the first key: jsonb's text of a sealed value
    # starts so.
    prefix = f'{{"{sealing.SEALED}": "v1.{ring.sealing}.%'
    done: dict[str, int] = {}
    for table, column, only in PAYLOADS:
        stale = sql.SQL("NOT ({col}::text LIKE {prefix})").format(
            col=sql.Identifier(column), prefix=sql.Literal(prefix)
        )
        pick = sql.SQL(
            "SELECT tableoid, ctid, {col} AS value FROM {table} WHERE {col} IS NOT NULL AND {only}"
            " AND {stale} LIMIT {batch} FOR UPDATE"
        ).format(
            col=sql.Identifier(column),
            table=sql.Identifier(table),
            only=sql.SQL(only),  # a constant of this module's
            stale=stale,
            batch=sql.Literal(batch),
        )
        # ctid with tableoid: a partitioned table's partitions each count their own ctids.
        put = sql.SQL(
            "UPDATE {table} SET {col} = %(value)s WHERE tableoid = %(tableoid)s AND ctid = %(ctid)s"
        ).format(table=sql.Identifier(table), col=sql.Identifier(column))
        count = 0
        while True:
            with db.connection() as conn, conn.transaction():
                rows = conn.execute(pick).fetchall()
                for row in rows:
                    value: Any = row["value"]  # opened by the connection's loader
                    conn.execute(
                        put,
                        {
                            "value": Payload(value),
                            "tableoid": row["tableoid"],
                            "ctid": row["ctid"],
                        },
                    )
            count += len(rows)
            if progress is not None and rows:
                progress(f"{table}.{column}", count)
            if len(rows) < batch:
                break
        done[f"{table}.{column}"] = count
    return done
