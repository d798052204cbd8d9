"""The pages: a runs table with counts by status, and a run with its step timeline.

Server-rendered (Jinja2). The live part of each page is one template that the page's
script fetches again with ?partial=1 every second while something can still change, so
there is one renderer, no client-side templates and no build step. The run page's Live
panel is the exception, outside that part: its script follows GET /runs/{id}/events and
shows model text token by token, which a refresh every second could not.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from cairn.core import logs
from cairn.core.records import Run
from cairn.core.status import STOPPED, RunStatus
from cairn.web.api import COOKIE

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
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


def _usd(value: float | None) -> str:
    if not value:
        return "$0"
    return f"${value:.4f}" if value < 1 else f"${value:,.2f}"


templates.env.filters.update(seconds=_seconds, when=_when, usd=_usd)
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


def timeline(run: Run, steps: list[dict[str, Any]], now: dt.datetime) -> dict[str, Any]:
    """Bars and gaps laid out on one lane per worker, and the rows of the step table with
    each resume marked where it happened."""
    start = run.created_at
    end: dt.datetime = max([run.updated_at, *(s["ended_at"] for s in steps)])
    if run.status not in STOPPED:
        end = max(end, now)
    span = max((end - start).total_seconds(), 1e-3)

    def pct(t: dt.datetime) -> float:
        return round(100 * (t - start).total_seconds() / span, 3)

    lanes: list[str] = []
    bars: list[Bar] = []
    gaps: list[Gap] = []
    rows: list[dict[str, Any]] = []
    previous: dict[str, Any] | None = None
    for s in steps:
        if s["worker"] not in lanes:
            lanes.append(s["worker"])
        lane = lanes.index(s["worker"])
        seconds = (s["ended_at"] - s["started_at"]).total_seconds()
        gap_from = previous["ended_at"] if previous else start
        gap = (s["started_at"] - gap_from).total_seconds()
        resumed = previous is not None and (
            s["worker"] != previous["worker"] or s["epoch"] != previous["epoch"]
        )
        kind = None
        if resumed:
            kind = "resume"
            what = f"resumed by {s['worker']} (epoch {s['epoch']}) after {_seconds(gap)}"
        elif previous is not None and previous["outcome"] == "retry":
            kind = "retry"
            what = f"retried after {_seconds(gap)}"
        elif previous is not None and gap >= PAUSE:
            kind = "pause"
            what = f"{_seconds(gap)} between steps (queued, waiting for a signal or deferred)"
        if kind is not None:
            gaps.append(Gap(pct(gap_from), max(pct(s["started_at"]) - pct(gap_from), 0.2), lane,
                            kind, what))  # fmt: skip
            rows.append({"gap": kind, "text": what})
        cost = s["cost_usd"] or 0.0
        title = f"#{s['seq']} {s['cursor']} (visit {s['visit']}): {s['outcome']}, " + _seconds(
            seconds
        )
        bars.append(
            Bar(pct(s["started_at"]), max(pct(s["ended_at"]) - pct(s["started_at"]), 0.15),
                lane, s["outcome"], f"{title} on {s['worker']}, {_usd(cost)}")
        )  # fmt: skip
        rows.append({**s, "seconds": seconds, "lane": lane})
        previous = s
    if (
        run.status not in STOPPED
        and previous is not None
        and (now - previous["ended_at"]).total_seconds() > 0
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
        "retries": sum(1 for s in steps if s["outcome"] == "retry"),
    }


def mount(app: FastAPI) -> None:
    """Add the pages and their static files to the API's app."""
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    @app.get("/", include_in_schema=False)
    def home() -> RedirectResponse:
        return RedirectResponse("/ui/runs", status_code=303)

    @app.get("/login", include_in_schema=False)
    def login_form(request: Request, next: str = "/ui/runs", failed: bool = False) -> Response:
        return templates.TemplateResponse(
            request, "login.html", {"next": _local(next), "failed": failed}
        )

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        form = parse_qs((await request.body()).decode(errors="replace"))
        target = _local(form.get("next", ["/ui/runs"])[0])
        session = request.app.state.auth.login(form.get("token", [""])[0])
        if session is None:
            return RedirectResponse(
                f"/login?{urlencode({'next': target, 'failed': 1})}", status_code=303
            )
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, session, httponly=True, samesite="strict")
        return response

    @app.get("/logout", include_in_schema=False)
    def logout() -> Response:
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE)
        return response

    @app.get("/ui/runs", include_in_schema=False)
    def runs_page(
        request: Request,
        status: str | None = None,
        workflow: str | None = None,
        cursor: str | None = None,
        partial: bool = False,
    ) -> HTMLResponse:
        client = request.app.state.client
        status = RunStatus(status) if status in STATUSES else None
        workflow = workflow or None
        limit = 50
        runs = client.list(status, limit, workflow=workflow, after=cursor)
        counts = client.counts()
        context = {
            "runs": runs,
            "counts": counts,
            "total": sum(counts.values()),
            "statuses": STATUSES,
            "status": status,
            "workflow": workflow or "",
            "cursor": cursor,
            "next_cursor": runs[-1].run_id if len(runs) == limit else None,
            "query": lambda **kw: _query(**{"status": status, "workflow": workflow, **kw}),
            # Only the first page moves: later pages would shift under the reader.
            "live": cursor is None,
        }
        name = "_runs_live.html" if partial else "runs.html"
        return templates.TemplateResponse(request, name, context)

    @app.get("/ui/runs/{run_id}", include_in_schema=False)
    def run_page(request: Request, run_id: str, partial: bool = False) -> HTMLResponse:
        client = request.app.state.client
        run = client.get(run_id)
        if run is None:
            return templates.TemplateResponse(
                request, "missing.html", {"run_id": run_id}, status_code=404
            )
        steps = client.history(run_id)
        now = dt.datetime.now(dt.UTC)
        # A run enqueued untraced has the trace its traced deliveries derive from its id.
        trace_id = logs.trace_id_of(run.traceparent) or f"{logs.run_trace(run.run_id)[0]:032x}"
        context = {
            "run": run,
            "steps": steps,
            "calls": [_call_row(c) for c in client.calls(run_id)],
            "children": client.children(run_id),
            "forks": client.forks(run_id),
            "line": timeline(run, steps, now),
            "live": run.status not in STOPPED,
            "took": ((run.updated_at if run.status in STOPPED else now) - run.created_at),
            "state_json": json.dumps(run.state, indent=2, default=str),
            "input_json": json.dumps(run.input, indent=2, default=str),
            "trace_id": trace_id,
            "trace_url": trace_url(request.app.state.settings.trace_url_template, trace_id),
        }
        name = "_run_live.html" if partial else "run.html"
        return templates.TemplateResponse(request, name, context)


def trace_url(template: str | None, trace_id: str | None) -> str | None:
    """A trace in the tracing UI (CAIRN_TRACE_URL_TEMPLATE), or None: no template, or a
    run enqueued without tracing (no trace id)."""
    if template is None or trace_id is None:
        return None
    # replace, not format: a URL may hold other braces (a query in JSON)
    return template.replace("{trace_id}", trace_id)


def _call_row(call: dict[str, Any]) -> dict[str, Any]:
    """A journaled call as the run page lists it: its outcome cut to one line."""
    outcome = call["error"] if call["error"] is not None else call["result"]
    text = json.dumps(outcome, default=str)
    return {**call, "outcome": text if len(text) <= 240 else text[:239] + "…"}


def _local(target: str) -> str:
    """Only a path on this server: a login must not bounce the browser elsewhere."""
    return target if target.startswith("/") and not target.startswith("//") else "/ui/runs"


def _query(**params: Any) -> str:
    return urlencode({k: v for k, v in params.items() if v})
