"""The HTTP API and the pages as one FastAPI app: runs started, read, cancelled and
signalled over JSON, behind a bearer token.

create_app only wires: the settings, the one Client every route shares, the event hub,
the guard, the error handlers and one router per resource (cairn.web.routers). The
routes reach what they share through FastAPI dependencies on app.state (cairn.web.deps);
each takes its tenancy decision first (cairn.web.tenancy), and an app with a route that
has none is not built.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import Depends, FastAPI
from fastapi.staticfiles import StaticFiles

from cairn import __version__
from cairn.client.client import Client
from cairn.core import tracing
from cairn.core.errors import InvalidInput
from cairn.core.settings import Settings
from cairn.steps import registry
from cairn.store.checkpoints import PgStore
from cairn.store.events import AsyncRedisEvents
from cairn.store.tokens import PageSessions, Tokens
from cairn.web import errors, tenancy
from cairn.web.auth import OPEN_PATHS, Auth, Guard
from cairn.web.headers import Hardened
from cairn.web.hub import Hub
from cairn.web.metrics import Measured, Metrics
from cairn.web.openapi import document
from cairn.web.reads import Reads, replica_client
from cairn.web.render import STATIC
from cairn.web.routers import (
    approvals,
    events,
    health,
    pages,
    runs,
    schedules,
    signals,
    tenants,
)

# A body larger than the largest input, by more than this envelope, is refused unread.
ENVELOPE = 64 * 1024


def create_app(settings: Settings, *, insecure_no_auth: bool = False) -> FastAPI:
    """The API and the pages over one Client. Refuses to build without a token unless
    insecure_no_auth (a laptop) is asked for."""
    if not settings.api_token and not insecure_no_auth:
        raise InvalidInput(
            "CAIRN_API_TOKEN is not set: set it (e.g. `export CAIRN_API_TOKEN=$(openssl rand "
            "-hex 32)`) or pass --insecure-no-auth on a machine only you can reach"
        )
    registry.import_modules(settings.workflows)
    tracing.setup(settings, "cairn-web")  # CAIRN_TRACING: before the Client's, to name it
    app = FastAPI(
        title="cairn",
        version=__version__,
        summary="Durable multi-step LLM agent runs: start, read, cancel and signal them.",
        lifespan=_lifespan,
        dependencies=[Depends(tenancy.decided)],  # every route's, before it runs
        docs_url=None,  # the pages' own /docs: no inline script (cairn.web.routers.pages)
        redoc_url=None,
    )
    app.state.settings = settings
    # Postgres connections of this process: enough for the thread pool's busy requests.
    app.state.client = client = Client(settings=settings, pool_size=16)
    app.state.reads = Reads(client, replica_client(client, pool_size=16))
    app.state.hub = Hub(AsyncRedisEvents(settings.redis))
    pg = client.store.db if isinstance(client.store, PgStore) else None
    tokens, sessions = (Tokens(pg), PageSessions(pg)) if pg is not None else (None, None)
    app.state.auth = auth = Auth(settings.api_token, tokens, sessions, settings=settings)
    app.state.metrics = metrics = Metrics(client)

    # The last added runs first: every answer carries the security headers, every
    # request is measured, those the guard refuses too.
    max_body = settings.max_input_bytes + ENVELOPE
    app.add_middleware(Guard, auth=auth, max_body=max_body, settings=settings)
    app.add_middleware(Measured, metrics=metrics)
    app.add_middleware(Hardened, trusted_proxies=settings.web_trusted_proxies)
    errors.install(app)

    for resource in (runs, events, signals, approvals, health, pages, schedules, tenants):
        app.include_router(resource.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    tenancy.check(app)
    document(app, open_paths=OPEN_PATHS, no_store=health.NO_STORE, tenancy=tenancy.of)
    return app


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    app.state.client.close()
    app.state.reads.close()
    hub: Hub = app.state.hub
    await hub.close()
    await hub.log.close()  # the Redis connections create_app opened for it
