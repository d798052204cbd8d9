"""Budgets over a run tree (Client.enqueue(budget_usd=...)): the hard check before each
model call, counted over the parent and its children; the spend a journaled call adds
once, never again on replay; the soft limit's event; raise_budget resuming the tree."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from cairn.core import errors
from cairn.steps.prices import tokens_of
from cairn.testing.standins import ModelServer
from cairn.workers import loop
from cairn.workers.middleware import Chain, Middleware
from tests.helpers.holds import Racer, held_inside
from tests.helpers.runs import wait_for


@pytest.fixture(autouse=True)
def _flows() -> None:
    import tests.helpers.budget_flows  # noqa: F401  (registers spender, spend)


def _run(run_id: str, deps: loop.Deps) -> str:
    """Deliver the run in process until it stops or waits (a retry: again, at once)."""
    for _ in range(10):
        try:
            return str(loop.run(run_id, deps))
        except errors.RetryLater:
            time.sleep(0.05)
    raise AssertionError(f"run {run_id} kept retrying")


def _worst(deps: loop.Deps, tag: str) -> float:
    assert deps.model is not None
    return deps.model.worst_cost(
        messages=[{"role": "user", "content": f"REPLY: ok {tag}"}], max_tokens=16
    )


def _journaled(client: Any, run_ids: list[str]) -> float:
    return sum(c.cost_usd for rid in run_ids for c in client.calls(rid))


def test_a_tree_stops_before_the_call_that_would_pass_its_budget_and_goes_on_when_raised(
    client, deps, model: ModelServer
) -> None:
    worst = _worst(deps, "0-0")
    # Room for a few calls (each settles at its usage, below its worst case), not for
    # the six children's eighteen.
    parent = client.enqueue("spender", {"children": 6, "calls": 3}, budget_usd=2.5 * worst)
    assert _run(parent, deps) == "waiting"
    kids = [k.run_id for k in client.children(parent)]
    statuses = [_run(k, deps) for k in kids]
    assert "done" in statuses and "budget_exceeded" in statuses
    stopped = client.get(kids[statuses.index("budget_exceeded")])
    assert f"budget run:{parent}" in stopped.error and "over its limit" in stopped.error
    budget = client.budget(parent)
    assert budget.spent_usd == pytest.approx(_journaled(client, kids))
    assert budget.spent_usd <= budget.limit_usd < budget.spent_usd + worst
    assert budget.reserved_usd == pytest.approx(0)
    made = sum(len(client.calls(k)) for k in kids)
    assert model.stats()["requests"] == made  # refused before the call, not after
    # The parent went on once its children stopped, and stopped at its own call.
    assert _run(parent, deps) == "budget_exceeded"

    raised = client.raise_budget(parent, usd=100 * worst)
    assert raised.limit_usd == pytest.approx(100 * worst)
    for rid in [parent, *kids]:
        assert client.get(rid).status in ("pending", "done")
    assert all(_run(k, deps) == "done" for k in kids)
    assert _run(parent, deps) == "done"
    assert client.budget(parent).spent_usd == pytest.approx(_journaled(client, [parent, *kids]))
    assert model.stats()["requests"] == 6 * 3 + 1


def test_a_replayed_call_adds_nothing_to_the_spend(
    client, deps, model: ModelServer, tmp_path
) -> None:
    child = {"fail_once": str(tmp_path)}
    parent = client.enqueue(
        "spender", {"children": 2, "calls": 2, "child": child}, budget_usd=1.0, budget_soft=0.5
    )
    assert _run(parent, deps) == "waiting"
    kids = [k.run_id for k in client.children(parent)]
    assert all(_run(k, deps) == "done" for k in kids)  # each failed once, then replayed
    assert model.stats()["requests"] == 4  # the retries' calls came from the journal
    spent = client.budget(parent).spent_usd
    assert spent > 0 and spent == pytest.approx(_journaled(client, kids))


def test_the_soft_limit_is_crossed_once(client, deps, model: ModelServer) -> None:
    crossed: list[tuple[str, str]] = []

    class Seen(Middleware):
        def budget_crossed(self, cp: Any, scope: str) -> None:
            crossed.append((cp.run_id, scope))

    deps = dataclasses.replace(deps, middleware=Chain([Seen()]))
    worst = _worst(deps, "0-0")
    parent = client.enqueue(
        "spender", {"children": 2, "calls": 3}, budget_usd=100 * worst, budget_soft=1e-6
    )
    _run(parent, deps)
    kids = [k.run_id for k in client.children(parent)]
    assert all(_run(k, deps) == "done" for k in kids)
    assert crossed == [(kids[0], f"run:{parent}")]  # its first call crossed it; no other


def test_runs_of_a_tree_checking_at_once_never_pass_its_limit(client, store, db_url) -> None:
    """Three calls checked at once against room for two, made to meet inside the check (a
    trigger holds each hold's insert: its budget read, its hold not yet written) or queued
    behind one that is, on the budget's row lock. Without the lock all three read the same
    room and pass, every time; with it they are checked one after the other."""
    parent = client.enqueue("spender", {}, budget_usd=2.0)
    cp = store.load(parent)
    with held_inside(db_url, "budget_holds") as gate:
        racers = [Racer(lambda pos=pos: store.reserve(cp, 0, pos, 1.0)) for pos in range(3)]
        wait_for(lambda: gate.blocked() == 3, 10, "the three checks to be in, held or queued")
        gate.release()
        over = [r.outcome() for r in racers]
    admitted = [pos for pos, got in enumerate(over) if got is None]
    assert len(admitted) == 2, over
    budget = client.budget(parent)
    assert (budget.spent_usd, budget.reserved_usd) == (0, 2.0)
    # The same call asked again (the next attempt after a kill in it) was admitted once.
    assert store.reserve(cp, 0, admitted[0], 1.0) is None
    assert store.reserve(cp, 0, 99, 1.0) is not None


def test_budget_mistakes_are_one_line_errors(client) -> None:
    with pytest.raises(errors.InvalidInput, match="above 0"):
        client.enqueue("spender", {}, budget_usd=-1)
    with pytest.raises(errors.InvalidInput, match="needs budget_usd"):
        client.enqueue("spender", {}, budget_soft=0.5)
    plain = client.enqueue("spender", {})
    with pytest.raises(errors.InvalidInput, match="has no budget"):
        client.raise_budget(plain, usd=1.0)
    with pytest.raises(errors.InvalidInput, match="give usd="):
        client.raise_budget(plain)
    with pytest.raises(errors.InvalidInput, match="whole number"):
        client.enqueue("spender", {}, budget_tokens=1.5)
    with pytest.raises(errors.UnknownRun):
        client.budget("no-such-run")


def test_the_http_api_reads_and_raises_a_budget(settings, client, deps) -> None:
    from fastapi.testclient import TestClient

    from cairn.web.api import create_app

    with TestClient(create_app(settings, insecure_no_auth=True)) as http:
        made = http.post(
            "/runs", json={"workflow": "spender", "input": {}, "budget_usd": 1e-9}
        ).json()
        run_id = made["run_id"]
        assert _run(run_id, deps) == "budget_exceeded"
        assert http.get(f"/runs/{run_id}/budget").json()["limit_usd"] == 1e-9
        raised = http.post(f"/runs/{run_id}/budget", json={"usd": 1.0})
        assert raised.status_code == 200 and raised.json()["limit_usd"] == 1.0
        assert _run(run_id, deps) == "done"
        assert http.get(f"/runs/{run_id}/budget").json()["spent_usd"] > 0
        plain = http.post("/runs", json={"workflow": "spender", "input": {}}).json()["run_id"]
        assert http.get(f"/runs/{plain}/budget").status_code == 422
        assert http.get("/runs/no-such-run/budget").status_code == 404
        assert http.post(f"/runs/{run_id}/budget", json={"usd": -1}).status_code == 422


def test_a_token_budget_stops_the_tree_and_counts_the_tokens_the_model_billed(
    client, deps, model: ModelServer
) -> None:
    assert deps.model is not None
    worst = deps.model.worst_tokens(
        messages=[{"role": "user", "content": "REPLY: ok 0-0"}], max_tokens=16
    )
    parent = client.enqueue("spender", {"children": 4, "calls": 3}, budget_tokens=3 * worst)
    assert _run(parent, deps) == "waiting"
    kids = [k.run_id for k in client.children(parent)]
    statuses = [_run(k, deps) for k in kids]
    assert "budget_exceeded" in statuses
    stopped = client.get(kids[statuses.index("budget_exceeded")])
    assert "tokens" in stopped.error and "--tokens N" in stopped.error
    budget = client.budget(parent)
    billed = sum(tokens_of(u).prompt + tokens_of(u).output for _, u in model.billed())
    assert budget.limit_usd is None and 0 < budget.spent_tokens == billed <= 3 * worst
    assert budget.spent_usd == pytest.approx(_journaled(client, kids))
    client.raise_budget(parent, tokens=1000 * worst)
    assert all(_run(k, deps) == "done" for k in kids)


def test_a_tenants_budget_set_over_http_stops_its_runs_and_a_raise_resumes_them(
    settings, deps
) -> None:
    import uuid

    from fastapi.testclient import TestClient

    import cairn
    from cairn.web.api import create_app

    tenant = f"tb-{uuid.uuid4().hex[:8]}"
    with (
        TestClient(create_app(settings, insecure_no_auth=True)) as http,
        cairn.Client(settings=settings, tenant=tenant) as theirs,
    ):
        with pytest.raises(errors.InvalidInput, match="an admin's"):
            theirs.set_tenant_budget(tenant, usd=1.0)
        url = f"/tenants/{tenant}/budget"
        assert http.get(url).json()["error"]["type"] == "unknown_budget"  # none yet: 404
        assert http.put(url, json={"per": "day"}).status_code == 404  # a new one needs a limit
        assert http.put(url, json={"usd": 1.0, "per": "week"}).status_code == 422
        assert http.put(url, json={}).status_code == 404  # nothing to set on nothing
        assert http.get("/tenants/no%20such/budget").status_code == 422
        made = http.put(url, json={"usd": 1e-9, "per": "month", "soft": 0.5})
        assert made.status_code == 200, made.text
        assert (made.json()["period"], made.json()["period_start"][8:10]) == ("month", "01")
        run_id = theirs.enqueue("spender", {})
        assert _run(run_id, deps) == "budget_exceeded"
        stopped = theirs.get(run_id)
        assert stopped is not None and f"cairn budgets set --tenant {tenant}" in stopped.error
        assert theirs.tenant_budget(tenant).limit_usd == 1e-9  # its own, read
        again = http.put(url, json={"per": None})  # set as it is: the stopped run re-armed
        assert again.status_code == 200 and theirs.get(run_id).status == "pending"
        assert _run(run_id, deps) == "budget_exceeded"
        raised = http.put(url, json={"usd": 1.0})
        assert raised.json()["limit_usd"] == 1.0 and raised.json()["period"] == "month"
        assert _run(run_id, deps) == "done"
        assert http.get(url).json()["spent_usd"] > 0


def test_a_tenants_budget_deleted_over_http_lets_its_stopped_runs_go_on(settings, deps) -> None:
    import uuid

    from fastapi.testclient import TestClient

    import cairn
    from cairn.web.api import create_app

    tenant = f"tb-{uuid.uuid4().hex[:8]}"
    url = f"/tenants/{tenant}/budget"
    with (
        TestClient(create_app(settings, insecure_no_auth=True)) as http,
        cairn.Client(settings=settings, tenant=tenant) as theirs,
    ):
        missing = http.delete(url)
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "unknown_budget"
        assert http.put(url, json={"usd": 1e-9}).status_code == 200
        run_id = theirs.enqueue("spender", {})
        assert _run(run_id, deps) == "budget_exceeded"
        with pytest.raises(errors.InvalidInput, match="an admin's"):
            theirs.delete_tenant_budget(tenant)
        deleted = http.delete(url)
        assert deleted.status_code == 204 and deleted.content == b""
        assert theirs.get(run_id).status == "pending"  # re-armed, and sent
        assert _run(run_id, deps) == "done"
        assert http.get(url).status_code == 404
        assert http.delete(url).status_code == 404
