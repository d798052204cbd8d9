"""Who may do what: the one table of tenancy decisions, consulted by every surface, as
Django's ModelAdmin.has_*_permission methods are by every admin view.

OPERATIONS gives each public method of Client (and so of AsyncClient, its face for asyncio)
a Decision: who may ask for it, and how another tenant's rows stay out of a tenant's
reach. Client takes it before each call (`enforced`, at the class's creation: a public
method without one is an error at import). ROUTES gives each HTTP route and page the
operation whose decision it takes, or one of its own: create_app refuses a route without
one, and a dependency of every route refuses a tenant's token an admin's route (403)
before the route runs (cairn.web.tenancy). COMMANDS gives each `cairn` command its own:
the CLI proves nothing but the database's URL, so each is the admin's.

tests/unit/test_tenancy.py enumerates the methods, routes and commands from the code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from cairn.core.errors import Forbidden, UnknownBudget, UnknownRun

if TYPE_CHECKING:
    from cairn.store.contract import CheckpointStore

C = TypeVar("C", bound=type)


class Who(enum.Enum):
    """Who may ask for an operation."""

    OPEN = "open"  # anyone, no token asked: nothing of any tenant's
    ANY = "any"  # any token, a tenant's too: it reaches no tenant's rows
    OWN = "own"  # a tenant on its own rows only (another's are none); an admin on all
    ADMIN = "admin"  # an admin only: a tenant's Client gets Forbidden, its token a 403
    DATABASE = "database"  # the CLI: the database's URL is the admin's, every row


def _unknown_run(run_id: Any) -> Any:
    raise UnknownRun(f"no run {run_id!r}")


def no_budget(tenant: Any) -> str:
    """What a tenant with no budget gets, another tenant's too (nothing tells them apart)."""
    return (
        f"tenant {tenant!r} has no budget: cairn budgets set --tenant {tenant} --usd N "
        "--per day gives it one"
    )


def _unknown_budget(tenant: Any) -> Any:
    raise UnknownBudget(no_budget(tenant))


def _empty(_: Any) -> list[Any]:
    return []


@dataclasses.dataclass(frozen=True)
class Decision:
    """One operation's decision. who: who may ask. For OWN, how a tenant is kept to its own
    rows: run (or tenant) names the argument the decision checks before the call, and
    hidden(value) answers another tenant's as it answers none (raises UnknownRun, or gives
    None or []); answer: the Run the call answers is checked, another tenant's being None;
    none of these: the store's query takes the tenant (filtered in SQL, and in the
    in-memory twin), or what is made is the tenant's."""

    who: Who
    why: str
    run: str | None = None
    tenant: str | None = None
    hidden: Callable[[Any], Any] = _unknown_run
    answer: bool = False  # OWN: the answer (a Run) is checked after the call instead

    @property
    def checked_before(self) -> str | None:
        """The argument checked before the call, if any."""
        return self.run or self.tenant


def _own_run(why: str, hidden: Callable[[Any], Any] = _unknown_run) -> Decision:
    return Decision(Who.OWN, why, run="run_id", hidden=hidden)


def _own_rows(why: str) -> Decision:
    return Decision(Who.OWN, why)


def _admin(why: str) -> Decision:
    return Decision(Who.ADMIN, why)


_SCHEDULES = _admin(
    "a schedule has no tenant: the runs it starts are the admin's, its name one namespace for all"
)

# Client's public methods. AsyncClient has the same (tests/unit/test_client_parity.py).
OPERATIONS: dict[str, Decision] = {
    "for_tenant": Decision(
        Who.ANY,
        "a view of the same Client: whoever holds a Client holds the database's URL, the "
        "admin's; a tenant narrows what the view reaches, for the code that is given it",
    ),
    "close": Decision(Who.ANY, "closes what this Client opened"),
    "problems": Decision(Who.ANY, "whether Postgres and the broker answer"),
    # runs
    "enqueue": _own_rows("the run is the tenant's (its debounce and concurrency keys too)"),
    "get": Decision(Who.OWN, "another tenant's run is none", answer=True),
    "list": _own_rows("the store lists the tenant's runs alone"),
    "counts": _own_rows("the store counts the tenant's runs alone"),
    "send": _own_run("another tenant's run is no run"),
    "cancel": _own_run("another tenant's run is no run"),
    "children": _own_run("another tenant's run has none", _empty),
    "fork": _own_run("another tenant's run is no run; the fork is its origin's tenant's"),
    "rewind": _own_run("another tenant's run is no run"),
    "forks": _own_run("another tenant's run has none", _empty),
    "signal": _own_run("another tenant's run is no run"),
    "steer": _own_run("another tenant's run is no run"),
    "resolve": _own_run("another tenant's run is no run"),
    "wait": _own_run("another tenant's run is no run"),
    "history": _own_run("another tenant's run has none", _empty),
    "calls": _own_run("another tenant's run has none", _empty),
    "events": _own_run("another tenant's run is no run"),
    "events_token": _own_run("another tenant's run is no run"),
    "replay": _admin("a replay re-arms every tenant's failed runs of a workflow"),
    # budgets
    "budget": _own_run("another tenant's run is no run"),
    "raise_budget": _own_run("another tenant's run is no run"),
    "tenant_budget": Decision(
        Who.OWN,
        "a tenant reads its own budget; another's is none",
        tenant="tenant",
        hidden=_unknown_budget,
    ),
    "set_tenant_budget": _admin("a tenant's limits are set for it, not by it"),
    "delete_tenant_budget": _admin("a tenant's limits are set for it, not by it"),
    # schedules
    "add_schedule": _SCHEDULES,
    "schedules": _SCHEDULES,
    "pause_schedule": _SCHEDULES,
    "resume_schedule": _SCHEDULES,
    "remove_schedule": _SCHEDULES,
    # approvals
    "approvals": _own_rows("the store lists the approvals of the tenant's runs alone"),
    "approval": _own_rows("another tenant's approval is none"),
    "decide": _own_rows(
        "the decide statement finds the tenant's approvals alone; its audit row names the "
        "token and tenant that decided"
    ),
    "add_rule": _own_rows("the rule decides the tenant's runs alone"),
    "rules": _own_rows("the store lists the tenant's rules alone"),
    "remove_rule": _own_rows("the delete finds the tenant's rules alone"),
}


def _open(why: str) -> Decision:
    return Decision(Who.OPEN, why)


def _any(why: str) -> Decision:
    return Decision(Who.ANY, why)


# Every route of the app, "METHOD /path" as the app declares it (a page's too): the name
# of the Client operation whose decision it takes, or its own. An OPEN one is what
# cairn.web.auth.OPEN_PATHS lets in without a token.
ROUTES: dict[str, str | Decision] = {
    "POST /runs": "enqueue",
    "GET /runs": "list",
    "GET /counts": "counts",
    "GET /runs/{run_id}": "get",
    "GET /runs/{run_id}/children": "children",
    "GET /runs/{run_id}/steps": "history",
    "GET /runs/{run_id}/calls": "calls",
    "POST /runs/{run_id}/cancel": "cancel",
    "POST /runs/{run_id}/fork": "fork",
    "POST /runs/{run_id}/rewind": "rewind",
    "GET /runs/{run_id}/forks": "forks",
    "POST /runs/replay": "replay",
    "POST /runs/{run_id}/resolve": "resolve",
    "GET /runs/{run_id}/budget": "budget",
    "POST /runs/{run_id}/budget": "raise_budget",
    "GET /runs/{run_id}/events": "events",
    "POST /runs/{run_id}/events/token": "events_token",
    "POST /runs/{run_id}/signals/{event}": "signal",
    "POST /runs/{run_id}/steer": "steer",
    "GET /approvals": "approvals",
    "GET /approvals/{approval_id}": "approval",
    "POST /approvals/{approval_id}/decision": "decide",
    "GET /schedules": "schedules",
    "POST /schedules": "add_schedule",
    "POST /schedules/{name}/pause": "pause_schedule",
    "POST /schedules/{name}/resume": "resume_schedule",
    "DELETE /schedules/{name}": "remove_schedule",
    "GET /tenants/{tenant}/budget": "tenant_budget",
    "PUT /tenants/{tenant}/budget": "set_tenant_budget",
    "DELETE /tenants/{tenant}/budget": "delete_tenant_budget",
    "GET /healthz": _open("a load balancer's probe: whether the services answer"),
    "GET /metrics": _admin("the fleet's metrics count every tenant's runs"),
    # The pages.
    "GET /": _any("a redirect to the runs page"),
    "GET /login": _open("the login form"),
    "POST /login": _open("a token in, a page session of that token out"),
    "POST /logout": _open("ends the browser's page session, by its own page's button"),
    "GET /ui/runs": "list",
    "GET /ui/runs/{run_id:path}": "get",
    "GET /ui/approvals": "approvals",
    "MOUNT /static": _open("the pages' CSS and JS"),
    "GET /docs": _any("the API's document, as a page"),
    # FastAPI's own: the API's document, the same for every token.
    "GET /openapi.json": _any("the API's document"),
}

_DB = Decision(
    Who.DATABASE,
    "the CLI proves nothing but the database's URL (CAIRN_DATABASE_URL, --database-url), "
    "which reads and changes every tenant's rows: its Client has no tenant",
)
_NOTHING = Decision(Who.ANY, "reads and changes no tenant's rows: nothing to decide")

# Every `cairn` command, by its path. The CLI acts as the admin: a tenant acts through the
# API with its token (docs/guides/tenants.md).
_ON_THE_DATABASE = (
    "worker", "beat", "serve", "demo", "chaos run", "chaos mix",
    "runs", "runs list", "runs enqueue", "runs show", "runs events", "runs signal",
    "runs steer", "runs cancel", "runs resolve", "runs raise-budget", "runs fork",
    "runs rewind", "runs replay", "runs export",
    "schedules add", "schedules list", "schedules pause", "schedules resume",
    "schedules remove",
    "approvals list", "approvals approve", "approvals deny", "approvals edit",
    "approvals rule add", "approvals rule list", "approvals rule remove",
    "budgets set", "budgets show", "budgets delete",
    "db check", "db upgrade", "db rotate-key",
    "tokens create", "tokens list", "tokens revoke",
    "deploy check", "deploy status", "deploy drain",
    # `cairn runs ...`'s old spellings, hidden for one release
    "enqueue", "show", "events", "signal", "cancel", "resolve",
)  # fmt: skip
COMMANDS: dict[str, Decision] = {
    **dict.fromkeys(_ON_THE_DATABASE, _DB),
    "db new-key": _NOTHING,
    "settings": _NOTHING,
    "standin": _NOTHING,
}


def route_decision(key: str) -> Decision:
    """The decision of the route "METHOD /path" (KeyError: it has none)."""
    found = ROUTES[key]
    return OPERATIONS[found] if isinstance(found, str) else found


def forbidden(name: str, decision: Decision) -> Forbidden:
    return Forbidden(f"{name} is an admin's ({decision.why}): use a Client with no tenant")


def hides(store: CheckpointStore, tenant: str, decision: Decision, value: Any) -> bool:
    """Whether decision keeps `value` (the argument it checks) from the tenant: a run of
    another tenant's (or none), a tenant not its own."""
    if decision.run is not None:
        run = store.get(value) if isinstance(value, str) else None
        return run is None or run.tenant != tenant
    return bool(value != tenant)


def _bound(method: Callable[..., Any], name: str) -> Callable[..., Any]:
    """The value of the argument `name` in a call of method."""
    signature = inspect.signature(method)

    def value(*args: Any, **kwargs: Any) -> Any:
        return signature.bind(*args, **kwargs).arguments[name]

    return value


def _public(cls: type) -> dict[str, Any]:
    return {n: v for n, v in inspect.getmembers(cls) if not n.startswith("_") and callable(v)}


def _decision(cls: type, name: str) -> Decision:
    try:
        return OPERATIONS[name]
    except KeyError:
        raise TypeError(
            f"{cls.__name__}.{name} has no tenancy decision: add one to "
            "cairn.client.tenancy.OPERATIONS"
        ) from None


def enforced(cls: C) -> C:
    """Client with each public method taking its decision (OPERATIONS) before the call."""
    for name, method in _public(cls).items():
        decision = _decision(cls, name)
        if decision.who is Who.ADMIN:
            setattr(cls, name, _admin_only(name, method, decision))
        elif decision.checked_before is not None:
            setattr(cls, name, _own_only(method, decision))
        elif decision.answer:
            setattr(cls, name, _own_answer(method))
    return cls


def _own_answer(method: Callable[..., Any]) -> Any:
    @functools.wraps(method)
    def own_answer(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        found = method(self, *args, **kwargs)
        if found is None or self.tenant is None or found.tenant == self.tenant:
            return found
        return None

    return own_answer


def _admin_only(name: str, method: Callable[..., Any], decision: Decision) -> Any:
    @functools.wraps(method)
    def admin_only(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        if self.tenant is not None:
            raise forbidden(name, decision)
        return method(self, *args, **kwargs)

    return admin_only


def _own_only(method: Callable[..., Any], decision: Decision) -> Any:
    assert decision.checked_before is not None
    value = _bound(method, decision.checked_before)

    @functools.wraps(method)
    def own_only(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        if self.tenant is not None:
            given = value(self, *args, **kwargs)
            if hides(self.store, self.tenant, decision, given):
                return decision.hidden(given)
        return method(self, *args, **kwargs)

    return own_only


def enforced_async(cls: C) -> C:
    """AsyncClient with each of its own public methods (not one of Client's run in a
    thread, which takes Client's decision there) taking its decision before the call:
    the check made in a worker thread, as it reads the store."""
    for name, method in _public(cls).items():
        decision = _decision(cls, name)
        if "client_method" in vars(method):
            continue
        if decision.who is Who.ADMIN or decision.checked_before is not None:
            setattr(cls, name, _checked_async(name, method, decision))
    return cls


def _checked_async(name: str, method: Callable[..., Any], decision: Decision) -> Any:
    value = _bound(method, decision.checked_before) if decision.checked_before else None

    async def hidden(self: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]:
        """(True, what to answer) when the decision keeps the call from this client."""
        if self.tenant is None:
            return False, None
        if decision.who is Who.ADMIN:
            raise forbidden(name, decision)
        assert value is not None
        given = value(self, *args, **kwargs)
        if await asyncio.to_thread(hides, self.store, self.tenant, decision, given):
            return True, decision.hidden(given)
        return False, None

    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def checked_stream(self: Any, /, *args: Any, **kwargs: Any) -> Any:
            if (await hidden(self, args, kwargs))[0]:
                return
            async for item in method(self, *args, **kwargs):
                yield item

        return checked_stream

    @functools.wraps(method)
    async def checked(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        refused, answer = await hidden(self, args, kwargs)
        if refused:
            return answer
        return await method(self, *args, **kwargs)

    return checked
