"""The approvals inbox (Client.approvals, decide, standing rules): a wait with a request is
listed across runs with what it asks, until one decision (with its audit row) sends its
run the signal; a second decision, even a racing one, is AlreadyDecided; a standing rule
decides a request as the run saves its wait, and the run goes on without parking.

On the in-memory twins and on Postgres (the race on Postgres's row lock)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from cairn.client import Client
from cairn.core import errors
from cairn.core.records import Approval
from cairn.core.status import RunStatus
from cairn.steps import Context, StepResult, workflow
from cairn.workers import loop
from tests.helpers.contract import on_both

REQUEST = {"tool": "refund", "args": {"amount": 5}, "prompt": "Refund 5 EUR to acme?"}

asker = workflow("approval-asker")


@asker.step()
def ask(ctx: Context) -> StepResult:
    request = {**REQUEST, "tool": ctx.input.get("tool", "refund")}
    return StepResult.wait("refund-ok", cursor="act", request=request, state={"asked": True})


@asker.step()
def act(ctx: Context) -> StepResult:
    return StepResult(cursor="done", state={"got": ctx.signal})


other = workflow("approval-other")


@other.step()
def ask_other(ctx: Context) -> StepResult:
    return StepResult.wait("send-ok", cursor="finish", request={"tool": "send_mail"})


@other.step()
def finish(ctx: Context) -> StepResult:
    return StepResult(cursor="done", state={"got": ctx.signal})


@pytest.fixture(params=["memory", "pg"])
def deps(request: pytest.FixtureRequest) -> loop.Deps:
    return on_both(request)


def _client(deps: loop.Deps) -> Client:
    return Client(settings=deps.settings, store=deps.store, send=lambda run_id, priority: None)


def _parked(deps: loop.Deps, flow: str = "approval-asker", **data: Any) -> str:
    run_id = f"{flow}-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, flow, data)
    assert loop.run(run_id, deps) == RunStatus.WAITING
    return run_id


def _mine(found: list[Approval], run_ids: list[str]) -> list[str]:
    return [a.run_id for a in found if a.run_id in run_ids]  # the pg database is shared


def test_a_waiting_request_is_listed_with_what_it_asks_and_decided_once(deps: loop.Deps) -> None:
    client = _client(deps)
    run_id = _parked(deps)
    [approval] = [a for a in client.approvals(workflow="approval-asker") if a.run_id == run_id]
    assert (approval.event, approval.tool, approval.request) == ("refund-ok", "refund", REQUEST)
    assert approval.waiting and approval.decision is None

    decided = client.decide(approval.approval_id, "edit", args={"amount": 4}, by="ops@acme")
    assert decided.decision is not None and not decided.waiting
    assert (decided.decision.decision, decided.decision.decided_by) == ("edit", "ops@acme")
    assert decided.decision.payload["args"] == {"amount": 4}
    assert run_id not in _mine(client.approvals(), [run_id])  # decided: off the inbox

    with pytest.raises(errors.AlreadyDecided, match="decided already: edit by ops@acme"):
        client.decide(approval.approval_id, "approve")
    assert loop.run(run_id, deps) == RunStatus.DONE
    got = deps.store.get(run_id)
    assert got is not None and got.state["got"] == {
        "decision": "edit",
        "args": {"amount": 4},
        "note": None,
        "approval_id": approval.approval_id,
        "by": "ops@acme",
    }


def test_the_list_filters_by_workflow_and_name_and_pages_both_ways(deps: loop.Deps) -> None:
    client = _client(deps)
    asks = [_parked(deps) for _ in range(3)]
    mail = _parked(deps, "approval-other")
    mine = [*asks, mail]
    assert _mine(client.approvals(), mine) == [mail, *reversed(asks)]
    assert _mine(client.approvals(oldest_first=True), mine) == [*asks, mail]
    assert _mine(client.approvals(workflow="approval-other"), mine) == [mail]
    assert _mine(client.approvals(name="refund-ok"), mine) == list(reversed(asks))
    assert _mine(client.approvals(name="no-such-event"), mine) == []

    first = client.approvals(workflow="approval-asker", limit=2)
    rest = client.approvals(workflow="approval-asker", limit=2, after=first[-1].approval_id)
    assert _mine([*first, *rest], mine) == list(reversed(asks))
    older = client.approvals(workflow="approval-asker", oldest_first=True, limit=1)
    newer = client.approvals(
        workflow="approval-asker", oldest_first=True, after=older[0].approval_id
    )
    assert older[0].approval_id < min(a.approval_id for a in newer)


def test_a_standing_rule_decides_at_once_and_the_run_never_parks(deps: loop.Deps) -> None:
    client = _client(deps)
    tool = f"lookup-{uuid.uuid4().hex[:6]}"
    rule = client.add_rule("approval-asker", tool, by="ops@acme")
    assert client.add_rule("approval-asker", tool).rule_id == rule.rule_id  # one rule
    assert rule in client.rules()

    run_id = f"ruled-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, "approval-asker", {"tool": tool})
    # Saved as decided: the delivery hands the run back to go on at once, nobody asked.
    with pytest.raises(errors.HandOff, match="had come"):
        loop.run(run_id, deps)
    assert loop.run(run_id, deps) == RunStatus.DONE
    got = deps.store.get(run_id)
    assert got is not None and got.state["got"]["decision"] == "approve"
    approval = client.approval(got.state["got"]["approval_id"])
    assert approval is not None and approval.decision is not None
    assert approval.decision.rule_id == rule.rule_id
    assert approval.decision.decided_by == f"rule {rule.rule_id}"

    other = _parked(deps)  # another tool: no rule, it waits
    assert other in _mine(client.approvals(), [other])
    assert client.remove_rule(rule.rule_id) and not client.remove_rule(rule.rule_id)


def test_a_decision_its_run_no_longer_waits_for_is_refused(deps: loop.Deps) -> None:
    client = _client(deps)
    run_id = _parked(deps)
    [approval] = [a for a in client.approvals() if a.run_id == run_id]
    client.cancel(run_id)
    assert _mine(client.approvals(), [run_id]) == []
    with pytest.raises(errors.ApprovalGone, match="no longer waits"):
        client.decide(approval.approval_id, "approve")
    with pytest.raises(errors.UnknownApproval):
        client.decide(10**12, "approve")
    with pytest.raises(errors.InvalidInput, match="one of approve, deny, edit"):
        client.decide(approval.approval_id, "maybe")
    with pytest.raises(errors.InvalidInput, match="edited args"):
        client.decide(approval.approval_id, "edit")
    with pytest.raises(ValueError, match="'tool' is a name"):
        StepResult.wait("x", cursor="done", request={"tool": ""})


def test_of_two_racing_decisions_one_wins_and_one_is_already_decided(
    settings: Any, store: Any, leases: Any, db_url: str
) -> None:
    import psycopg

    from cairn.store.sql import QUERIES

    deps = loop.Deps(settings=settings, store=store, leases=leases, model=None)
    client = _client(deps)
    run_id = _parked(deps)
    [approval] = [a for a in client.approvals() if a.run_id == run_id]
    # The first decision's transaction holds the row while the second arrives.
    with psycopg.connect(db_url) as first:
        row = first.execute(
            QUERIES["decide"],
            {
                "approval_id": approval.approval_id,
                "decision": "deny",
                "payload": psycopg.types.json.Jsonb({"decision": "deny"}),
                "decided_by": "first",
                "traceparent": None,
                "tenant": None,
                "token_id": None,
            },
        ).fetchone()
        assert row is not None
        outcome: list[errors.CairnError | Approval] = []

        def second() -> None:
            try:
                outcome.append(client.decide(approval.approval_id, "approve", by="second"))
            except errors.CairnError as exc:
                outcome.append(exc)

        racer = threading.Thread(target=second)
        racer.start()
        racer.join(0.5)
        assert racer.is_alive()  # blocked on the first's row lock
        first.commit()
    racer.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], errors.AlreadyDecided), outcome
    decided = client.approval(approval.approval_id)
    assert decided is not None and decided.decision is not None
    assert decided.decision.decided_by == "first"


def test_a_tenant_sees_and_decides_its_own_approvals_only_and_its_rules_are_its_own(
    deps: loop.Deps,
) -> None:
    admin = _client(deps)
    acme, globex = admin.for_tenant("acme"), admin.for_tenant("globex")
    tool = f"wire-{uuid.uuid4().hex[:6]}"
    globex.add_rule("approval-asker", tool)  # globex's rule: not for acme's runs

    run_id = f"acme-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(run_id, "approval-asker", {"tool": tool}, tenant="acme")
    assert loop.run(run_id, deps) == RunStatus.WAITING  # asked: globex's rule decided nothing
    [mine] = [a for a in acme.approvals() if a.run_id == run_id]
    assert run_id in _mine(admin.approvals(), [run_id])  # the admin's inbox has every tenant's

    # To another tenant the approval is none: not listed, not read, not decided.
    assert _mine(globex.approvals(), [run_id]) == []
    assert globex.approval(mine.approval_id) is None
    with pytest.raises(errors.UnknownApproval):
        globex.decide(mine.approval_id, "approve")
    assert [r.tool for r in globex.rules()] == [tool]
    assert tool not in [r.tool for r in acme.rules()]
    assert not acme.remove_rule(globex.rules()[0].rule_id)  # nor another tenant's rule

    decided = acme.decide(mine.approval_id, "approve", by="ops@acme")
    assert decided.decision is not None and decided.decision.decided_by == "ops@acme"

    # acme's own rule decides acme's next request as the run saves its wait.
    acme.add_rule("approval-asker", tool)
    ruled = f"acme-{uuid.uuid4().hex[:8]}"
    assert deps.store.create_run(ruled, "approval-asker", {"tool": tool}, tenant="acme")
    with pytest.raises(errors.HandOff, match="had come"):  # decided as it saved: goes on
        loop.run(ruled, deps)
    assert loop.run(ruled, deps) == RunStatus.DONE


def test_the_sweep_takes_a_runs_approvals_with_their_audit_and_keeps_the_rules(
    deps: loop.Deps, request: pytest.FixtureRequest
) -> None:
    client = _client(deps)
    tool = f"lookup-{uuid.uuid4().hex[:6]}"
    rule = client.add_rule("approval-asker", tool, by="ops@acme")
    decided = _parked(deps)
    [asked] = [a for a in client.approvals(workflow="approval-asker") if a.run_id == decided]
    client.decide(asked.approval_id, "approve", by="ops@acme")
    assert loop.run(decided, deps) == RunStatus.DONE
    ruled = f"ruled-{uuid.uuid4().hex[:8]}"  # decided by the rule as it saved its wait
    assert deps.store.create_run(ruled, "approval-asker", {"tool": tool})
    with pytest.raises(errors.HandOff):
        loop.run(ruled, deps)
    assert loop.run(ruled, deps) == RunStatus.DONE
    got = deps.store.get(ruled)
    assert got is not None
    ruled_id = got.state["got"]["approval_id"]
    waiting = _parked(deps)  # not finished: the sweep leaves it and its request
    gone = [decided, ruled]

    # Both finished runs past the horizon.
    if request.node.callspec.params["deps"] == "memory":
        deps.store._clock.advance(8 * 86400)  # type: ignore[attr-defined]
    else:
        sql = request.getfixturevalue("sql")
        sql("UPDATE checkpoints SET updated_at = now() - interval '8 days' WHERE run_id = ANY(%s)",
            gone)  # fmt: skip
        audit = "SELECT count(*) FROM approval_decisions WHERE run_id = ANY(%s)"
        assert sql(audit, gone) == [(2,)]
    assert deps.store.sweep(older_than=7 * 86400) == 2
    assert client.approval(asked.approval_id) is None and client.approval(ruled_id) is None
    if request.node.callspec.params["deps"] == "pg":
        assert sql(audit, gone) == [(0,)]  # no audit row outlives its run
    assert waiting in _mine(client.approvals(), [waiting])
    assert rule in client.rules()
