"""Who may ask what: the API token, the pages' session derived from it, a run's read
token, and the guard that refuses a request before any route sees it.

The guard is middleware, not a route dependency: it answers paths no route has (a 401,
never a 404 that tells a stranger what exists), FastAPI's own /docs and /openapi.json,
and a body too large without reading it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Literal

from fastapi import Request, Response
from fastapi.responses import RedirectResponse
from fastapi.security import APIKeyQuery
from starlette.types import ASGIApp, Receive, Scope, Send

from cairn.client.events import read_token
from cairn.core.settings import Settings
from cairn.web.errors import error

COOKIE = "cairn_session"
# Cookie-authenticated writes must carry this header: a cross-site form cannot set it.
PAGE_HEADER = "x-cairn-page"
# Reachable without the token: the probe, the login form and the pages' CSS and JS.
OPEN_PATHS = re.compile(r"^/(healthz|login|static/.*)$")
EVENTS_PATH = re.compile(r"^/runs/([^/]+)/events$")
READ_TOKEN = APIKeyQuery(
    name="token",
    scheme_name="readToken",
    description="A run's own read token (GET /runs/{run_id}/events only).",
    auto_error=False,
)


class Auth:
    """The bearer token, or the page session derived from it (never the token itself)."""

    def __init__(self, token: str | None) -> None:
        self.token = token.encode() if token else None
        self.session = (
            hmac.new(self.token, b"cairn page session", hashlib.sha256).hexdigest().encode()
            if self.token
            else None
        )

    def check(self, request: Request) -> Literal["bearer", "cookie"] | None:
        """How the request proved itself, or None."""
        if self.token is None or self.session is None:
            return "bearer"
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token):
            return "bearer"
        cookie = request.cookies.get(COOKIE, "")
        if cookie and hmac.compare_digest(cookie.encode(), self.session):
            return "cookie"
        return None

    def reads(self, request: Request) -> bool | None:
        """For GET /runs/{id}/events with ?token=: whether it reads that run (None: no
        such token on the request)."""
        given = request.query_params.get("token")
        m = EVENTS_PATH.match(request.url.path)
        if given is None or m is None:
            return None
        if self.token is None:
            return False
        expected = read_token(self.token.decode(), m.group(1))
        return hmac.compare_digest(given.encode(), expected.encode())

    def login(self, given: str) -> str | None:
        """The session cookie's value for a correct token, else None."""
        if self.token is None or self.session is None:
            return ""
        return self.session.decode() if hmac.compare_digest(given.encode(), self.token) else None


class Guard:
    """Auth and body limits, as plain ASGI (a BaseHTTPMiddleware would cost a third of a
    small request)."""

    def __init__(self, app: ASGIApp, *, auth: Auth, max_body: int, settings: Settings) -> None:
        self.app, self.auth, self.max_body, self.settings = app, auth, max_body, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = self.refuse(Request(scope))
        await (refused or self.app)(scope, receive, send)

    def refuse(self, request: Request) -> Response | None:
        path = request.url.path
        if not OPEN_PATHS.match(path):
            how = self.auth.check(request)
            if how is None and (reads := self.auth.reads(request)) is not None:
                if not reads:
                    return error(403, "forbidden", "this token does not read this run's events")
                return None
            if how is None:
                if request.method == "GET" and (path == "/" or path.startswith("/ui")):
                    return RedirectResponse(f"/login?next={path}", status_code=303)
                return error(
                    401,
                    "unauthorized",
                    "send the API token as `Authorization: Bearer $CAIRN_API_TOKEN`",
                    **{"WWW-Authenticate": "Bearer"},
                )
            writes = request.method not in ("GET", "HEAD")
            if how == "cookie" and writes and request.headers.get(PAGE_HEADER) != "1":
                return error(403, "forbidden", f"a page's request must send {PAGE_HEADER}: 1")
        if request.method in ("POST", "PUT", "PATCH"):
            length = request.headers.get("content-length")
            if length is None and request.headers.get("transfer-encoding"):
                return error(411, "length_required", "send the body with a Content-Length")
            if length is not None and (not length.isdigit() or int(length) > self.max_body):
                return error(
                    413,
                    "body_too_large",
                    f"the body is {length} bytes; the most accepted is {self.max_body:,} "
                    f"(CAIRN_MAX_INPUT_BYTES={self.settings.max_input_bytes:,} plus the envelope)",
                )
        return None
