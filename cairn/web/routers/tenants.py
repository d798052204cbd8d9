"""/tenants: what an admin sets for a tenant as a whole (its budget per day or month: set,
read, deleted). Setting and deleting are an admin's (a tenant's token gets 403); a
tenant's token reads its own budget, another's being none (cairn.client.tenancy)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Response

from cairn.web.answers import Budget
from cairn.web.deps import ClientDep
from cairn.web.errors import errors
from cairn.web.models import TENANT_SCHEMA, TenantBudget

router = APIRouter(tags=["tenants"])
Tenant = Annotated[str, Path(description="The tenant's name.", json_schema_extra=TENANT_SCHEMA)]


@router.get(
    "/tenants/{tenant}/budget",
    response_model=Budget,
    responses=errors(404, why={404: "The tenant has no budget (unknown_budget)."}),
)
def tenant_budget(tenant: Tenant, client: ClientDep) -> dict[str, Any]:
    """The tenant's budget in this UTC day or month: its limits, what its runs spent since
    period_start, and what their calls in flight hold."""
    return client.tenant_budget(tenant).to_json()


@router.put(
    "/tenants/{tenant}/budget",
    response_model=Budget,
    responses=errors(
        404,
        422,
        why={
            404: "The tenant has no budget, and the request gives no limit to make it with "
            "(unknown_budget).",
            422: "The request breaks a rule of this document (invalid_request), or names "
            "no valid tenant (invalid_input).",
        },
    ),
)
def set_tenant_budget(
    tenant: Tenant, body: Annotated[TenantBudget, Body()], client: ClientDep
) -> dict[str, Any]:
    """Set the tenant's budget (what is left out is kept; a new one counts per day): every
    run of the tenant spends against it from its next model call, and its runs stopped as
    budget_exceeded go on."""
    return client.set_tenant_budget(
        tenant, usd=body.usd, tokens=body.tokens, per=body.per, soft=body.soft
    ).to_json()


@router.delete(
    "/tenants/{tenant}/budget",
    status_code=204,
    response_model=None,
    responses=errors(404, why={404: "The tenant has no budget (unknown_budget)."}),
)
def delete_tenant_budget(tenant: Tenant, client: ClientDep) -> Response:
    """Delete the tenant's budget: its runs spend against none from their next model call,
    and its runs stopped as budget_exceeded go on."""
    client.delete_tenant_budget(tenant)
    return Response(status_code=204)
