"""Who may ask what: the API token (CAIRN_API_TOKEN, the admin's) and the tokens of
`cairn tokens create` (a tenant's, or an admin's), the pages' session derived from each,
a run's read token, and the guard that refuses a request before any route sees it.

A run's read token ends with what issued it: the admin token's is derived from that
token alone; a `cairn tokens` token's is bound to that token too (its id and stored
hash), so `cairn tokens revoke` ends the read tokens it got within TOKEN_TTL.

A tenant's request carries its tenant in the ASGI scope's state; the routes' Client is
then that tenant's view (cairn.web.deps), so another tenant's run is no run: a 404 on
every route, absent from every list. A looked-up token is remembered TOKEN_TTL seconds
at most: a revoked one is refused within that.

The guard is middleware, not a route dependency: it answers paths no route has (a 401,
never a 404 that tells a stranger what exists), FastAPI's own /docs and /openapi.json,
and a body too large without reading it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import re
import time
from collections.abc import Callable
from typing import Literal

from fastapi import Request, Response
from fastapi.responses import RedirectResponse
from fastapi.security import APIKeyQuery
from starlette.types import ASGIApp, Receive, Scope, Send

from cairn.client.events import read_token
from cairn.core.settings import Settings
from cairn.store.tokens import PREFIX, Tokens
from cairn.web.errors import error

COOKIE = "cairn_session"
# Cookie-authenticated writes must carry this header: a cross-site form cannot set it.
PAGE_HEADER = "x-cairn-page"
# Reachable without the token: the probe, the login form and the pages' CSS and JS.
OPEN_PATHS = re.compile(r"^/(healthz|login|static/.*)$")
EVENTS_PATH = re.compile(r"^/runs/([^/]+)/events$")
# How long a token looked up in Postgres is believed (a revoke takes this long at most).
TOKEN_TTL = 2.0
SESSION_SALT = b"cairn page session"
READ_TOKEN = APIKeyQuery(
    name="token",
    scheme_name="readToken",
    description="A run's own read token (GET /runs/{run_id}/events only).",
    auto_error=False,
)


@dataclasses.dataclass(frozen=True)
class Principal:
    """Who a request proved to be: how, and the tenant it acts for (None: an admin)."""

    how: Literal["bearer", "cookie"]
    tenant: str | None = None
    token_id: str | None = None  # the `cairn tokens` token it proved with (None: the admin's)


class Auth:
    """The bearer token, or the page session derived from it (never the token itself)."""

    def __init__(self, token: str | None, tokens: Tokens | None = None) -> None:
        self.token = token.encode() if token else None
        self.session = (
            hmac.new(self.token, SESSION_SALT, hashlib.sha256).hexdigest().encode()
            if self.token
            else None
        )
        self.tokens = tokens
        # token digest (or "s:" + id): (believed until, principal's tenant or admin, key)
        self._seen: dict[str, tuple[float, tuple[bool, str | None, bytes] | None]] = {}

    async def check(self, request: Request) -> Principal | None:
        """Who the request proved to be, or None."""
        if self.token is None or self.session is None:
            return Principal("bearer")
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        given = given.strip()
        if scheme.lower() == "bearer" and given:
            if hmac.compare_digest(given.encode(), self.token):
                return Principal("bearer")
            if given.startswith(PREFIX) and (found := await self._token(given)) is not None:
                return Principal("bearer", None if found[0] else found[1], found[2].decode())
        cookie = request.cookies.get(COOKIE, "")
        if cookie and hmac.compare_digest(cookie.encode(), self.session):
            return Principal("cookie")
        token_id, dot, mac = cookie.partition(".")
        found = await self._session(token_id) if dot else None
        if found is not None and hmac.compare_digest(
            mac.encode(), self._mac(token_id, found[2]).encode()
        ):
            return Principal("cookie", None if found[0] else found[1], token_id)
        return None

    def _mac(self, token_id: str, stored: bytes) -> str:
        """A `cairn tokens` token's page session: keyed by the server's own token, so the
        tokens table alone forges none, and by the token's stored hash, so a revoked or
        replaced token's sessions end with it."""
        assert self.token is not None
        said = SESSION_SALT + b":" + token_id.encode() + b":" + stored
        return hmac.new(self.token, said, hashlib.sha256).hexdigest()

    async def _token(self, given: str) -> tuple[bool, str | None, bytes] | None:
        """A `cairn tokens` token: (admin, tenant, its id as bytes), or None."""
        key = hashlib.sha256(given.encode()).hexdigest()

        def lookup() -> tuple[bool, str | None, bytes] | None:
            assert self.tokens is not None
            found = self.tokens.check(given)
            return None if found is None else (found.admin, found.tenant, found.id.encode())

        return await self._remembered(key, lookup)

    async def _session(self, token_id: str) -> tuple[bool, str | None, bytes] | None:
        """A tenant session's token: (admin, tenant, the key its session derives from)."""

        def lookup() -> tuple[bool, str | None, bytes] | None:
            assert self.tokens is not None
            found = self.tokens.live(token_id)
            return None if found is None else (found[0].admin, found[0].tenant, found[1])

        return await self._remembered("s:" + token_id, lookup)

    async def _remembered(
        self, key: str, lookup: Callable[[], tuple[bool, str | None, bytes] | None]
    ) -> tuple[bool, str | None, bytes] | None:
        if self.tokens is None:
            return None
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is not None and seen[0] > now:
            return seen[1]
        found = await asyncio.to_thread(lookup)  # off the event loop: a Postgres read
        if len(self._seen) > 10_000:  # a flood of wrong tokens must not grow it forever
            self._seen.clear()
        self._seen[key] = (now + TOKEN_TTL, found)
        return found

    async def reads(self, request: Request) -> bool | None:
        """For GET /runs/{id}/events with ?token=: whether it reads that run (None: no
        such token on the request). A `cairn tokens` token's read token reads while that
        token is live (looked up as a page session's is, believed TOKEN_TTL)."""
        given = request.query_params.get("token")
        m = EVENTS_PATH.match(request.url.path)
        if given is None or m is None:
            return None
        if self.token is None:
            return False
        token_id, dot, mac = given.partition(".")
        if dot:
            found = await self._session(token_id)
            return found is not None and hmac.compare_digest(
                mac.encode(), self._read_mac(token_id, found[2], m.group(1)).encode()
            )
        expected = read_token(self.token.decode(), m.group(1))
        return hmac.compare_digest(given.encode(), expected.encode())

    def read_token(self, run_id: str, token_id: str | None) -> str | None:
        """run_id's read token for a request that proved itself with token_id (None: the
        admin token, or its page session): the admin's derived from the server's token
        alone (Client.events_token's); a `cairn tokens` token's "<id>.<MAC>", keyed by
        the server's token and that token's stored hash. None: token_id is revoked."""
        assert self.token is not None
        if token_id is None:
            return read_token(self.token.decode(), run_id)
        found = self.tokens.live(token_id) if self.tokens is not None else None
        if found is None:
            return None
        return f"{token_id}.{self._read_mac(token_id, found[1], run_id)}"

    def _read_mac(self, token_id: str, stored: bytes, run_id: str) -> str:
        assert self.token is not None
        said = b"cairn run events:" + token_id.encode() + b":" + stored + b":" + run_id.encode()
        return hmac.new(self.token, said, hashlib.sha256).hexdigest()

    async def login(self, given: str) -> str | None:
        """The session cookie's value for a correct token, else None: the admin token's
        session, or a `cairn tokens` token's (its id and its MAC, _mac: revoking the token
        ends the session)."""
        if self.token is None or self.session is None:
            return ""
        if hmac.compare_digest(given.encode(), self.token):
            return self.session.decode()
        if not given.startswith(PREFIX) or await self._token(given) is None:
            return None
        token_id = given[len(PREFIX) :].partition("_")[0]
        found = await self._session(token_id)
        if found is None:
            return None
        return f"{token_id}.{self._mac(token_id, found[2])}"


class Guard:
    """Auth and body limits, as plain ASGI (a BaseHTTPMiddleware would cost a third of a
    small request)."""

    def __init__(self, app: ASGIApp, *, auth: Auth, max_body: int, settings: Settings) -> None:
        self.app, self.auth, self.max_body, self.settings = app, auth, max_body, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = await self.refuse(Request(scope))
        await (refused or self.app)(scope, receive, send)

    async def refuse(self, request: Request) -> Response | None:
        path = request.url.path
        if not OPEN_PATHS.match(path):
            who = await self.auth.check(request)
            how = who.how if who is not None else None
            if who is not None and who.token_id is not None:
                # A run's read token it asks for is bound to it (Auth.read_token).
                request.scope.setdefault("state", {})["token_id"] = who.token_id
            if who is not None and who.tenant is not None:
                # The routes' Client acts for this tenant alone (cairn.web.deps), and an
                # admin's route refuses it (cairn.web.tenancy).
                request.scope.setdefault("state", {})["tenant"] = who.tenant
            if how is None and (reads := await self.auth.reads(request)) is not None:
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
