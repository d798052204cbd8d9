"""The approvals inbox over HTTP and the CLI (the store's semantics, on both stores, are
tests/contract/test_approvals.py's): GET /approvals lists what the runs ask, filtered and
paged; POST /approvals/{id}/decision sends the run its signal with the audit row, and a
second decision is 409 already_decided; `cairn approvals` lists, approves and denies,
each mistake one line."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cairn.client import Client
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.workers import loop
from tests.integration.test_cli import _cairn


@pytest.fixture
def parked(deps: loop.Deps, create: Callable[..., str]) -> Callable[..., str]:
    def park(**data: Any) -> str:
        run_id = create("refund", data, queue=False)
        assert loop.run(run_id, deps) == RunStatus.WAITING
        return run_id

    return park


@pytest.fixture
def cli_env(settings: Settings) -> dict[str, str]:
    return {"CAIRN_DATABASE_URL": settings.database_url, "CAIRN_REDIS_URL": settings.redis_url}


@pytest.fixture
def http(settings: Settings) -> Iterator[TestClient]:
    from cairn.web.api import create_app

    token = uuid.uuid4().hex
    app = create_app(dataclasses.replace(settings, api_token=token))
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as http:
        yield http


def test_the_inbox_lists_what_runs_ask_and_a_decision_is_sent_once(
    http: TestClient, parked: Callable[..., str], deps: loop.Deps, client: Client
) -> None:
    first, second = parked(amount=7), parked(amount=9)
    page = http.get("/approvals").json()
    assert [a["run_id"] for a in page["approvals"]] == [second, first]
    asked = page["approvals"][1]
    assert asked["request"] == {
        "tool": "refund",
        "args": {"customer": "acme", "amount": 7},
        "prompt": "Refund 7 EUR?",
    }
    assert (asked["workflow"], asked["event"], asked["tool"]) == ("refund", "refund_ok", "refund")
    assert asked["waiting"] and asked["decision"] is None
    oldest = http.get("/approvals", params={"order": "oldest", "limit": 1}).json()
    assert [a["run_id"] for a in oldest["approvals"]] == [first]
    rest = http.get("/approvals", params={"order": "oldest", "cursor": oldest["next_cursor"]})
    assert [a["run_id"] for a in rest.json()["approvals"]] == [second]
    assert http.get("/approvals", params={"workflow": "probe"}).json()["approvals"] == []
    assert http.get("/approvals", params={"name": "refund_ok"}).json()["next_cursor"] is None

    url = f"/approvals/{asked['approval_id']}/decision"
    decided = http.post(url, json={"decision": "edit", "args": {"amount": 6}, "note": "max 6"})
    assert decided.status_code == 200, decided.text
    audit = decided.json()["decision"]
    assert (audit["decision"], audit["decided_by"], audit["rule_id"]) == ("edit", "admin", None)
    again = http.post(url, json={"decision": "approve"})
    assert again.status_code == 409 and again.json()["error"]["type"] == "already_decided"
    assert [a["run_id"] for a in http.get("/approvals").json()["approvals"]] == [second]

    assert loop.run(first, deps) == RunStatus.DONE
    run = client.get(first)
    assert run is not None and run.state["decided"]["args"] == {"amount": 6}
    assert run.state["decided"]["note"] == "max 6"


def test_decision_mistakes_are_clear_errors(http: TestClient, parked: Callable[..., str]) -> None:
    parked()
    [asked] = http.get("/approvals").json()["approvals"]
    url = f"/approvals/{asked['approval_id']}/decision"
    for body, kind in [
        ({"decision": "edit"}, "invalid_input"),
        ({"decision": "approve", "args": {"x": 1}}, "invalid_input"),
        ({"decision": "maybe"}, "invalid_request"),
    ]:
        got = http.post(url, json=body)
        assert got.status_code == 422 and got.json()["error"]["type"] == kind, got.text
    missing = http.post("/approvals/999999/decision", json={"decision": "approve"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "unknown_approval"
    assert http.get("/approvals/999999").status_code == 404
    http.post(f"/runs/{asked['run_id']}/cancel", json={})
    gone = http.post(url, json={"decision": "deny"})
    assert gone.status_code == 409 and gone.json()["error"]["type"] == "approval_gone"


def test_the_cli_lists_approves_denies_and_adds_rules(
    cli_env: dict[str, str], parked: Callable[..., str], deps: loop.Deps, client: Client
) -> None:
    yes, no = parked(amount=1), parked(amount=2)
    listed = json.loads(_cairn("approvals", "list", "--oldest", "--json", env=cli_env).stdout)
    ids = {a["run_id"]: a["approval_id"] for a in listed["approvals"]}
    assert list(ids) == [yes, no]
    out = _cairn("approvals", "approve", str(ids[yes]), "--by", "ops@acme", "--json", env=cli_env)
    assert json.loads(out.stdout)["approval"]["decision"]["decided_by"] == "ops@acme"
    out = _cairn("approvals", "deny", str(ids[no]), "--note", "too much", env=cli_env)
    assert out.returncode == 0 and "deny sent to run" in out.stdout
    twice = _cairn("approvals", "deny", str(ids[no]), env=cli_env)
    assert twice.returncode == 2 and "decided already: deny by admin" in twice.stderr
    assert "Traceback" not in twice.stderr and len(twice.stderr.strip().splitlines()) == 1
    for run_id, decision in ((yes, "approve"), (no, "deny")):
        assert loop.run(run_id, deps) == RunStatus.DONE
        run = client.get(run_id)
        assert run is not None and run.state["decided"]["decision"] == decision

    out = _cairn("approvals", "rule", "add", "--workflow", "refund", "--tool", "refund",
                 "--json", env=cli_env)  # fmt: skip
    rule = json.loads(out.stdout)["rule"]
    assert (rule["workflow"], rule["tool"]) == ("refund", "refund")
    assert [r.rule_id for r in client.rules()] == [rule["rule_id"]]


def test_the_approvals_bench_lists_every_pending_request(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Keeps `python -m bench.approvals` alive (no timing asserted): its inbox holds exactly
    # the pending requests, or main fails.
    from bench.approvals import main
    from tests.helpers.services import BASE_DB, BASE_REDIS

    monkeypatch.setenv("CAIRN_DATABASE_URL", BASE_DB)
    monkeypatch.setenv("CAIRN_REDIS_URL", BASE_REDIS)
    assert main(["--runs", "400", "--pending", "30", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert "all 30 pending, pages of 1,000" in out and "plan of the first page" in out
