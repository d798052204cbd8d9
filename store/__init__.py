"""Durable state: the Postgres checkpoint store, the effect ledger, the Redis lease, and
the contract every backend implements (contract.py).

The only package that imports psycopg and redis: driver errors become cairn.errors here.
Names load on first use, so an enqueuer that needs Postgres never imports redis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cairn.core.lazy import loader

_LAZY = {
    "CHECKPOINT_VERSION": "cairn.core.records",
    "START": "cairn.core.records",
    "TERMINAL": "cairn.core.status",
    "Checkpoint": "cairn.core.records",
    "AdminStore": "cairn.store.contract",
    "CheckpointStore": "cairn.store.contract",
    "Maintenance": "cairn.store.contract",
    "RunFilter": "cairn.core.records",
    "RunStore": "cairn.store.contract",
    "Schedules": "cairn.store.contract",
    "PgStore": "cairn.store.checkpoints",
    "Database": "cairn.store.db",
    "upgrade": "cairn.store.db",
    "Lease": "cairn.store.lease",
    "LeaseToken": "cairn.store.lease",
    "Leases": "cairn.store.lease",
    "Run": "cairn.core.records",
    "StepTransaction": "cairn.store.tx",
}

if TYPE_CHECKING:
    from cairn.core.records import CHECKPOINT_VERSION, START, Checkpoint, Run, RunFilter
    from cairn.core.status import TERMINAL
    from cairn.store.checkpoints import PgStore
    from cairn.store.contract import AdminStore, CheckpointStore, Maintenance, RunStore, Schedules
    from cairn.store.db import Database, upgrade
    from cairn.store.lease import Lease, Leases, LeaseToken
    from cairn.store.tx import StepTransaction


__getattr__ = loader("cairn.store", _LAZY, globals())


__all__ = [
    "CHECKPOINT_VERSION",
    "START",
    "TERMINAL",
    "AdminStore",
    "Checkpoint",
    "CheckpointStore",
    "Database",
    "Lease",
    "LeaseToken",
    "Leases",
    "Maintenance",
    "PgStore",
    "Run",
    "RunFilter",
    "RunStore",
    "Schedules",
    "StepTransaction",
    "upgrade",
]
