"""MemorySchedules: the schedules beside a MemoryStore, as store/sql/schedules.sql
keeps them."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from cairn.store.schedules import Schedule
from cairn.testing.memory.rows import _dump

if TYPE_CHECKING:
    from cairn.testing.memory.store import MemoryStore


class MemorySchedules:
    """Schedules in a dict, beside a MemoryStore (a fired tick's runs are created in it),
    as store/sql/schedules.sql keeps them: MemoryStore.schedule_store() gives it."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._rows: dict[str, Schedule] = {}

    def add(self, schedule: Schedule, *, replace: bool = False) -> Schedule | None:
        """Insert (or with replace, overwrite) the schedule; None if the name was taken.
        Replaced, it keeps its paused state, and its next tick if the timing is the same."""
        data = json.loads(_dump(dict(schedule.input)))  # a copy, as jsonb keeps it
        with self._store._lock:
            old = self._rows.get(schedule.name)
            if old is not None and not replace:
                return None
            if old is None:
                new = dataclasses.replace(
                    schedule,
                    input=data,
                    paused=False,
                    last_fired_at=None,
                    created_at=self._store._stamp(),
                )
            else:
                same = (old.cron, old.every) == (schedule.cron, schedule.every)
                new = dataclasses.replace(
                    old,
                    workflow=schedule.workflow,
                    input=data,
                    catch_up=schedule.catch_up,
                    cron=schedule.cron,
                    every=schedule.every,
                    next_at=old.next_at if same else schedule.next_at,
                )
            self._rows[schedule.name] = new
            return new

    def get(self, name: str) -> Schedule | None:
        """The schedule of that name, or None."""
        with self._store._lock:
            return self._rows.get(name)

    def list_schedules(self) -> list[Schedule]:
        """Every schedule, by name."""
        with self._store._lock:
            return [self._rows[n] for n in sorted(self._rows)]

    def pause(self, name: str) -> Schedule | None:
        """Stop firing it; None: no such schedule."""
        with self._store._lock:
            return self._set(name, paused=True)

    def resume(self, current: Schedule, next_at: dt.datetime) -> Schedule | None:
        """Unpause at next_at; None if it was not paused, or its timing is not current's
        (replaced meanwhile)."""
        with self._store._lock:
            row = self._rows.get(current.name)
            if (
                row is None
                or not row.paused
                or (row.cron, row.every) != (current.cron, current.every)
            ):
                return None
            return self._set(current.name, paused=False, next_at=next_at)

    def remove(self, name: str) -> bool:
        """Delete it; False if there was none."""
        with self._store._lock:
            return self._rows.pop(name, None) is not None

    def due(self, now: dt.datetime, limit: int) -> list[Schedule]:
        """The active schedules whose next tick has come, oldest first."""
        with self._store._lock:
            found = [s for s in self._rows.values() if not s.paused and s.next_at <= now]
        return sorted(found, key=lambda s: (s.next_at, s.name))[:limit]

    def fire(
        self,
        schedule: Schedule,
        next_at: dt.datetime,
        runs: Sequence[tuple[str, dt.datetime]],
        *,
        before_commit: Callable[[], None] | None = None,
    ) -> list[str] | None:
        """Move next_at from the tick the schedule was read at (a compare-and-set) and
        create the runs, at once; the run ids created (an existing one is left as it is),
        or None if next_at had moved, or it was paused or removed. before_commit raising
        leaves nothing, as a rolled-back transaction does."""
        fired = max((tick for _, tick in runs), default=None)
        store = self._store
        with store._lock:
            row = self._rows.get(schedule.name)
            if row is None or row.paused or row.next_at != schedule.next_at:
                return None
            if before_commit is not None:
                before_commit()
            self._set(row.name, next_at=next_at, last_fired_at=fired or row.last_fired_at)
            created = []
            for run_id, _ in runs:
                if run_id not in store._rows:
                    store._new_row(run_id, row.workflow, _dump(dict(row.input)), store._stamp())
                    created.append(run_id)
            return created

    def _set(self, name: str, **changes: Any) -> Schedule | None:
        row = self._rows.get(name)
        if row is None:
            return None
        self._rows[name] = dataclasses.replace(row, **changes)
        return self._rows[name]
