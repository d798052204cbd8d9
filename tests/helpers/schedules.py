"""The runs a schedule fired, as the schedule tests read them: their ids name their ticks
(sched:NAME:YYYYmmddTHHMMSSZ)."""

from __future__ import annotations

import datetime as dt
import itertools

SECOND = dt.timedelta(seconds=1)


def fired(sql, name: str) -> list[str]:
    """The ids of the runs schedule name fired, in order."""
    return [
        r
        for (r,) in sql(
            "SELECT run_id FROM runs WHERE run_id LIKE %s ORDER BY 1", f"sched:{name}:%"
        )
    ]


def ticks_of(ids: list[str]) -> list[dt.datetime]:
    return [
        dt.datetime.strptime(i.rsplit(":", 1)[1], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
        for i in ids
    ]


def contiguous(ids: list[str], step: dt.timedelta = SECOND) -> bool:
    return all(b - a == step for a, b in itertools.pairwise(ticks_of(ids)))
