"""In-memory twins of the checkpoint store and the leases, for loop-logic tests without
Postgres, Redis or Celery (procrastinate's InMemoryConnector, LangGraph's InMemorySaver).

    clock = ManualClock()
    store = MemoryStore(clock)
    deps = loop.Deps(settings=Settings(), store=store, leases=MemoryLeases(clock), model=None)
    store.create_run("r1", "my-flow", {})
    assert loop.run("r1", deps) == RunStatus.WAITING    # its first step waits, an hour at most
    clock.advance(3600)                                  # and then the timeout has passed

Each MemoryStore method follows its named query in store/sql/queries.sql clause by clause
(the guard, the claim's fence, what a save writes and answers, a fork's and a rewind's
snapshot), MemorySchedules follows store/sql/schedules.sql, and MemoryLeases follows
store/lua/*.lua. tests/contract/test_store_contract.py runs one suite against these and against
PgStore, ScheduleStore and the Redis Leases: a twin that drifts fails there, not in
production. The whole of the store contract is here, so `cairn.Client(store=MemoryStore())`
is the real Client with no service (cairn.testing.LocalWorker runs what it enqueues).
Where a twin cannot be the real thing (ctx.db has no database) it says so loudly.

The package, one audience a module: clock (ManualClock), rows and tables (MemoryStore's
rows, and what all its operations share: the lock, the stamps, the triggers, the selects),
runs (the loop's RunStore), admin and forks (the operators' AdminStore), maintenance (the
reaper and the sweep), store (MemoryStore, all of them), schedules, leases and events.
"""

from __future__ import annotations

from cairn.testing.memory.clock import Clock, ManualClock
from cairn.testing.memory.events import MemoryEvents
from cairn.testing.memory.leases import MemoryLease, MemoryLeases
from cairn.testing.memory.schedules import MemorySchedules
from cairn.testing.memory.store import MemoryStore

__all__ = [
    "Clock",
    "ManualClock",
    "MemoryEvents",
    "MemoryLease",
    "MemoryLeases",
    "MemorySchedules",
    "MemoryStore",
]
