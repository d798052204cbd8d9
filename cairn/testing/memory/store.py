"""MemoryStore: the whole store contract (CheckpointStore) in memory, one audience's
operations a module: runs.py (the loop), admin.py and forks.py (operators),
maintenance.py (the reaper and the sweep), over the tables of tables.py."""

from __future__ import annotations

import time

from cairn.testing.memory.admin import _Admin
from cairn.testing.memory.approvals import MemoryApprovals
from cairn.testing.memory.clock import Clock
from cairn.testing.memory.forks import _Forks
from cairn.testing.memory.maintenance import _Maintenance
from cairn.testing.memory.runs import _Runs
from cairn.testing.memory.schedules import MemorySchedules


class MemoryStore(_Runs, _Admin, _Forks, _Maintenance):
    """CheckpointStore in dicts under one lock, with the SQL's semantics; `clock` (seconds,
    as time.time) stands for Postgres's now(), so a test can move time. Give it to
    cairn.Client(store=...) to drive the real Client without a service
    (cairn.testing.LocalWorker runs what it enqueues)."""

    def __init__(self, clock: Clock = time.time) -> None:
        super().__init__(clock)
        self._schedules = MemorySchedules(self)
        self._approvals = MemoryApprovals(self)

    def schedule_store(self) -> MemorySchedules:
        """The schedules kept beside these runs."""
        return self._schedules

    def approval_store(self) -> MemoryApprovals:
        """The approvals, their audit and the standing rules beside these runs."""
        return self._approvals
