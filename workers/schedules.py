"""Schedules: a workflow started on a clock (cron or a fixed interval), one run per tick.

The firer runs in beat's process on a thread of its own (every CAIRN_SCHEDULE_TICK
seconds, like the reaper: cairn.workers.control). Each pass fires the due schedules, each in one
transaction (ScheduleStore.fire): exactly one run per tick however many firers run at
once (two `cairn beat`s) and wherever one is killed, because

1. a tick's run id is the schedule's name and the tick's time (`sched:<name>:<UTC tick>`),
   and a run id is created once (ON CONFLICT DO NOTHING);
2. next_at moves only by a compare-and-set from the tick the firer read, in the same
   transaction as the runs: a firer that lost the race creates nothing;
3. a run is sent after the commit: a firer killed between the two leaves a run with no
   message, which the reaper's lost-message pass sends.

Times are the firers' clocks in UTC: a skew between two beat hosts moves when a tick
fires, never how many times.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from cronsim import CronSim, CronSimError

from cairn.core import logs
from cairn.core.errors import CairnError, InvalidInput
from cairn.core.inputs import check_input
from cairn.steps import registry
from cairn.store.schedules import Schedule, ScheduleStore

logger = logging.getLogger(__name__)

FIRE_TASK = "cairn.schedules.fire"
CATCH_UP = ("latest", "all", "skip")
# Ticks one schedule fires in one pass with catch_up="all": a long outage is caught up
# over several passes, and no pass holds a transaction open for long.
MAX_CATCH_UP = 100
# Due schedules fired in one pass; the rest are fired by the next, a tick later.
DUE_PAGE = 500
# A tick reached more than this after its time was missed (no firer ran), and its
# schedule's catch_up decides; one reached sooner is on time, whatever the policy, so a
# pass that comes a little late (beat's jitter, a busy worker) drops no tick. The app
# makes it at least 3 passes (CAIRN_SCHEDULE_TICK).
GRACE = 10.0
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class UnknownSchedule(CairnError):
    """No schedule has that name."""


class ScheduleConflict(CairnError):
    """A schedule of that name exists with another definition (add it with replace=True)."""


def run_id(name: str, tick: dt.datetime) -> str:
    """The run a schedule starts at a tick: `sched:<name>:<UTC tick as 20261204T150000Z>`."""
    return f"sched:{name}:{tick.astimezone(dt.UTC):%Y%m%dT%H%M%SZ}"


@dataclasses.dataclass(frozen=True)
class Timing:
    """A schedule's ticks: a cron expression's times, or every `every` seconds."""

    cron: str | None
    every: int | None

    def after(self, t: dt.datetime) -> dt.datetime:
        """The first tick strictly after t."""
        if self.every is not None:
            return _whole(self.every * (math.floor(_seconds(t) / self.every) + 1))
        return next(CronSim(self.cron or "", t.astimezone(dt.UTC)))

    def latest(self, t: dt.datetime) -> dt.datetime:
        """The last tick at or before t."""
        if self.every is not None:
            return _whole(self.every * math.floor(_seconds(t) / self.every))
        # Reverse from just past t's whole second: that second is itself a candidate.
        start = t.astimezone(dt.UTC).replace(microsecond=0) + dt.timedelta(microseconds=1)
        return next(CronSim(self.cron or "", start, reverse=True))


def _seconds(t: dt.datetime) -> float:
    return (t - EPOCH).total_seconds()


def _whole(seconds: int) -> dt.datetime:
    return EPOCH + dt.timedelta(seconds=seconds)


def timing(s: Schedule) -> Timing:
    return Timing(s.cron, s.every)


def checked(
    name: Any,
    workflow: Any,
    input: Mapping[str, Any] | None,
    *,
    cron: Any,
    every: Any,
    catch_up: Any,
    max_input_bytes: int,
    now: dt.datetime,
) -> Schedule:
    """The schedule to add, with its first tick after now; InvalidInput naming what to
    fix, before anything is written."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidInput(
            f"schedule name {name!r} is not valid: use 1-100 letters, digits and . _ -, "
            "starting with a letter or digit"
        )
    if not isinstance(workflow, str) or not 1 <= len(workflow) <= 200:
        raise InvalidInput("workflow must be a workflow's name")
    data = check_input({} if input is None else dict(input), max_input_bytes)
    flow = registry.find(workflow)
    if flow is not None:  # registered here: a bad input fails now, not at every tick
        data = flow.validate(data)
    if catch_up not in CATCH_UP:
        raise InvalidInput(f"catch_up {catch_up!r} is not one of {', '.join(CATCH_UP)}")
    if (cron is None) == (every is None):
        raise InvalidInput(
            "give a schedule cron= (e.g. '0 3 * * *') or every= (seconds), one of the two"
        )
    if every is not None:
        whole = isinstance(every, int) or (isinstance(every, float) and every.is_integer())
        if isinstance(every, bool) or not whole:
            raise InvalidInput(f"every={every!r}: give a whole number of seconds")
        if not 1 <= every < 2**31:
            raise InvalidInput(f"every={every!r}: give at least 1 second")
        every = int(every)
    if cron is not None:
        if not isinstance(cron, str) or len(cron) > 200:
            raise InvalidInput("cron must be a cron expression such as '0 3 * * *'")
        try:
            CronSim(cron, now)
        except CronSimError as exc:
            raise InvalidInput(
                f"cron {cron!r}: {exc}; give five fields (minute hour day-of-month month "
                "day-of-week, in UTC), e.g. '0 3 * * *', or six with seconds first"
            ) from None
    t = Timing(cron, every)
    try:
        next_at = t.after(now)
    except StopIteration:  # a valid expression whose every time is past (a year's end)
        raise InvalidInput(f"cron {cron!r} has no time after now") from None
    return Schedule(
        name=name,
        workflow=workflow,
        input=data,
        cron=cron,
        every=every,
        catch_up=catch_up,
        paused=False,
        next_at=next_at,
    )


def added(wanted: Schedule, stored: Schedule | None, existing: Schedule | None) -> Schedule:
    """What add_schedule returns: the schedule stored, or the same one found (an add
    retried); ScheduleConflict for another definition under the name."""
    if stored is not None:
        return stored
    if existing is None:  # removed between the insert and the read: rare; say so
        raise ScheduleConflict(f"schedule {wanted.name!r} changed meanwhile; add it again")
    keys = ("workflow", "input", "cron", "every", "catch_up")
    if all(getattr(existing, k) == getattr(wanted, k) for k in keys):
        return existing
    raise ScheduleConflict(
        f"schedule {wanted.name!r} exists with another definition: remove it first, or add "
        "it with replace=True (`--replace`)"
    )


def plan(
    s: Schedule, now: dt.datetime, grace: float = GRACE
) -> tuple[list[dt.datetime], dt.datetime]:
    """The ticks a due schedule fires now (at most MAX_CATCH_UP), and its next_at after
    them. Ticks up to `grace` old are on time; older ones were missed: "all" fires them,
    "latest" only the last of them, "skip" none."""
    t = timing(s)
    ticks: list[dt.datetime] = []
    tick = s.next_at
    cutoff = now - dt.timedelta(seconds=grace)
    if s.catch_up != "all" and tick <= cutoff:
        missed = t.latest(cutoff)
        ticks = [missed] if s.catch_up == "latest" else []
        tick = t.after(missed)
    while tick <= now and len(ticks) < MAX_CATCH_UP:
        ticks.append(tick)
        tick = t.after(tick)
    return ticks, tick


@dataclasses.dataclass(frozen=True, kw_only=True)
class Firer:
    """One pass fires every due schedule and sends the runs it created through `send`.

    hook(point) is called at "created" (the runs inserted, not committed) and "committed"
    (not sent yet): the crash tests' fault points.
    """

    store: ScheduleStore
    send: Callable[[str], None]
    grace: float = GRACE
    hook: Callable[[str], None] | None = None

    def fire(self, now: dt.datetime | None = None) -> list[str]:
        """One pass; returns the run ids this pass created (and sent)."""
        now = now or dt.datetime.now(dt.UTC)
        created: list[str] = []
        for s in self.store.due(now, DUE_PAGE):
            ticks, next_at = plan(s, now, self.grace)
            runs = [(run_id(s.name, tick), tick) for tick in ticks]
            made = self.store.fire(s, next_at, runs, before_commit=self._at("created"))
            if made is None:
                continue  # another firer moved it first, or it was paused or replaced
            if self.hook is not None:
                self.hook("committed")
            for rid in made:
                self.send(rid)
            if made:
                logger.info(
                    "schedule %s: started %s%s; next at %s",
                    s.name,
                    made[0],
                    f" and {len(made) - 1} more" if len(made) > 1 else "",
                    next_at.isoformat(),
                    extra=logs.run(None, "schedule", schedule=s.name, runs=made),
                )
            elif not ticks:
                logger.info(
                    "schedule %s: missed ticks not fired (catch_up=%s); next at %s",
                    s.name,
                    s.catch_up,
                    next_at.isoformat(),
                    extra=logs.run(None, "schedule_skip", schedule=s.name),
                )
            created += made
        return created

    def _at(self, point: str) -> Callable[[], None] | None:
        hook = self.hook
        return None if hook is None else lambda: hook(point)
