"""Schedules in Postgres: their rows, and the one transaction that fires a tick.

A tick fires in one transaction: the compare-and-set that moves next_at from the tick the
firer read (advance_schedule), then the tick's runs, each inserted with the store's own
create_run (ON CONFLICT DO NOTHING). Two firers at once: the second's compare-and-set
finds next_at moved and it creates nothing. A firer killed before the commit leaves
nothing, and the tick is fired again by the next pass; one killed after it leaves runs
that were never sent, which the reaper's lost-message pass sends (CAIRN_LOST_AFTER).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cairn.core.records import CHECKPOINT_VERSION, START
from cairn.store.db import Database
from cairn.store.payloads import Payload
from cairn.store.sql import QUERIES as RUN_QUERIES
from cairn.store.sql import _parse, sql_text

QUERIES = _parse(sql_text("schedules.sql"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Schedule:
    """A workflow started on a clock, one run per tick.

    cron: a cron expression in UTC (five fields, or six with seconds first), or every: an
    interval in seconds (ticks at whole multiples of it since the Unix epoch); one of the
    two. catch_up: what a firer that was away does with the ticks it missed: "latest" fires
    the most recent one, "all" each of them (100 a pass), "skip" none. next_at: the tick
    to fire next. last_fired_at: the tick of the last run it started (None: none yet).
    """

    name: str
    workflow: str
    input: Mapping[str, Any]
    cron: str | None
    every: int | None
    catch_up: str
    paused: bool
    next_at: dt.datetime
    last_fired_at: dt.datetime | None = None
    created_at: dt.datetime | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Schedule:
        values = {k: v for k, v in row.items() if k != "every_seconds"}
        for key in ("next_at", "last_fired_at", "created_at"):  # in UTC, as cron reads them
            values[key] = values[key] and values[key].astimezone(dt.UTC)
        return cls(**values, every=row["every_seconds"])

    def params(self) -> dict[str, Any]:
        """The named queries' parameters for this schedule."""
        return {
            "name": self.name,
            "workflow": self.workflow,
            "input": Payload(dict(self.input)),
            "cron": self.cron,
            "every": self.every,
            "catch_up": self.catch_up,
            "next_at": self.next_at,
        }

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (times as ISO 8601)."""
        out = dataclasses.asdict(self)
        out["input"] = dict(self.input)
        for key in ("next_at", "last_fired_at", "created_at"):
            out[key] = out[key] and out[key].isoformat()
        return out


class ScheduleStore:
    """Schedules (store/contract.py) in the schedules table, over a cairn Database (a
    worker's, or a Client's: PgStore.schedule_store())."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def _run(self, name: str, params: dict[str, Any], many: bool = False) -> Any:
        def attempt() -> Any:
            with self.db.connection() as conn:
                cur = conn.execute(QUERIES[name], params)
                return cur.fetchall() if many else cur.fetchone()

        return self.db.retry(attempt)

    def add(self, schedule: Schedule, *, replace: bool = False) -> Schedule | None:
        """Insert (or with replace, overwrite) the schedule; None if the name was taken."""
        row = self._run("replace_schedule" if replace else "add_schedule", schedule.params())
        return Schedule.from_row(row) if row else None

    def get(self, name: str) -> Schedule | None:
        row = self._run("get_schedule", {"name": name})
        return Schedule.from_row(row) if row else None

    def list_schedules(self) -> list[Schedule]:
        return [Schedule.from_row(r) for r in self._run("list_schedules", {}, many=True)]

    def pause(self, name: str) -> Schedule | None:
        row = self._run("pause_schedule", {"name": name})
        return Schedule.from_row(row) if row else None

    def resume(self, current: Schedule, next_at: dt.datetime) -> Schedule | None:
        """Unpause at next_at; None if it was not paused (or was replaced meanwhile)."""
        row = self._run("resume_schedule", {**current.params(), "next_at": next_at})
        return Schedule.from_row(row) if row else None

    def remove(self, name: str) -> bool:
        return self._run("remove_schedule", {"name": name}) is not None

    def due(self, now: dt.datetime, limit: int) -> list[Schedule]:
        rows = self._run("due_schedules", {"now": now, "limit": limit}, many=True)
        return [Schedule.from_row(r) for r in rows]

    def fire(
        self,
        schedule: Schedule,
        next_at: dt.datetime,
        runs: Sequence[tuple[str, dt.datetime]],
        *,
        before_commit: Callable[[], None] | None = None,
    ) -> list[str] | None:
        """Move the schedule's next_at from the tick it was read at to next_at, and create
        runs ((run_id, tick) pairs), in one transaction. Returns the run ids created, or
        None if next_at had moved (another firer fired it; or it was paused, replaced or
        removed). before_commit: a test's fault point."""
        fired = max((tick for _, tick in runs), default=None)
        advance = {"name": schedule.name, "seen": schedule.next_at, "next_at": next_at}

        def attempt() -> list[str] | None:
            created = []
            with self.db.connection() as conn, conn.transaction():
                row = conn.execute(
                    QUERIES["advance_schedule"], {**advance, "fired": fired}
                ).fetchone()
                if row is None:
                    return None
                for run_id, _ in runs:
                    new = conn.execute(
                        RUN_QUERIES["create_run"],
                        {
                            "run_id": run_id,
                            "workflow": row["workflow"],
                            "input": Payload(row["input"]),
                            "cursor": START,
                            "state": Payload({}),
                            "version": CHECKPOINT_VERSION,
                            "max_cost_usd": None,
                            "priority": 0,
                            "traceparent": None,
                            "tenant": None,  # a schedule's runs are no tenant's
                            "budgets": None,
                        },
                    ).fetchone()
                    if new is not None:  # else the id exists: the schedule was re-added
                        created.append(run_id)
                if before_commit is not None:
                    before_commit()
            return created

        return self.db.retry(attempt)
