"""Test tooling, kept out of the run path: loopback stand-ins (mail API, Messages API),
real worker processes (fleet), fault hooks, `cairn demo`, `cairn chaos` and the demo
workflows they run (`demos`, loaded only where CAIRN_WORKFLOWS names them), the in-memory
twins of the store, the schedules and the leases (MemoryStore, MemorySchedules,
MemoryLeases) that loop-logic tests run on without services, and LocalWorker, which runs
what a `cairn.Client(store=MemoryStore())` enqueued in the test's own process. Names load
on first use: importing this package is free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cairn.core.lazy import loader

_LAZY = {
    "LocalWorker": "cairn.testing.local",
    "ManualClock": "cairn.testing.memory",
    "MemoryLease": "cairn.testing.memory",
    "MemoryEvents": "cairn.testing.memory",
    "MemoryLeases": "cairn.testing.memory",
    "MemorySchedules": "cairn.testing.memory",
    "MemoryStore": "cairn.testing.memory",
}

if TYPE_CHECKING:
    from cairn.testing.local import LocalWorker
    from cairn.testing.memory import (
        ManualClock,
        MemoryEvents,
        MemoryLease,
        MemoryLeases,
        MemorySchedules,
        MemoryStore,
    )

__getattr__ = loader("cairn.testing", _LAZY, globals())

__all__ = [
    "LocalWorker",
    "ManualClock",
    "MemoryEvents",
    "MemoryLease",
    "MemoryLeases",
    "MemorySchedules",
    "MemoryStore",
]
