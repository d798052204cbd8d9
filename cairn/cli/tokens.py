"""`cairn tokens`: API tokens for `cairn serve`, each a tenant's (it sees that tenant's
runs only) or an admin's (all runs); shown once, kept hashed, revocable."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from cairn.cli.common import AsJson, DatabaseUrl, console, dumps, fail, load_settings

if TYPE_CHECKING:
    from cairn.store.db import Database

app = typer.Typer(
    help="API tokens: a tenant's (its runs only) or an admin's (every run).",
    no_args_is_help=True,
)


def _database(database_url: str | None) -> Database:
    from cairn.store.db import Database

    settings = load_settings(database_url=database_url)
    return Database(settings.database_url, max_size=1, give_up_after=settings.client_give_up_after)


@app.command("create")
def tokens_create(
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="The tenant whose runs it reaches.")
    ] = None,
    name: Annotated[str, typer.Option("--name", help="What it is for (shown by list).")] = "",
    admin: Annotated[bool, typer.Option("--admin", help="It reaches every run.")] = False,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Create a token and print it: this is the only time it is shown."""
    from cairn.core.errors import CairnError
    from cairn.core.inputs import check_tenant
    from cairn.store.tokens import Tokens

    if admin == (tenant is not None):
        fail("give --tenant NAME (its runs only) or --admin (every run), one of the two", 2)
    try:
        if tenant is not None:
            check_tenant(tenant)
        db = _database(database_url)
        try:
            record, token = Tokens(db).create(tenant, name, admin=admin)
        finally:
            db.close()
    except CairnError as exc:
        fail(exc, 2)
    if as_json:
        print(dumps({**record.to_json(), "token": token}))
        return
    scope = "admin (every run)" if admin else f"tenant {tenant}"
    console.print(f"token {record.id} for {scope}; it is shown only now:", highlight=False)
    print(token)


@app.command("list")
def tokens_list(as_json: AsJson = False, database_url: DatabaseUrl = None) -> None:
    """List the tokens (never their secrets), revoked ones with when."""
    from cairn.core.errors import CairnError
    from cairn.store.tokens import Tokens

    try:
        db = _database(database_url)
        try:
            found = Tokens(db).list_tokens()
        finally:
            db.close()
    except CairnError as exc:
        fail(exc, 2)
    if as_json:
        print(dumps({"tokens": [t.to_json() for t in found]}))
        return
    table = Table("id", "tenant", "name", "created", "revoked")
    for t in found:
        table.add_row(
            t.id,
            "(admin)" if t.admin else t.tenant or "",
            t.name,
            t.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            t.revoked_at.strftime("%Y-%m-%d %H:%M:%S") if t.revoked_at else "",
        )
    console.print(table)


@app.command("revoke")
def tokens_revoke(
    token_id: Annotated[str, typer.Argument(help="The token's id (cairn tokens list).")],
    database_url: DatabaseUrl = None,
) -> None:
    """Revoke a token: a server refuses it within seconds."""
    from cairn.core.errors import CairnError
    from cairn.store.tokens import Tokens

    try:
        db = _database(database_url)
        try:
            found = Tokens(db).revoke(token_id)
        finally:
            db.close()
    except CairnError as exc:
        fail(exc, 2)
    if found is None:
        fail(f"no token {token_id!r}; `cairn tokens list` lists them", 1)
    console.print(f"token {token_id} revoked", highlight=False)
