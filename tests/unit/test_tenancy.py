"""Every surface has a tenancy decision, found from the code itself: Client's and
AsyncClient's public methods (inspection), the app's routes and pages (its router, and
its OpenAPI document, which names each operation's), and the `cairn` command tree
(typer's). A method, route or command added without one fails here; and each surface
takes the one table's decision (cairn.client.tenancy), not one of its own.

What each decision does is tested by behaviour: tests/contract/test_tenancy.py (Client
and AsyncClient on both stores), tests/integration/test_tenants_api.py (HTTP, pages, CLI).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import typer

from cairn.client import AsyncClient, Client, tenancy
from cairn.client.tenancy import COMMANDS, OPERATIONS, ROUTES, Who
from cairn.core.errors import Forbidden, UnknownRun
from cairn.core.settings import Settings
from cairn.testing import MemoryStore

UNUSED = Settings(
    database_url="postgresql://unused.invalid/x", redis_url="redis://unused.invalid/0"
)


def _public(cls: type) -> dict[str, Any]:
    return {n: v for n, v in inspect.getmembers(cls) if not n.startswith("_") and callable(v)}


def test_every_public_method_of_client_has_a_decision_and_takes_it() -> None:
    methods = _public(Client)
    assert sorted(methods) == sorted(OPERATIONS), "Client's methods and OPERATIONS differ"
    for name, method in methods.items():
        decision = OPERATIONS[name]
        wrapped = decision.who is Who.ADMIN or decision.checked_before or decision.answer
        # Taken by the wrapper `enforced` put there, or (the store filters by tenant, or
        # nothing of a tenant's) by the method itself, which is the mixin's own.
        assert (getattr(method, "__wrapped__", None) is not None) == bool(wrapped), name
        if decision.checked_before:
            assert decision.checked_before in inspect.signature(method).parameters, name


def test_every_public_method_of_async_client_takes_the_same_decision() -> None:
    """Each of AsyncClient's is Client's run in a thread (Client takes the decision there),
    or its own, wrapped by the same table's decision when that needs a check."""
    methods = _public(AsyncClient)
    assert sorted(methods) == sorted(OPERATIONS)
    own = set()
    for name, method in methods.items():
        threaded = vars(method).get("client_method")
        if threaded is not None:
            assert threaded is getattr(Client, name), name
            continue
        own.add(name)
        decision = OPERATIONS[name]
        if decision.who is Who.ADMIN or decision.checked_before:
            assert getattr(method, "__wrapped__", None) is not None, name
    assert own == {"close", "enqueue", "events", "for_tenant", "wait"}


def test_a_client_method_without_a_decision_is_refused_at_import() -> None:
    class Grown(Client):
        def purge_everything(self) -> None:
            """A new operation nobody decided for."""

    with pytest.raises(TypeError, match=r"Grown\.purge_everything has no tenancy decision"):
        tenancy.enforced(Grown)


def test_a_tenants_client_is_refused_every_admins_operation_before_it_runs() -> None:
    """Without a service: the refusal comes before the store or the broker is touched."""
    store = MemoryStore()
    acme = Client(settings=UNUSED, store=store, tenant="acme")
    admin_ops = sorted(n for n, d in OPERATIONS.items() if d.who is Who.ADMIN)
    assert admin_ops == [
        "add_schedule", "delete_tenant_budget", "pause_schedule", "remove_schedule", "replay",
        "resume_schedule", "schedules", "set_tenant_budget",
    ]  # fmt: skip
    for name in admin_ops:
        with pytest.raises(Forbidden, match=f"^{name} is an admin's"):
            getattr(acme, name)(*(["x"] * _required(getattr(Client, name))))
    with pytest.raises(UnknownRun):
        acme.send("nobodys-run")  # another's or none: no run, and nothing sent


def _required(method: Any) -> int:
    params = list(inspect.signature(method).parameters.values())[1:]
    return sum(
        p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        for p in params
    )


# -- the routes and pages ------------------------------------------------------------------


@pytest.fixture(scope="module")
def app() -> Iterator[Any]:
    from cairn.web.api import create_app

    built = create_app(UNUSED, insecure_no_auth=True)
    yield built
    built.state.client.close()


def test_every_route_and_page_of_the_app_has_a_decision(app: Any) -> None:
    from cairn.web import tenancy as web

    found = list(web.keys(app))
    assert len(found) == len(set(found))
    assert sorted(found) == sorted(ROUTES)
    for key, decision in ROUTES.items():
        if isinstance(decision, str):
            assert decision in OPERATIONS, key  # a route takes an operation's decision
    # The document: every operation names its decision, the table's.
    document = app.openapi()
    operations = 0
    for path, ops in document["paths"].items():
        for method, op in ops.items():
            decision = tenancy.route_decision(f"{method.upper()} {path}")
            assert op["x-cairn-tenancy"] == {"who": decision.who.value, "why": decision.why}
            if decision.who is Who.ADMIN:
                assert "an admin's" in op["responses"]["403"]["description"], (method, path)
            operations += 1
    assert operations == 32
    pages = [k for k in found if k.split(" ", 1)[1] not in document["paths"]]
    assert len(pages) == 10  # 8 pages (the document's /docs one), the static files, /openapi.json


def test_an_open_route_is_one_the_guard_lets_in_and_no_other(app: Any) -> None:
    from cairn.web.auth import OPEN_PATHS

    for key in ROUTES:
        path = key.split(" ", 1)[1]
        probe = path + "/app.css" if key.startswith("MOUNT") else path
        decision = tenancy.route_decision(key)
        assert (decision.who is Who.OPEN) == bool(OPEN_PATHS.match(probe)), key


def test_an_app_with_a_route_without_a_decision_is_not_built(app: Any) -> None:
    from fastapi import FastAPI

    from cairn.web import tenancy as web

    grown = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    grown.router.routes.extend(app.router.routes)

    @grown.get("/tenants/{tenant}/export")
    def export(tenant: str) -> dict[str, str]:
        return {}

    with pytest.raises(RuntimeError, match=r"without a tenancy decision: \['GET /tenants/"):
        web.check(grown)


# -- the command line ----------------------------------------------------------------------


def _commands() -> Iterator[str]:
    """Every command of `cairn`, the hidden ones and the plugins' too, by path; a group
    that runs something of its own with no command (`cairn runs`) is one too."""
    from cairn import cli

    cli._register_plugins([])
    root = typer.main.get_command(cli.app)

    def walk(command: Any, path: list[str]) -> Iterator[str]:
        children = getattr(command, "commands", None)
        if children is None:
            yield " ".join(path)
            return
        if path and getattr(command, "invoke_without_command", False):
            yield " ".join(path)
        for name, child in children.items():
            yield from walk(child, [*path, name])

    return walk(root, [])


def test_every_cli_command_has_a_decision() -> None:
    """The CLI proves nothing but the database's URL: a command is the admin's (it opens
    a Client with no tenant), or touches no tenant's rows."""
    found = list(_commands())
    assert sorted(found) == sorted(COMMANDS)
    assert {d.who for d in COMMANDS.values()} == {Who.DATABASE, Who.ANY}
