"""What the routes share, as FastAPI dependencies: the objects create_app puts on
app.state, one of each per app (the Client, the settings, the event hub, the token, the
metrics). A tenant's request (the guard put its tenant in the scope's state) gets the
Client and the reads as that tenant's views: its runs only; a request made with a
`cairn tokens` token gets a Client that names that token in the audit rows it writes."""

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


def token_of(request: Request) -> str | None:
    """The `cairn tokens` token the request proved itself with (None: the server's own)."""
    token_id: str | None = request.scope.get("state", {}).get("token_id")
    return token_id


async def _client(request: Request) -> Client:
    client: Client = request.app.state.client
    tenant, token_id = tenant_of(request), token_of(request)
    if tenant is None and token_id is None:
        return client
    return client.for_tenant(tenant, token_id=token_id)


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


ClientDep = Annotated[Client, Depends(_client)]
ReadsDep = Annotated[Reads, Depends(_reads)]  # the GETs: on the replica if there is one
SettingsDep = Annotated[Settings, Depends(_settings)]
HubDep = Annotated[Hub, Depends(_hub)]
AuthDep = Annotated[Auth, Depends(_auth)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
