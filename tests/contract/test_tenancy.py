"""Every operation of a tenant's Client and AsyncClient, on the in-memory twins and on
Postgres, tried against another tenant's objects and the admin's (runs, approvals, rules,
budgets, schedules): each answers as its decision says (cairn.client.tenancy.OPERATIONS:
Forbidden for an admin's; for another's run, what a run that does not exist gets), no
answer holds anything of theirs, and afterwards everything of theirs is as it was: no
run cancelled, signalled, steered, rewound, resolved or forked, no approval decided, no
rule, budget or schedule changed.

The operations are the table's own: one added without a case here fails the test."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from cairn.client import AsyncClient, Client
from cairn.client.tenancy import OPERATIONS, Decision, Who
from cairn.core.errors import CairnError, Forbidden, RunIdConflict, UnknownApproval
from cairn.core.status import RunStatus
from cairn.steps import Context, StepResult, workflow
from cairn.workers import loop
from tests.helpers.contract import on_both

asker = workflow("tenancy-asker")


@asker.step()
def ask(ctx: Context) -> StepResult:
    return StepResult.wait("tenancy-ok", cursor="act", request={"tool": "refund"})


@asker.step()
def act(ctx: Context) -> StepResult:
    return StepResult(cursor="done", state={"got": ctx.signal})


@pytest.fixture(params=["memory", "pg"])
def deps(request: pytest.FixtureRequest) -> loop.Deps:
    return on_both(request)


OTHERS = ("globex", "admin")  # whose objects the tenant acme tries to reach
# What no answer to acme may hold: the others' run ids, schedule and rules' tools.
SECRETS = ("globex-run", "admin-run", "nightly", "globex-tool", "admin-tool")


@dataclasses.dataclass
class World:
    """Each owner's run (parked on its approval, with a budget), the approvals' and rules'
    ids, the admin's schedule, and globex's budget per day."""

    admin: Client
    runs: dict[str, str]
    approvals: dict[str, int]
    rules: dict[str, int]
    since: dt.datetime


def _world(deps: loop.Deps) -> World:
    admin = Client(settings=deps.settings, store=deps.store, send=lambda run_id, priority: None)
    since = deps.store.clock()
    runs = {}
    for owner, tenant in (("globex", "globex"), ("admin", None), ("acme", "acme")):
        runs[owner] = f"{owner}-run"
        assert deps.store.create_run(
            runs[owner], "tenancy-asker", {}, tenant=tenant, budget_usd=5.0
        )
        assert loop.run(runs[owner], deps) == RunStatus.WAITING
    asked = {a.run_id: a.approval_id for a in admin.approvals(limit=1000)}
    rules = {
        "globex": admin.for_tenant("globex").add_rule("tenancy-asker", "globex-tool").rule_id,
        "admin": admin.add_rule("tenancy-asker", "admin-tool").rule_id,
    }
    admin.add_schedule("nightly", "tenancy-asker", every=3600)
    admin.set_tenant_budget("globex", usd=10.0)
    return World(admin, runs, {o: asked[r] for o, r in runs.items()}, rules, since)


Call = tuple[tuple[Any, ...], dict[str, Any]]


def _calls(w: World) -> dict[str, list[Call]]:
    """Each operation, as acme calls it at the others' objects (what it has of its own,
    for the operations that take none of theirs)."""
    runs = [w.runs[o] for o in OTHERS]
    each_run = [((r,), {}) for r in runs]
    return {
        "for_tenant": [(("globex",), {})],
        "close": [((), {})],
        "problems": [((), {})],
        "enqueue": [(("tenancy-asker", {}), {"run_id": r}) for r in runs],
        "get": each_run,
        "list": [((), {"limit": 500}), ((), {"tenant": "globex"})],
        "counts": [((), {})],
        "send": each_run,
        "cancel": each_run,
        "children": each_run,
        "fork": [((r,), {"at_seq": 1}) for r in runs],
        "rewind": [((r,), {"to_seq": 1}) for r in runs],
        "forks": each_run,
        "signal": [((r, "tenancy-ok", {"rogue": True}), {"signal_id": "rogue"}) for r in runs],
        "steer": [((r, "rogue"), {}) for r in runs],
        "resolve": [((r,), {"done": True}) for r in runs],
        "wait": [((r,), {"timeout": 0.1}) for r in runs],
        "history": each_run,
        "calls": each_run,
        "events": [((r,), {"timeout": 0.1}) for r in runs],
        "events_token": each_run,
        "replay": [(("tenancy-asker",), {"since": w.since})],
        "budget": each_run,
        "raise_budget": [((r,), {"usd": 1000.0}) for r in runs],
        "tenant_budget": [(("globex",), {})],
        "set_tenant_budget": [(("globex",), {"usd": 1000.0})],
        "delete_tenant_budget": [(("globex",), {})],
        "add_schedule": [(("acme-nightly", "tenancy-asker"), {"every": 60})],
        "schedules": [((), {})],
        "pause_schedule": [(("nightly",), {})],
        "resume_schedule": [(("nightly",), {})],
        "remove_schedule": [(("nightly",), {})],
        "approvals": [((), {"limit": 1000})],
        "approval": [((w.approvals[o],), {}) for o in OTHERS],
        "decide": [((w.approvals[o], "approve"), {}) for o in OTHERS],
        "add_rule": [(("tenancy-asker", "acme-tool"), {})],
        "rules": [((), {})],
        "remove_rule": [((w.rules[o],), {}) for o in OTHERS],
    }


# What an operation that keeps the tenant to its rows in the store, or reaches none,
# answers acme: checked beside "nothing of theirs in it".
ROWS: dict[str, Callable[[Any], bool]] = {
    "counts": lambda got: got == {RunStatus.WAITING: 1},  # its own run alone
    "list": lambda got: [r.run_id for r in got] in (["acme-run"], []),
    "approvals": lambda got: [a.run_id for a in got] == ["acme-run"],
    "approval": lambda got: got is None,
    "rules": lambda got: [r.tool for r in got] == ["acme-tool"],
    "remove_rule": lambda got: got is False,
}
# What an operation of theirs may refuse acme with, beside its decision's own answer.
REFUSALS = {"enqueue": RunIdConflict, "decide": UnknownApproval}


def _expect(name: str, decision: Decision, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What the decision says acme gets: an exception, or an answer (ROWS: a check)."""
    if decision.who is Who.ADMIN:
        return Forbidden
    if decision.answer:
        return None
    if decision.checked_before is not None:
        bound = inspect.signature(getattr(Client, name)).bind(None, *args, **kwargs)
        try:
            return decision.hidden(bound.arguments[decision.checked_before])
        except CairnError as exc:
            return exc
    return ROWS.get(name, lambda got: True)


def _judge(name: str, expected: Any, outcome: Any) -> None:
    if isinstance(outcome, BaseException):
        if isinstance(expected, BaseException):
            assert (type(outcome), str(outcome)) == (type(expected), str(expected)), name
        elif isinstance(expected, type):
            assert isinstance(outcome, expected), (name, outcome)
        else:
            assert isinstance(outcome, REFUSALS[name]), (name, outcome)
        return
    assert not isinstance(expected, (BaseException, type)), (name, outcome)
    assert not any(s in repr(outcome) for s in SECRETS), (name, outcome)
    if callable(expected):
        assert expected(outcome), (name, outcome)
    else:
        assert outcome == expected, (name, outcome)


def _untouched(deps: loop.Deps, w: World) -> None:
    """Everything of globex's and the admin's is as it was."""
    admin = w.admin
    for owner in OTHERS:
        run_id = w.runs[owner]
        run = deps.store.get(run_id)
        assert run is not None and run.status == RunStatus.WAITING, run
        assert run.tenant == (None if owner == "admin" else owner)
        assert deps.store.steers_pending(run_id) == []
        assert deps.store.forks(run_id) == []
        budget = deps.store.budget(run_id)
        assert budget is not None and budget.limit_usd == 5.0
        # No signal of acme's was stored: the same id is new now.
        assert deps.store.signal(run_id, "x", None, "rogue", None) == (RunStatus.WAITING, True)
        approval = admin.approval(w.approvals[owner])
        assert approval is not None and approval.waiting and approval.decision is None
    assert {r.rule_id for r in admin.rules()} >= set(w.rules.values())
    [schedule] = admin.schedules()
    assert (schedule.name, schedule.paused) == ("nightly", False)
    assert admin.tenant_budget("globex").limit_usd == 10.0


def test_a_tenants_client_reaches_nothing_of_another_tenants_nor_of_the_admins(
    deps: loop.Deps,
) -> None:
    w = _world(deps)
    acme = w.admin.for_tenant("acme")
    calls = _calls(w)
    assert sorted(calls) == sorted(OPERATIONS), "an operation without a case here"
    for name, made in calls.items():
        for args, kwargs in made:
            expected = _expect(name, OPERATIONS[name], args, kwargs)
            try:
                outcome = getattr(acme, name)(*args, **kwargs)
            except CairnError as exc:
                outcome = exc
            _judge(name, expected, outcome)
    _untouched(deps, w)


def test_a_tenants_async_client_reaches_nothing_of_another_tenants_nor_of_the_admins(
    deps: loop.Deps,
) -> None:
    w = _world(deps)
    calls = _calls(w)

    async def main() -> None:
        async with AsyncClient(
            settings=deps.settings, store=deps.store, send=lambda run_id, priority: None
        ) as admin:
            acme = admin.for_tenant("acme")
            for name, made in calls.items():
                method = getattr(acme, name)
                for args, kwargs in made:
                    expected = _expect(name, OPERATIONS[name], args, kwargs)
                    try:
                        if inspect.isasyncgenfunction(method):
                            outcome: Any = [e async for e in method(*args, **kwargs)]
                        elif inspect.iscoroutinefunction(method):
                            outcome = await method(*args, **kwargs)
                        else:
                            outcome = method(*args, **kwargs)
                    except CairnError as exc:
                        outcome = exc
                    _judge(name, expected, outcome)

    asyncio.run(main())
    _untouched(deps, w)


def test_a_decision_names_the_token_and_tenant_that_made_it(deps: loop.Deps) -> None:
    """The audit row of a decision says who made it: a tenant's Client, a server's view
    of a `cairn tokens` token (its id, and its tenant or none), the admin, or a name."""
    w = _world(deps)
    runs = {}
    for k, tenant in enumerate(("acme", "acme", None, None)):
        runs[k] = f"more-{k}"
        assert deps.store.create_run(runs[k], "tenancy-asker", {}, tenant=tenant)
        assert loop.run(runs[k], deps) == RunStatus.WAITING
    asked = {a.run_id: a.approval_id for a in w.admin.approvals(limit=1000)}
    deciders = [
        (w.admin.for_tenant("acme"), "acme-run", ("tenant acme", None, "acme")),
        (w.admin.for_tenant("acme", token_id="t1"), runs[0], ("token t1", "t1", "acme")),
        (w.admin.for_tenant(None, token_id="t2"), runs[2], ("token t2", "t2", None)),
        (w.admin, runs[3], ("admin", None, None)),
    ]
    for client, run_id, said in deciders:
        decided = client.decide(asked[run_id], "approve").decision
        assert decided is not None
        assert (decided.decided_by, decided.decided_token, decided.decided_tenant) == said
        assert decided.payload["by"] == said[0]  # the run reads who decided, too
    named = w.admin.for_tenant("acme").decide(asked[runs[1]], "deny", by="ops@acme").decision
    assert named is not None and (named.decided_by, named.decided_tenant) == ("ops@acme", "acme")


def test_a_cancel_names_who_asked_and_a_rewind_forgets_it(deps: loop.Deps) -> None:
    admin = Client(settings=deps.settings, store=deps.store, send=lambda run_id, priority: None)
    for run_id in ("c1", "c2", "c3"):
        assert deps.store.create_run(run_id, "tenancy-asker", {}, tenant="acme")
    assert loop.run("c3", deps) == RunStatus.WAITING  # a step saved: one to rewind to
    view = admin.for_tenant("acme", token_id="t1")
    assert view.cancel("c1").cancelled_by == "token t1"
    assert admin.cancel("c1", "again", by="ops").cancelled_by == "token t1"  # the first's
    assert admin.for_tenant("acme").cancel("c2", by="ops@acme").cancelled_by == "ops@acme"
    assert admin.cancel("c3").cancelled_by == "admin"
    assert "cancelled_by" not in admin.list()[0].to_json()  # a list's row leaves it out
    assert admin.get("c3").to_json()["cancelled_by"] == "admin"  # type: ignore[union-attr]
    assert admin.rewind("c3", to_seq=1).cancelled_by is None  # going again: nobody's cancel
