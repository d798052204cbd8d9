"""What the pages show, worked out: the Jinja2 templates with their filters, the run's
timeline laid out, a call's outcome cut to a line (the routes are cairn.web.routers.pages).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import Request
from fastapi.templating import Jinja2Templates

from cairn.core.records import CallRecord, Run, StepRecord
from cairn.core.status import STOPPED, RunStatus

HERE = Path(__file__).parent
STATIC = HERE / "static"  # the pages' CSS and JS, served at /static


def _session(request: Request) -> dict[str, Any]:
    """What every page gets from the guard: the logout button's check (a session's
    pages only: a bearer token has no session to end)."""
    return {"logout_check": request.scope.get("state", {}).get("logout_check")}


templates = Jinja2Templates(directory=HERE / "templates", context_processors=[_session])
STATUSES = tuple(RunStatus)
# A gap between two steps longer than this, on the same worker, is drawn as a pause.
PAUSE = 1.0


def _seconds(value: float | None) -> str:
    if value is None:
        return ""
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 120:
        return f"{minutes} m {secs} s"
    return f"{minutes // 60} h {minutes % 60} m"


def _when(value: dt.datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else ""


def _utc(value: dt.datetime | None) -> str:
    """A UTC day's or month's start (a tenant budget's period) as UTC, not local time."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC") if value else "—"


def _usd(value: float | None) -> str:
    if not value:
        return "$0"
    return f"${value:.4f}" if value < 1 else f"${value:,.2f}"


def _segment(value: object) -> str:
    """One path segment or query value: every byte a URL would read otherwise (/ . ? #
    & %) encoded, so a run id holding "/../" names that run, never a path above it.
    Jinja's own urlencode keeps "/"."""
    return quote(str(value), safe="")


templates.env.filters.update(seconds=_seconds, when=_when, usd=_usd, utc=_utc, segment=_segment)
templates.env.globals.update(STOPPED=STOPPED, RunStatus=RunStatus)


@dataclasses.dataclass
class Bar:
    """One step attempt on the timeline: a left offset and a width in % of the run."""

    left: float
    width: float
    lane: int
    outcome: str
    title: str


@dataclasses.dataclass
class Gap:
    """Time between two steps: a resume (a new owner took over), a wait or a pause."""

    left: float
    width: float
    lane: int
    kind: str
    title: str


def timeline(run: Run, steps: list[StepRecord], now: dt.datetime) -> dict[str, Any]:
    """Bars and gaps laid out on one lane per worker, and the rows of the step table with
    each resume marked where it happened."""
    start = run.created_at
    end: dt.datetime = max([run.updated_at, *(s.ended_at for s in steps)])
    if run.status not in STOPPED:
        end = max(end, now)
    span = max((end - start).total_seconds(), 1e-3)

    def pct(t: dt.datetime) -> float:
        return round(100 * (t - start).total_seconds() / span, 3)

    lanes: list[str | None] = []
    bars: list[Bar] = []
    gaps: list[Gap] = []
    rows: list[dict[str, Any]] = []
    previous: StepRecord | None = None
    for s in steps:
        if s.worker not in lanes:
            lanes.append(s.worker)
        lane = lanes.index(s.worker)
        seconds = (s.ended_at - s.started_at).total_seconds()
        gap_from = previous.ended_at if previous else start
        gap = (s.started_at - gap_from).total_seconds()
        resumed = previous is not None and (
            s.worker != previous.worker or s.epoch != previous.epoch
        )
        kind = None
        if resumed:
            kind = "resume"
            what = f"resumed by {s.worker} (epoch {s.epoch}) after {_seconds(gap)}"
        elif previous is not None and previous.outcome == "retry":
            kind = "retry"
            what = f"retried after {_seconds(gap)}"
        elif previous is not None and gap >= PAUSE:
            kind = "pause"
            what = f"{_seconds(gap)} between steps (queued, waiting for a signal or deferred)"
        if kind is not None:
            gaps.append(Gap(pct(gap_from), max(pct(s.started_at) - pct(gap_from), 0.2), lane,
                            kind, what))  # fmt: skip
            rows.append({"gap": kind, "text": what})
        cost = s.cost_usd or 0.0
        title = f"#{s.seq} {s.cursor} (visit {s.visit}): {s.outcome}, " + _seconds(seconds)
        bars.append(
            Bar(pct(s.started_at), max(pct(s.ended_at) - pct(s.started_at), 0.15),
                lane, s.outcome, f"{title} on {s.worker}, {_usd(cost)}")
        )  # fmt: skip
        rows.append({**dataclasses.asdict(s), "seconds": seconds, "lane": lane})
        previous = s
    if (
        run.status not in STOPPED
        and previous is not None
        and (now - previous.ended_at).total_seconds() > 0
    ):
        rows.append({"gap": "now", "text": f"{run.status} at {run.cursor or 'its first step'}"})
    ticks = [
        {"left": round(100 * i / 4, 1), "label": _seconds(span * i / 4) if i else "0"}
        for i in range(5)
    ]
    return {
        "lanes": lanes or ["(no steps yet)"],
        "bars": bars,
        "gaps": gaps,
        "rows": rows,
        "span": span,
        "ticks": ticks,
        "resumes": sum(1 for g in gaps if g.kind == "resume"),
        "retries": sum(1 for s in steps if s.outcome == "retry"),
    }


def trace_url(template: str | None, trace_id: str | None) -> str | None:
    """A trace in the tracing UI (CAIRN_TRACE_URL_TEMPLATE), or None: no template, or a
    run enqueued without tracing (no trace id)."""
    if template is None or trace_id is None:
        return None
    # replace, not format: a URL may hold other braces (a query in JSON)
    return template.replace("{trace_id}", trace_id)


def call_row(call: CallRecord) -> dict[str, Any]:
    """A journaled call as the run page lists it: its outcome cut to one line."""
    outcome = call.error if call.error is not None else call.result
    text = json.dumps(outcome, default=str)
    return {**dataclasses.asdict(call), "outcome": text if len(text) <= 240 else text[:239] + "…"}
