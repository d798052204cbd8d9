"""Durable state: the Postgres checkpoint store, the effect ledger, the Redis lease.

Only this package imports psycopg and redis.
"""

from store.checkpoints import CHECKPOINT_VERSION, TERMINAL, Checkpoint, CheckpointStore, PgStore
from store.db import Database, upgrade
from store.errors import (
    CairnError,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    InvalidInput,
    LeaseLost,
    ModelUnavailable,
    MultipleEffects,
    StaleWrite,
    StoreUnavailable,
    Transient,
    UnknownRun,
    UnknownWorkflow,
    WindowTooLarge,
)
from store.lease import Lease, Leases

__all__ = [
    "CHECKPOINT_VERSION",
    "TERMINAL",
    "CairnError",
    "Checkpoint",
    "CheckpointStore",
    "CorruptCheckpoint",
    "Database",
    "IncompatibleCheckpoint",
    "InvalidInput",
    "Lease",
    "LeaseLost",
    "Leases",
    "ModelUnavailable",
    "MultipleEffects",
    "PgStore",
    "StaleWrite",
    "StoreUnavailable",
    "Transient",
    "UnknownRun",
    "UnknownWorkflow",
    "WindowTooLarge",
    "upgrade",
]
