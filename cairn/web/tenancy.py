"""Each route's tenancy decision, cairn.client.tenancy.ROUTES, where every route takes it:
a dependency of the whole app (`decided`) refuses a tenant's token an admin's route (403)
before the route runs, and a tenant's own rows are kept by the Client the route is given,
that tenant's view (cairn.web.deps), which takes the same table's decision again.
create_app refuses to build an app with a route the table has no decision for, or a
decision for no route (`check`); the OpenAPI document names each operation's
(`x-cairn-tenancy`, cairn.web.openapi).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request

from cairn.client.tenancy import ROUTES, Decision, Who, route_decision
from cairn.core.errors import Forbidden
from cairn.web.deps import tenant_of
from cairn.web.errors import each_route


def keys(app: FastAPI) -> Iterator[str]:
    """Every route of app as ROUTES names it: "METHOD /path" (a mount: "MOUNT /path")."""
    for route in each_route(app.router.routes):
        methods = set(getattr(route, "methods", None) or ()) - {"HEAD"}
        if not methods:
            yield f"MOUNT {route.path}"
        for method in sorted(methods):
            yield f"{method} {route.path}"


def check(app: FastAPI) -> None:
    """Refuse an app whose routes and ROUTES differ: a route without a decision would be
    reached by every token, a decision without a route is a stale one."""
    found = set(keys(app))
    missing, stale = sorted(found - ROUTES.keys()), sorted(ROUTES.keys() - found)
    if missing or stale:
        raise RuntimeError(
            f"routes without a tenancy decision: {missing}; decisions for no route: {stale} "
            "(cairn.client.tenancy.ROUTES)"
        )


def of(method: str, path: str) -> Decision:
    """The decision of the route at path (as the app declares it) for method."""
    return route_decision(f"{method.upper()} {path}")


async def decided(request: Request) -> None:
    """The route's decision, before it runs: an admin's refuses a tenant's token."""
    tenant = tenant_of(request)
    if tenant is None:
        return
    route: Any = request.scope["route"]
    decision = of("GET" if request.method == "HEAD" else request.method, route.path)
    if decision.who is Who.ADMIN:
        raise Forbidden(f"an admin token's: {decision.why}")
