"""`cairn serve`: the HTTP API and the pages of runs in one process.

Both are thin over cairn.Client: what a Python caller can do, an HTTP caller can do.
api.create_app wires the app; routers/ holds the routes, one module per resource; beside
them, one module for each thing the routes share: models (request and response shapes),
errors (the one error shape and its handlers), auth (the tokens, the page sessions and
the guard), cookies (the pages' cookies, where a form came from), headers (the security
headers on every answer), deps (the app's Client, settings, hub as FastAPI
dependencies), openapi (the complete document), metrics, hub (the live event readers),
render (what the pages show).
FastAPI, uvicorn and Jinja2 are the `server` extra: `pip install 'cairn[server]'`.
"""

from __future__ import annotations

try:
    import fastapi  # noqa: F401
    import jinja2  # noqa: F401
except ImportError as exc:  # the optional extra is missing: say which to install
    raise ImportError(
        f"cairn's HTTP API and pages need the server extra ({exc}): pip install 'cairn[server]'"
    ) from exc
