"""What the routes share, as FastAPI dependencies: the objects create_app puts on
app.state, one of each per app (the Client, the settings, the event hub, the token, the
metrics). A tenant's request (the guard put its tenant in the scope's state) gets the
Client and the reads as that tenant's views: its runs only."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from cairn.client.client import Client
from cairn.core.settings import Settings
from cairn.web.auth import Auth
from cairn.web.hub import Hub
from cairn.web.metrics import Metrics
from cairn.web.reads import Reads

# Each is async: FastAPI would run a plain def in its thread pool, a hop per request to
# read an attribute.


def tenant_of(request: Request) -> str | None:
    """The tenant the request acts for (None: an admin's, every run)."""
    tenant: str | None = request.scope.get("state", {}).get("tenant")
    return tenant


async def _client(request: Request) -> Client:
    client: Client = request.app.state.client
    tenant = tenant_of(request)
    return client if tenant is None else client.for_tenant(tenant)


async def _reads(request: Request) -> Reads:
    reads: Reads = request.app.state.reads
    tenant = tenant_of(request)
    return reads if tenant is None else reads.for_tenant(tenant)


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def _hub(request: Request) -> Hub:
    hub: Hub = request.app.state.hub
    return hub


async def _auth(request: Request) -> Auth:
    auth: Auth = request.app.state.auth
    return auth


async def _metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


async def _identity(request: Request) -> str:
    # Who the request is, for an audit row: the one API token (or the page session made
    # from it) is the admin's. A token of its own would name its holder here.
    return "admin"


ClientDep = Annotated[Client, Depends(_client)]
IdentityDep = Annotated[str, Depends(_identity)]
ReadsDep = Annotated[Reads, Depends(_reads)]  # the GETs: on the replica if there is one
SettingsDep = Annotated[Settings, Depends(_settings)]
HubDep = Annotated[Hub, Depends(_hub)]
AuthDep = Annotated[Auth, Depends(_auth)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
