"""The pages' cookies and the check that a form came from a page of cairn's own.

Two cookies, both HttpOnly and SameSite=Strict: the session (a random value, see
cairn.web.auth) and the login form's nonce, which the form's hidden check is a MAC of.
Over HTTPS (the connection's, a trusted proxy's X-Forwarded-Proto, or
CAIRN_WEB_SECURE_COOKIES) they are `Secure` and named with the `__Host-` prefix, which a
browser takes only from a secure page of this very host: a page on another port or a
sibling subdomain cannot plant one. A request over HTTPS reads the prefixed name only.

SameSite=Strict keeps the cookies off requests from another site, but a page on another
port of the same host is the same site. What keeps such a page from logging the browser
in, or out, is the form's check, which it cannot read, and the browser's own word on
where a request came from (Sec-Fetch-Site, or Origin from an older browser).
"""

from __future__ import annotations

from fastapi import Request, Response

from cairn.core.settings import Settings

SESSION, LOGIN = "cairn_session", "cairn_login"
HOST_PREFIX = "__Host-"
LOGIN_SECONDS = 3600  # a login form left open longer is served again


def secure(request: Request, settings: Settings) -> bool:
    """Whether this request's cookies are Secure (and __Host- named)."""
    return settings.web_secure_cookies or request.url.scheme == "https"


def name(base: str, request: Request, settings: Settings) -> str:
    return HOST_PREFIX + base if secure(request, settings) else base


def session_of(request: Request, settings: Settings) -> str:
    """The session cookie's value, by the name this request's scheme uses ("": none)."""
    return request.cookies.get(name(SESSION, request, settings), "")


def login_nonce(request: Request, settings: Settings) -> str:
    return request.cookies.get(name(LOGIN, request, settings), "")


def put(
    response: Response, base: str, value: str, seconds: int, request: Request, settings: Settings
) -> None:
    """Set cookie base to value for seconds, with every flag this request calls for."""
    response.set_cookie(
        name(base, request, settings),
        value,
        max_age=seconds,
        path="/",
        httponly=True,
        samesite="strict",
        secure=secure(request, settings),
    )


def drop(response: Response, base: str, request: Request, settings: Settings) -> None:
    response.delete_cookie(
        name(base, request, settings),
        path="/",
        httponly=True,
        samesite="strict",
        secure=secure(request, settings),
    )


def elsewhere(request: Request) -> str | None:
    """Why a form post did not come from a page of this origin, as the browser tells it,
    or None: Sec-Fetch-Site must be same-origin; a browser too old to send it is judged
    by its Origin, when it sends one. A request with neither (curl) is no browser's, and
    the form's check still has to hold."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return None if site == "same-origin" else f"a {site} request"
    origin = request.headers.get("origin")
    if origin and origin != "null":
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if origin != own:
            return f"a request from {origin}"
    return None
