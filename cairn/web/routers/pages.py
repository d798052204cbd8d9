"""The pages: a runs table with counts by status, a run with its step timeline, the
approvals waiting across runs, and the login that turns the API token into a page session. Not in the OpenAPI document.

Server-rendered (Jinja2, cairn.web.render). The live part of each page is one template
that the page's script fetches again with ?partial=1 every second while something can
still change, so there is one renderer, no client-side templates and no build step. The
run page's Live panel is the exception, outside that part: its script follows GET
/runs/{id}/events and shows model text token by token, which a refresh every second
could not.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from cairn.core import logs
from cairn.core.errors import UnknownBudget
from cairn.core.inputs import TENANT
from cairn.core.records import Approval, Budget
from cairn.core.status import STOPPED, RunStatus
from cairn.web.auth import COOKIE
from cairn.web.deps import AuthDep, ClientDep, ReadsDep, SettingsDep
from cairn.web.reads import Reads
from cairn.web.render import STATUSES, call_row, templates, timeline, trace_url

router = APIRouter(include_in_schema=False)


@router.get("/")
def home() -> RedirectResponse:
    return RedirectResponse("/ui/runs", status_code=303)


@router.get("/login")
def login_form(request: Request, next: str = "/ui/runs", failed: bool = False) -> Response:
    return templates.TemplateResponse(
        request, "login.html", {"next": _local(next), "failed": failed}
    )


@router.post("/login")
async def login(request: Request, auth: AuthDep) -> Response:
    form = parse_qs((await request.body()).decode(errors="replace"))
    target = _local(form.get("next", ["/ui/runs"])[0])
    session = await auth.login(form.get("token", [""])[0])
    if session is None:
        return RedirectResponse(
            f"/login?{urlencode({'next': target, 'failed': 1})}", status_code=303
        )
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(COOKIE, session, httponly=True, samesite="strict")
    return response


@router.get("/logout")
def logout() -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE)
    return response


@router.get("/ui/runs")
def runs_page(
    request: Request,
    reads: ReadsDep,
    status: str | None = None,
    workflow: str | None = None,
    tenant: str | None = None,
    cursor: str | None = None,
    partial: bool = False,
) -> HTMLResponse:
    status = RunStatus(status) if status in STATUSES else None
    workflow = workflow or None
    # A filter by tenant (an admin's; a tenant's session sees its own runs whatever it asks).
    tenant = tenant if tenant and TENANT.fullmatch(tenant) else None
    if tenant is not None and reads.primary.tenant is None:
        reads = reads.for_tenant(tenant)
    limit = 50
    runs = reads.list(status, limit, workflow=workflow, after=cursor)
    counts = reads.counts()
    context = {
        "runs": runs,
        "counts": counts,
        "budget": _tenant_budget(reads, tenant),
        "total": sum(counts.values()),
        "statuses": STATUSES,
        "status": status,
        "workflow": workflow or "",
        "tenant": tenant or "",
        "cursor": cursor,
        "next_cursor": runs[-1].run_id if len(runs) == limit else None,
        "query": lambda **kw: _query(
            **{"status": status, "workflow": workflow, "tenant": tenant, **kw}
        ),
        # Only the first page moves: later pages would shift under the reader.
        "live": cursor is None,
    }
    name = "_runs_live.html" if partial else "runs.html"
    return templates.TemplateResponse(request, name, context)


def _tenant_budget(reads: Reads, tenant: str | None) -> Budget | None:
    """The budget the runs page shows: that of the tenant it is filtered by (an admin's
    session), or a tenant's session's own; None when it has none. From the primary, which
    keeps the budgets' spend."""
    who = reads.primary.tenant or tenant
    if who is None:
        return None
    try:
        return reads.primary.tenant_budget(who)
    except UnknownBudget:
        return None


@router.get("/ui/runs/{run_id}")
def run_page(
    request: Request,
    run_id: str,
    reads: ReadsDep,
    settings: SettingsDep,
    partial: bool = False,
) -> HTMLResponse:
    found = reads.holding(run_id)  # the replica, or the primary while the replica lags
    if found is None:
        return templates.TemplateResponse(
            request, "missing.html", {"run_id": run_id}, status_code=404
        )
    client, run = found
    steps = client.history(run_id)
    now = dt.datetime.now(dt.UTC)
    # A run enqueued untraced has the trace its traced deliveries derive from its id.
    trace_id = logs.trace_id_of(run.traceparent) or f"{logs.run_trace(run.run_id)[0]:032x}"
    context = {
        "run": run,
        "steps": steps,
        "calls": [call_row(c) for c in client.calls(run_id)],
        "children": client.children(run_id),
        "forks": client.forks(run_id),
        "line": timeline(run, steps, now),
        "live": run.status not in STOPPED,
        "took": ((run.updated_at if run.status in STOPPED else now) - run.created_at),
        "state_json": json.dumps(run.state, indent=2, default=str),
        "input_json": json.dumps(run.input, indent=2, default=str),
        "trace_id": trace_id,
        "trace_url": trace_url(settings.trace_url_template, trace_id),
    }
    name = "_run_live.html" if partial else "run.html"
    return templates.TemplateResponse(request, name, context)


@router.get("/ui/approvals")
def approvals_page(
    request: Request,
    client: ClientDep,
    workflow: str | None = None,
    order: str = "newest",
    cursor: int | None = None,
    partial: bool = False,
) -> HTMLResponse:
    # The primary, not a replica: a decision just made must not come back from a lag.
    workflow, oldest, limit = workflow or None, order == "oldest", 50
    found = client.approvals(workflow=workflow, limit=limit, after=cursor, oldest_first=oldest)
    context = {
        "approvals": found,
        "workflow": workflow or "",
        "order": "oldest" if oldest else "newest",
        "cursor": cursor,
        "next_cursor": found[-1].approval_id if len(found) == limit else None,
        "query": lambda **kw: _query(**{"workflow": workflow, "order": order, **kw}),
        "args_of": _args_of,
        "live": cursor is None,
    }
    name = "_approvals_live.html" if partial else "approvals.html"
    return templates.TemplateResponse(request, name, context)


def _args_of(approval: Approval) -> str:
    args = approval.request.get("args")
    return "" if args is None else json.dumps(args, default=str)[:300]


def _local(target: str) -> str:
    """Only a path on this server: a login must not bounce the browser elsewhere."""
    return target if target.startswith("/") and not target.startswith("//") else "/ui/runs"


def _query(**params: Any) -> str:
    return urlencode({k: v for k, v in params.items() if v})
