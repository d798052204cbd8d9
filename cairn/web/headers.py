"""What every answer of `cairn serve` says to the browser about itself, and how the request
came: the outermost layer, so the guard's refusals, the errors and the static files carry
the same headers as the pages.

- Content-Security-Policy: scripts, styles and connections from this origin only, no
  inline script or style, no plugin, forms posted here only, and `frame-ancestors 'none'`
  (with X-Frame-Options DENY for older browsers): no other page frames a page of cairn's
  under a decoy, so no click on it is anyone's but the user's.
- X-Content-Type-Options nosniff: an answer is what its Content-Type says, never a script.
- Referrer-Policy no-referrer: a run id or a read token in a URL never leaves in a Referer.
- Cache-Control no-store on what is not a static file: a page read by a session is not
  kept for the next person at the browser, nor by a proxy.

A request's scheme is the connection's, or the X-Forwarded-Proto of a peer named in
CAIRN_WEB_TRUSTED_PROXIES: from anyone else that header is ignored (uvicorn's own reading
of it is turned off in `cairn serve`, so this is the one place it is read).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_SELF = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
# The API's reference page (/docs): Swagger UI's script and style from its CDN, which
# also styles what it draws inline; still no inline script, and never framed.
CDN = "https://cdn.jsdelivr.net"
_DOCS = (
    f"default-src 'self'; script-src 'self' {CDN}; style-src 'self' 'unsafe-inline' {CDN}; "
    f"img-src 'self' data: {CDN} https://fastapi.tiangolo.com; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS: dict[str, str] = {
    "content-security-policy": _SELF,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}
DOCS_PATH = "/docs"


class Hardened:
    """The security headers on every answer, and the scheme a trusted proxy says, as
    plain ASGI (it wraps every request, streams included)."""

    def __init__(self, app: ASGIApp, *, trusted_proxies: Iterable[str] = ()) -> None:
        self.app = app
        self.trusted = [ipaddress.ip_network(p, strict=False) for p in trusted_proxies]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.trusted and self._from_proxy(scope):
            proto = _header(scope, b"x-forwarded-proto")
            if proto is not None:
                # The hop nearest to us is the last one named.
                scheme = proto.rsplit(",", 1)[-1].strip().lower()
                if scheme in ("http", "https"):
                    scope["scheme"] = scheme
        path: str = scope["path"]
        policy = _DOCS if path == DOCS_PATH else _SELF
        static = path.startswith("/static/")

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers[name] = value
                headers["content-security-policy"] = policy
                if not static and "cache-control" not in headers:
                    headers["cache-control"] = "no-store"
            await send(message)

        await self.app(scope, receive, sending)

    def _from_proxy(self, scope: Scope) -> bool:
        peer = scope.get("client")
        if not peer:
            return False
        try:
            address = ipaddress.ip_address(peer[0])
        except ValueError:
            return False
        return any(address in network for network in self.trusted)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None
