"""The pages: a runs table with counts by status, a run with its step timeline, the
approvals waiting across runs, the login that turns a token into a page session and the
logout that ends it, and the API's reference (/docs). Not in the OpenAPI document.

Login and logout take a form only from a page of this server's own (its check, and the
browser's Sec-Fetch-Site: cairn.web.cookies); every page's headers are cairn.web.headers'.

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
import re
import secrets
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from cairn.core import logs
from cairn.core.errors import UnknownBudget
from cairn.core.inputs import TENANT
from cairn.core.records import Approval, Budget
from cairn.core.settings import Settings
from cairn.core.status import STOPPED, RunStatus
from cairn.web import cookies
from cairn.web.auth import Auth
from cairn.web.deps import AuthDep, ClientDep, ReadsDep, SettingsDep
from cairn.web.errors import error
from cairn.web.headers import CDN
from cairn.web.reads import Reads
from cairn.web.render import STATUSES, call_row, templates, timeline, trace_url

router = APIRouter(include_in_schema=False)


@router.get("/")
def home() -> RedirectResponse:
    return RedirectResponse("/ui/runs", status_code=303)


@router.get("/login")
def login_form(
    request: Request,
    auth: AuthDep,
    settings: SettingsDep,
    next: str = "/ui/runs",
    failed: bool = False,
) -> Response:
    return _login_page(request, auth, settings, _local(next), "failed" if failed else None)


def _login_page(
    request: Request,
    auth: Auth,
    settings: Settings,
    target: str,
    why: str | None,
    status: int = 200,
) -> Response:
    """The login form, with a new nonce in its cookie and the nonce's MAC in the form: a
    page of another origin can submit a form here but cannot read this one's check."""
    nonce = secrets.token_urlsafe(24)
    context = {"next": target, "why": why, "check": auth.mac("login", nonce)}
    response = templates.TemplateResponse(request, "login.html", context, status_code=status)
    cookies.put(response, cookies.LOGIN, nonce, cookies.LOGIN_SECONDS, request, settings)
    return response


@router.post("/login")
async def login(request: Request, auth: AuthDep, settings: SettingsDep) -> Response:
    form = parse_qs((await request.body()).decode(errors="replace"))
    target = _local(form.get("next", ["/ui/runs"])[0])
    nonce = cookies.login_nonce(request, settings)
    if cookies.elsewhere(request) or not auth.checks("login", nonce, _one(form, "check")):
        # Login CSRF: another origin's page posting its own token to log this browser in
        # as its tenant. Only this server's own form, just served, logs in.
        return _login_page(request, auth, settings, target, "elsewhere", status=403)
    if auth.token is None:  # --insecure-no-auth: nothing to log in to
        return RedirectResponse(target, status_code=303)
    session = await auth.login(_one(form, "token"))
    if session is None:
        return RedirectResponse(
            f"/login?{urlencode({'next': target, 'failed': 1})}", status_code=303
        )
    if old := cookies.session_of(request, settings):
        await auth.logout(old)  # a login is a new session, never one someone planted
    response = RedirectResponse(target, status_code=303)
    seconds = int(settings.web_session_seconds)
    cookies.put(response, cookies.SESSION, session, seconds, request, settings)
    cookies.drop(response, cookies.LOGIN, request, settings)
    return response


@router.post("/logout")
async def logout(request: Request, auth: AuthDep, settings: SettingsDep) -> Response:
    """End the session, by the button of one of its own pages (a POST with the page's
    check: an image or a form of another origin ends nothing)."""
    form = parse_qs((await request.body()).decode(errors="replace"))
    session = cookies.session_of(request, settings)
    response = RedirectResponse("/login", status_code=303)
    if not session:
        # No cookie came (a post from another site, whose request SameSite stripped): the
        # answer must not touch the cookie the browser still holds.
        return response
    if cookies.elsewhere(request) or not auth.checks("logout", session, _one(form, "check")):
        return error(403, "forbidden", "log out with the button of one of this server's pages")
    await auth.logout(session)
    cookies.drop(response, cookies.SESSION, request, settings)
    return response


def _one(form: dict[str, list[str]], key: str) -> str:
    return form.get(key, [""])[0]


@router.get("/docs")
def api_docs(request: Request) -> Response:
    """Swagger UI over /openapi.json, started by a static script (no inline script)."""
    return templates.TemplateResponse(request, "docs.html", {"cdn": CDN})


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


# :path: a run id may hold "/" (its link encodes it, %2F, which the server decodes).
@router.get("/ui/runs/{run_id:path}")
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
    """Only a path on this server: a login must not bounce the browser elsewhere (no
    "//host", nor "/\\host", which browsers read as one, nor a control character)."""
    return target if _LOCAL.fullmatch(target) else "/ui/runs"


_LOCAL = re.compile(r"/(?![/\\])[^\\\x00-\x1f\x7f]*")


def _query(**params: Any) -> str:
    return urlencode({k: v for k, v in params.items() if v})
