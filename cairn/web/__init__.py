"""`cairn serve`: the HTTP API (api.py) and the pages of runs (pages.py) in one process.

Both are thin over cairn.Client: what a Python caller can do, an HTTP caller can do.
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
