"""A Client's schedules: a workflow started on a clock, one run per tick, fired by beat
(cairn.workers.schedules). A schedule has no tenant: each of these is an admin's
(cairn.client.tenancy)."""

from __future__ import annotations

import builtins
from typing import Any

from cairn.client.base import ClientBase
from cairn.client.checks import checked_schedule, known, now
from cairn.store.schedules import Schedule
from cairn.workers import schedules as sched


class Schedules(ClientBase):
    """Client's schedules."""

    def add_schedule(
        self,
        name: str,
        workflow: str,
        input: dict[str, Any] | None = None,
        *,
        cron: str | None = None,
        every: int | None = None,
        catch_up: str = "latest",
        replace: bool = False,
    ) -> Schedule:
        """Start `workflow` with `input` on a clock, one run per tick, whose id is
        `sched:<name>:<UTC tick>` (e.g. sched:nightly:20261204T030000Z).

        Args:
            name: 1-100 letters, digits and . _ -.
            cron: a cron expression in UTC ("0 3 * * *"); or every: seconds between ticks
                (at whole multiples of it since the Unix epoch). One of the two.
            catch_up: the ticks missed while no firer ran: "latest" fires the most recent,
                "all" each of them (100 per pass), "skip" none.
            replace: overwrite a schedule of that name (it keeps its paused state, and its
                next tick if the timing is unchanged).

        Returns:
            The schedule stored. Adding the same definition again returns it as it is.

        Raises:
            InvalidInput: a bad name, cron, interval, catch_up or input; nothing written.
            ScheduleConflict: the name holds another definition and replace is False.
            Forbidden (an InvalidInput): a Client with a tenant, as for every schedule
                operation (an admin's).
        """
        wanted = checked_schedule(self.settings, name, workflow, input, cron, every, catch_up)
        store = self.store.schedule_store()
        stored = store.add(wanted, replace=replace)
        return sched.added(wanted, stored, None if stored else store.get(name))

    def schedules(self) -> builtins.list[Schedule]:
        """Every schedule, by name. Raises Forbidden for a Client with a tenant."""
        return self.store.schedule_store().list_schedules()

    def pause_schedule(self, name: str) -> Schedule:
        """Stop firing the schedule until resumed. Raises UnknownSchedule, or Forbidden for
        a Client with a tenant."""
        return known(name, self.store.schedule_store().pause(name))

    def resume_schedule(self, name: str) -> Schedule:
        """Fire the schedule again from its next tick after now (ticks while it was
        paused are not fired). Resuming an active schedule changes nothing. Raises
        UnknownSchedule, or Forbidden for a Client with a tenant."""
        store = self.store.schedule_store()
        current = known(name, store.get(name))
        resumed = store.resume(current, sched.timing(current).after(now()))
        return resumed or known(name, store.get(name))

    def remove_schedule(self, name: str) -> bool:
        """Delete the schedule (its runs stay); False if there was none. Raises Forbidden
        for a Client with a tenant."""
        return self.store.schedule_store().remove(name)
