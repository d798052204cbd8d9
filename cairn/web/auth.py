"""Who may ask what: the API token (CAIRN_API_TOKEN, the admin's) and the tokens of
`cairn tokens create` (a tenant's, or an admin's), the pages' sessions made from each, a
run's read token, and the guard that refuses a request before any route sees it.

A page session is a random value, in the browser's cookie only; the store keeps its hash
and what it was made from (store/tokens.py, PageSessions). Logging out deletes it, so a
copied cookie is dead with it; revoking its token ends it (the row goes, and a row whose
token no longer matches opens nothing); a server started with another CAIRN_API_TOKEN
opens none of the old token's. What a page embeds to prove a form is its own (the login
form's check, the logout button's) is a MAC under a key derived from the server's token,
so every `cairn serve` of one fleet agrees and no other origin can make one.

A run's read token ends with what issued it: the admin token's is derived from that
token alone; a `cairn tokens` token's is bound to that token too (its id and stored
hash), so `cairn tokens revoke` ends the read tokens it got within TOKEN_TTL.

A tenant's request carries its tenant in the ASGI scope's state; the routes' Client is
then that tenant's view (cairn.web.deps), so another tenant's run is no run: a 404 on
every route, absent from every list. A looked-up token or session is remembered
TOKEN_TTL seconds at most: a revoked one is refused within that (this process forgets a
session it ended itself at once).

The guard is middleware, not a route dependency: it answers paths no route has (a 401,
never a 404 that tells a stranger what exists), FastAPI's own /openapi.json, a body too
large without reading it, and a body nested too deep before any parser recurses into it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable
from typing import Literal, TypeVar
from urllib.parse import urlencode

from fastapi import Request, Response
from fastapi.responses import RedirectResponse
from fastapi.security import APIKeyQuery
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cairn.client.events import read_token
from cairn.core.inputs import BODY_DEPTH, MAX_DEPTH, too_deep
from cairn.core.settings import Settings
from cairn.store.tokens import PREFIX, PageSessions, Tokens
from cairn.web import cookies
from cairn.web.errors import error

# Cookie-authenticated writes must carry this header: a cross-site form cannot set it,
# and a script of another origin cannot send it without a preflight cairn never grants.
PAGE_HEADER = "x-cairn-page"
# Reachable without the token: the probe, the login and logout forms (each checks its
# own page's MAC instead) and the pages' CSS and JS.
OPEN_PATHS = re.compile(r"^/(healthz|login|logout|static/.*)$")
EVENTS_PATH = re.compile(r"^/runs/([^/]+)/events$")
# Not a tenant's: what spans every tenant (replay, schedules, whose runs have none, the
# fleet's metrics) and a tenant's limits, which are the admin's to set.
ADMIN_PATHS = re.compile(r"^/(runs/replay|schedules(/.*)?|tenants(/.*)?|metrics)$")
# How long a token looked up in Postgres is believed (a revoke takes this long at most).
TOKEN_TTL = 2.0
# A read token as Auth.read_token makes them: the admin's MAC, or "<token id>.<MAC>".
READ_TOKEN_SHAPE = re.compile(r"(?:[0-9a-f]{12}\.)?[0-9a-f]{64}")
READ_TOKEN = APIKeyQuery(
    name="token",
    scheme_name="readToken",
    description="A run's own read token (GET /runs/{run_id}/events only).",
    auto_error=False,
)
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Principal:
    """Who a request proved to be: how, and the tenant it acts for (None: an admin)."""

    how: Literal["bearer", "cookie"]
    tenant: str | None = None
    token_id: str | None = None  # the `cairn tokens` token it proved with (None: the admin's)
    session: str | None = None  # a page session's cookie value


@dataclasses.dataclass(frozen=True)
class _Found:
    admin: bool
    tenant: str | None
    token_id: str | None


class Auth:
    """The bearer token, or a page session made from one (never the token itself)."""

    def __init__(
        self,
        token: str | None,
        tokens: Tokens | None = None,
        sessions: PageSessions | None = None,
        *,
        settings: Settings | None = None,
    ) -> None:
        self.token = token.encode() if token else None
        self.tokens, self.sessions = tokens, sessions
        self.settings = settings or Settings()
        # What CAIRN_API_TOKEN's sessions are made from, and the key of the pages' MACs:
        # derived from the token, so another token opens neither.
        self.owner = (
            hmac.new(self.token, b"cairn page session owner", hashlib.sha256).digest()
            if self.token
            else b""
        )
        self.key = (
            hmac.new(self.token, b"cairn page checks", hashlib.sha256).digest()
            if self.token
            else secrets.token_bytes(32)
        )
        self._seen: dict[str, tuple[float, object]] = {}

    async def check(self, request: Request) -> Principal | None:
        """Who the request proved to be, or None."""
        if self.token is None:
            return Principal("bearer")
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        given = given.strip()
        if scheme.lower() == "bearer" and given:
            if hmac.compare_digest(given.encode(), self.token):
                return Principal("bearer")
            if given.startswith(PREFIX) and (found := await self._token(given)) is not None:
                return Principal("bearer", None if found.admin else found.tenant, found.token_id)
        value = cookies.session_of(request, self.settings)
        if value and (session := await self._page_session(value)) is not None:
            tenant = None if session.admin else session.tenant
            return Principal("cookie", tenant, session.token_id, value)
        return None

    def mac(self, purpose: str, value: str) -> str:
        """What a page embeds to prove a form is its own: the login form's (over its
        cookie's nonce), the logout button's (over the session)."""
        said = purpose.encode() + b":" + value.encode()
        return hmac.new(self.key, said, hashlib.sha256).hexdigest()

    def checks(self, purpose: str, value: str, given: str) -> bool:
        """Whether given is what mac(purpose, value) makes."""
        return bool(value) and hmac.compare_digest(
            given.encode(), self.mac(purpose, value).encode()
        )

    async def _token(self, given: str) -> _Found | None:
        """A `cairn tokens` token: whether an admin's, its tenant and id; or None."""
        key = hashlib.sha256(given.encode()).hexdigest()

        def lookup() -> _Found | None:
            assert self.tokens is not None
            found = self.tokens.check(given)
            return None if found is None else _Found(found.admin, found.tenant, found.id)

        return await self._remembered(key, lookup) if self.tokens is not None else None

    async def _page_session(self, value: str) -> _Found | None:
        """The live page session value opens: CAIRN_API_TOKEN's only while the server
        runs with the token it was made from."""

        def lookup() -> _Found | None:
            assert self.sessions is not None
            found = self.sessions.get(value)
            if found is None:
                return None
            if found.token_id is None and not hmac.compare_digest(found.owner, self.owner):
                return None
            return _Found(found.admin, found.tenant, found.token_id)

        if self.sessions is None:
            return None
        return await self._remembered(self._session_key(value), lookup)

    @staticmethod
    def _session_key(value: str) -> str:
        return "p:" + hashlib.sha256(value.encode()).hexdigest()

    async def _live(self, token_id: str) -> tuple[bool, str | None, bytes] | None:
        """A `cairn tokens` token by id, for its read tokens: (admin, tenant, the stored
        hash they are bound to)."""

        def lookup() -> tuple[bool, str | None, bytes] | None:
            assert self.tokens is not None
            found = self.tokens.live(token_id)
            return None if found is None else (found[0].admin, found[0].tenant, found[1])

        if self.tokens is None:
            return None
        return await self._remembered("s:" + token_id, lookup)

    async def _remembered(self, key: str, lookup: Callable[[], T | None]) -> T | None:
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is not None and seen[0] > now:
            return seen[1]  # type: ignore[return-value]  # what lookup gave for this key
        found = await asyncio.to_thread(lookup)  # off the event loop: a Postgres read
        if len(self._seen) > 10_000:  # a flood of wrong tokens must not grow it forever
            self._seen.clear()
        self._seen[key] = (now + TOKEN_TTL, found)
        return found

    async def reads(self, request: Request) -> bool | None:
        """For GET /runs/{id}/events with ?token=: whether it reads that run (None: no
        such token on the request, or nothing shaped as one: no credential at all). A
        `cairn tokens` token's read token reads while that token is live (looked up as
        a page session's is, believed TOKEN_TTL)."""
        given = request.query_params.get("token")
        m = EVENTS_PATH.match(request.url.path)
        if given is None or m is None or not READ_TOKEN_SHAPE.fullmatch(given):
            return None
        if self.token is None:
            return False
        token_id, dot, mac = given.partition(".")
        if dot:
            found = await self._live(token_id)
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
        """A new page session's cookie value for a correct token, else None: one of
        CAIRN_API_TOKEN's, or of a live `cairn tokens` token (bound to its stored hash)."""
        if self.sessions is None:
            return None
        seconds = self.settings.web_session_seconds
        if self.token is not None and hmac.compare_digest(given.encode(), self.token):
            return await asyncio.to_thread(self.sessions.create, None, self.owner, seconds)
        if not given.startswith(PREFIX) or (found := await self._token(given)) is None:
            return None
        token_id = found.token_id
        assert token_id is not None
        live = await asyncio.to_thread(self.tokens.live, token_id) if self.tokens else None
        if live is None:
            return None
        return await asyncio.to_thread(self.sessions.create, token_id, live[1], seconds)

    async def logout(self, value: str) -> None:
        """End the session value opens: its row goes, and this process forgets it now."""
        self._seen.pop(self._session_key(value), None)
        if self.sessions is not None:
            await asyncio.to_thread(self.sessions.end, value)


class Guard:
    """Auth, body limits (size, then depth) and the page's own check on a session's
    writes, as plain ASGI (a BaseHTTPMiddleware would cost a third of a small request)."""

    def __init__(self, app: ASGIApp, *, auth: Auth, max_body: int, settings: Settings) -> None:
        self.app, self.auth, self.max_body, self.settings = app, auth, max_body, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = await self.refuse(Request(scope))
        if refused is None and scope["method"] in ("POST", "PUT", "PATCH"):
            # Read whole before any parser sees it: its Content-Length is known and at
            # most max_body (refuse said so), and a parser recurses into what it nests.
            body, receive = await _buffered(receive)
            if too_deep(body):
                refused = error(
                    422,
                    "invalid_input",
                    f"the body nests deeper than {BODY_DEPTH} levels: a value (an input, "
                    f"payload, message or args) may nest {MAX_DEPTH} levels at most",
                )
        await (refused or self.app)(scope, receive, send)

    async def refuse(self, request: Request) -> Response | None:
        path = request.url.path
        if not OPEN_PATHS.match(path):
            who = await self.auth.check(request)
            how = who.how if who is not None else None
            state = request.scope.setdefault("state", {})
            if who is not None and who.token_id is not None:
                # A run's read token it asks for is bound to it (Auth.read_token).
                state["token_id"] = who.token_id
            if who is not None and who.session is not None:
                # The pages' logout button carries this; another origin cannot make it.
                state["logout_check"] = self.auth.mac("logout", who.session)
            if who is not None and who.tenant is not None:
                if ADMIN_PATHS.match(path):
                    return error(403, "forbidden", "an admin token's: it spans every tenant")
                # The routes' Client acts for this tenant alone (cairn.web.deps).
                state["tenant"] = who.tenant
            if how is None and (reads := await self.auth.reads(request)) is not None:
                if not reads:
                    return error(403, "forbidden", "this token does not read this run's events")
                return None
            if how is None:
                if request.method == "GET" and (path == "/" or path.startswith("/ui")):
                    where = urlencode({"next": path})
                    return RedirectResponse(f"/login?{where}", status_code=303)
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


async def _buffered(receive: Receive) -> tuple[bytes, Receive]:
    """The request's body, read whole, and a receive that hands it on as it came."""
    chunks: list[bytes] = []
    ended: list[Message] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            ended.append(message)  # the client went: the app hears it first thing
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    given = False

    async def replay() -> Message:
        nonlocal given
        if ended:
            return ended.pop()
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay
