"""`cairn budgets`: a tenant's budget per UTC day or month, set, shown and deleted (an
admin's: the Client these commands open has no tenant). A run tree's budget is `cairn
runs raise-budget`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cairn.cli.common import AsJson, DatabaseUrl, console, dumps, load_settings, open_client

if TYPE_CHECKING:
    from cairn.core.records import Budget

app = typer.Typer(
    help="A tenant's budget per day or month: set it, show it, delete it.", no_args_is_help=True
)

Tenant = Annotated[str, typer.Option("--tenant", help="The tenant whose runs it counts.")]


@app.command("set")
def budgets_set(
    tenant: Tenant,
    usd: Annotated[
        float | None, typer.Option("--usd", help="The limit per period, in dollars.")
    ] = None,
    tokens: Annotated[
        int | None, typer.Option("--tokens", help="The limit per period, in model tokens.")
    ] = None,
    per: Annotated[
        str | None,
        typer.Option("--per", help="day or month (UTC) [kept; day for a new budget]."),
    ] = None,
    soft: Annotated[
        float | None,
        typer.Option("--soft", help="The fraction of each limit whose crossing is an event."),
    ] = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Give a tenant a budget per day or month, or change it; its runs stopped as
    budget_exceeded go on."""
    with open_client(load_settings(database_url=database_url)) as client:
        budget = client.set_tenant_budget(tenant, usd=usd, tokens=tokens, per=per, soft=soft)
    _show(budget, as_json)


@app.command("show")
def budgets_show(tenant: Tenant, as_json: AsJson = False, database_url: DatabaseUrl = None) -> None:
    """A tenant's budget: its limits, and what its runs spent this day or month."""
    with open_client(load_settings(database_url=database_url)) as client:
        budget = client.tenant_budget(tenant)
    _show(budget, as_json)


@app.command("delete")
def budgets_delete(
    tenant: Tenant, as_json: AsJson = False, database_url: DatabaseUrl = None
) -> None:
    """Delete a tenant's budget: its runs spend against none, and those stopped as
    budget_exceeded go on. Shows the budget as it stood."""
    with open_client(load_settings(database_url=database_url)) as client:
        budget = client.delete_tenant_budget(tenant)
    if as_json:
        print(dumps({"deleted": budget.to_json()}))
        return
    console.print(f"deleted {budget.scope}; it stood at:", highlight=False)
    _show(budget, as_json)


def _show(budget: Budget, as_json: bool) -> None:
    if as_json:
        print(dumps({"budget": budget.to_json()}))
        return
    shown = []
    if budget.limit_usd is not None:
        shown.append(
            f"limit ${budget.limit_usd:.6f}, spent ${budget.spent_usd:.6f}, "
            f"in flight ${budget.reserved_usd:.6f}"
        )
    if budget.limit_tokens is not None:
        shown.append(
            f"limit {budget.limit_tokens} tokens, spent {budget.spent_tokens}, "
            f"in flight {budget.reserved_tokens}"
        )
    since = budget.period_start.strftime("%Y-%m-%d") if budget.period_start else "?"
    soft = f"; soft at {budget.soft:g}" if budget.soft is not None else ""
    console.print(
        f"{budget.scope} per {budget.period} since {since} UTC: " + "; ".join(shown) + soft,
        highlight=False,
    )
