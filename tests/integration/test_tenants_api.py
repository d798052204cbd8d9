"""Two tenants' tokens against one server (the app in process, on the real services):
every route of the pinned OpenAPI document, walked from the document itself and by the
decision it names (x-cairn-tenancy), the pages and the events stream answer another
tenant's run as no run (404, or absent from a list) and one's own as usual, and an admin's
route refuses a tenant's token (403); an admin token sees both; a revoked token is
refused within seconds; an approval's audit row names the token and tenant that decided
it, over the API, the pages and the CLI."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

import cairn
from cairn.core.settings import Settings
from cairn.store.db import Database
from cairn.store.tokens import Tokens, parse
from cairn.web.auth import TOKEN_TTL
from cairn.workers import loop
from tests.helpers.services import ROOT
from tests.helpers.web import login
from tests.integration.test_cli import _cairn

ADMIN = "admin-token-for-the-tenants-test"
DOCUMENT = json.loads((ROOT / "tests" / "helpers" / "openapi.json").read_text())
probe = cairn.workflow("tenants-probe")


@probe.step()
def only(ctx: cairn.Context) -> cairn.StepResult:
    return cairn.StepResult(cursor=cairn.DONE, state={})


asker = cairn.workflow("tenants-asker")


@asker.step()
def ask(ctx: cairn.Context) -> cairn.StepResult:
    return cairn.StepResult.wait("ok", cursor="asked", request={"tool": "refund"})


@asker.step()
def asked(ctx: cairn.Context) -> cairn.StepResult:
    return cairn.StepResult(cursor=cairn.DONE, state={})


@pytest.fixture
def tokens(settings: Settings) -> Iterator[Tokens]:
    db = Database(settings.database_url, max_size=2)
    yield Tokens(db)
    db.close()


@pytest.fixture
def http(settings: Settings) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from cairn.web.api import create_app

    with TestClient(create_app(settings.with_options(api_token=ADMIN))) as client:
        yield client


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _example(op: dict[str, Any]) -> Any:
    body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
    return body.get("example")


def _operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, ops in DOCUMENT["paths"].items():
        for method, op in ops.items():
            yield method.upper(), path, op


def _call(
    http: Any,
    method: str,
    path: str,
    op: dict[str, Any],
    token: str,
    run_id: str,
    ask: int = 0,
    tenant: str = "acme",
) -> Any:
    url = path.replace("{run_id}", run_id).replace("{event}", "go").replace("{name}", "nightly")
    url = url.replace("{approval_id}", str(ask)).replace("{tenant}", tenant)
    body = _example(op)
    return http.request(method, url, headers=_bearer(token), json=body)


def _asking(http: Any, deps: loop.Deps, token: str, run_id: str) -> int:
    """A run of token's tenant parked on an approval: its approval's id."""
    start = {"workflow": "tenants-asker", "input": {}, "run_id": run_id}
    assert http.post("/runs", json=start, headers=_bearer(token)).status_code == 202
    assert loop.run(run_id, deps) == cairn.RunStatus.WAITING
    [found] = http.get("/approvals", headers=_bearer(token)).json()["approvals"]
    assert found["run_id"] == run_id
    return int(found["approval_id"])


def test_every_route_hides_another_tenants_run(http: Any, tokens: Tokens, deps: loop.Deps) -> None:
    _, acme = tokens.create("acme", "test")
    _, globex = tokens.create("globex", "test")
    start = {"workflow": "tenants-probe", "input": {}}
    admins_ask = _asking(http, deps, ADMIN, "admin-ask")  # the admin's: a run of no tenant
    mine = http.post("/runs", json={**start, "run_id": "acme-1"}, headers=_bearer(acme)).json()
    theirs = http.post("/runs", json={**start, "run_id": "globex-1"}, headers=_bearer(globex))
    admins = http.post("/runs", json={**start, "run_id": "admin-1"}, headers=_bearer(ADMIN))
    assert (mine["tenant"], theirs.json()["tenant"], admins.json()["tenant"]) == (
        "acme",
        "globex",
        None,
    )
    their_ask = _asking(http, deps, globex, "globex-ask")
    my_ask = _asking(http, deps, acme, "acme-ask")
    # A stopped run of its own, so its event stream ends (a pending one's would follow it).
    http.post("/runs/acme-1/cancel", headers=_bearer(acme))
    # The admin's: a schedule, and each tenant's budget.
    nightly = {"name": "nightly", "workflow": "tenants-probe", "input": {}, "every": 3600}
    assert http.post("/schedules", json=nightly, headers=_bearer(ADMIN)).status_code == 201
    for tenant in ("acme", "globex"):
        budget = {"usd": 5.0, "per": "day"}
        assert http.put(f"/tenants/{tenant}/budget", json=budget, headers=_bearer(ADMIN)).is_success

    walked, refused = 0, []
    for method, path, op in _operations():
        if path == "/runs" and method == "POST":
            continue  # the enqueues above
        if op["x-cairn-tenancy"]["who"] == "admin":
            answer = _call(http, method, path, op, acme, "", tenant="globex")
            assert answer.status_code == 403, (method, path, answer.text)
            assert answer.json()["error"]["type"] == "forbidden"
            refused.append(f"{method} {path}")
        elif "{tenant}" in path:
            # Another tenant's budget is none: what a tenant without one gets, word for word.
            other = _call(http, method, path, op, acme, "", tenant="globex")
            ghost = _call(http, method, path, op, acme, "", tenant="initech")
            assert other.status_code == 404, (method, path, other.text)
            assert other.text.replace("globex", "?") == ghost.text.replace("initech", "?")
            assert _call(http, method, path, op, acme, "").status_code == 200  # its own
        elif "{approval_id}" in path:
            # Another tenant's approval (or the admin's) is no approval: what a made-up id
            # gets, word for word.
            ghost = _call(http, method, path, op, acme, "", 10**9)
            for ask in (their_ask, admins_ask):
                other = _call(http, method, path, op, acme, "", ask)
                assert other.status_code == 404, (method, path, other.text)
                assert other.text.replace(str(ask), "?") == ghost.text.replace(str(10**9), "?")
            own = _call(http, method, path, op, acme, "", my_ask)
            assert own.status_code == 200, (method, path, own.status_code, own.text)
        elif "{run_id}" in path:
            # Another tenant's run and the admin's: word for word what a run that does not
            # exist gets, nothing tells them apart.
            ghost = _call(http, method, path, op, acme, "globex-9")
            for run_id in ("globex-1", "admin-1"):
                other = _call(http, method, path, op, acme, run_id)
                assert other.status_code == 404, (method, path, other.text)
                assert other.text.replace(run_id, "?") == ghost.text.replace("globex-9", "?")
            own = _call(http, method, path, op, acme, "acme-1")
            assert own.status_code not in (401, 403, 404) and own.status_code < 500, (
                method, path, own.status_code, own.text,
            )  # fmt: skip
            walked += 1
        else:
            answer = _call(http, method, path, op, acme, "")
            assert answer.status_code == 200, (method, path, answer.text)
            assert "globex-1" not in answer.text and "admin-1" not in answer.text
    assert walked >= 12  # every run route of the document was tried
    assert sorted(refused) == [
        "DELETE /schedules/{name}", "DELETE /tenants/{tenant}/budget", "GET /metrics",
        "GET /schedules", "POST /runs/replay", "POST /schedules", "POST /schedules/{name}/pause",
        "POST /schedules/{name}/resume", "PUT /tenants/{tenant}/budget",
    ]  # fmt: skip
    # The admin's schedule and globex's budget are as they were.
    [kept] = http.get("/schedules", headers=_bearer(ADMIN)).json()["schedules"]
    assert (kept["name"], kept["paused"]) == ("nightly", False)
    assert http.get("/tenants/globex/budget", headers=_bearer(ADMIN)).json()["limit_usd"] == 5.0

    listed = http.get("/runs", headers=_bearer(acme)).json()["runs"]
    assert sorted(r["run_id"] for r in listed) == ["acme-1", "acme-ask"]
    assert http.get("/counts", headers=_bearer(acme)).json() == {"cancelled": 1, "waiting": 1}
    # The other tenant's run and the admin's are as they were: not cancelled, signalled,
    # steered, rewound, resolved nor forked; their approvals undecided.
    for run_id, tenant in (("globex-1", "globex"), ("admin-1", None)):
        seen = http.get(f"/runs/{run_id}", headers=_bearer(ADMIN)).json()
        assert (seen["status"], seen["tenant"]) == ("pending", tenant)
        forks = http.get(f"/runs/{run_id}/forks", headers=_bearer(ADMIN)).json()["forks"]
        assert forks == []
    for ask in (their_ask, admins_ask):
        got = http.get(f"/approvals/{ask}", headers=_bearer(ADMIN)).json()
        assert got["waiting"] and got["decision"] is None
    assert {r["run_id"] for r in http.get("/runs", headers=_bearer(ADMIN)).json()["runs"]} >= {
        "acme-1",
        "globex-1",
    }

    # The events stream: the run's read token is the tenant's own run's only.
    token = http.post("/runs/acme-1/events/token", headers=_bearer(acme)).json()["token"]
    assert http.get(f"/runs/acme-1/events?token={token}").status_code == 200
    assert http.get(f"/runs/globex-1/events?token={token}").status_code != 200

    # The pages, through a tenant's login.
    page = login(http, acme, follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == "/ui/runs"
    runs_page = http.get("/ui/runs")
    assert "acme-1" in runs_page.text and "globex-1" not in runs_page.text
    assert "globex-1" not in http.get("/ui/runs?tenant=globex").text
    assert http.get("/ui/runs/globex-1").status_code == 404
    assert "acme" in http.get("/ui/runs/acme-1").text
    http.cookies.clear()


def test_a_revoked_token_is_refused_within_seconds(http: Any, tokens: Tokens) -> None:
    record, token = tokens.create("acme", "to revoke")
    assert http.get("/runs", headers=_bearer(token)).status_code == 200
    wrong = token[:-4] + ("aaaa" if not token.endswith("aaaa") else "bbbb")
    assert http.get("/runs", headers=_bearer(wrong)).status_code == 401
    assert tokens.revoke(record.id) is not None
    deadline = time.monotonic() + TOKEN_TTL + 3
    while http.get("/runs", headers=_bearer(token)).status_code != 401:
        assert time.monotonic() < deadline, "a revoked token still works"
        time.sleep(0.2)
    assert [t.revoked_at is not None for t in tokens.list_tokens() if t.id == record.id] == [True]


def test_a_revoked_tokens_page_session_ends(http: Any, tokens: Tokens) -> None:
    record, token = tokens.create("acme")
    login(http, token)
    assert http.get("/ui/runs", follow_redirects=False).status_code == 200
    tokens.revoke(record.id)
    deadline = time.monotonic() + TOKEN_TTL + 3
    while http.get("/ui/runs", follow_redirects=False).status_code != 303:
        assert time.monotonic() < deadline, "a revoked token's session still works"
        time.sleep(0.2)


def test_a_revoked_tokens_read_tokens_stop_reading_within_seconds(
    http: Any, tokens: Tokens
) -> None:
    record, token = tokens.create("acme")
    _, kept = tokens.create("acme")
    start = {"workflow": "tenants-probe", "input": {}, "run_id": "acme-read"}
    assert http.post("/runs", json=start, headers=_bearer(token)).status_code == 202
    # Ended, so its stream ends: each read below is a whole answer.
    assert http.post("/runs/acme-read/cancel", headers=_bearer(token)).status_code == 202
    read = http.post("/runs/acme-read/events/token", headers=_bearer(token)).json()["token"]
    other = http.post("/runs/acme-read/events/token", headers=_bearer(kept)).json()["token"]
    admin = http.post("/runs/acme-read/events/token", headers=_bearer(ADMIN)).json()["token"]
    assert len({read, other, admin}) == 3  # each bound to the token that asked
    for given in (read, other, admin):
        assert http.get(f"/runs/acme-read/events?token={given}").status_code == 200
    forged = read.partition(".")[0] + "." + "0" * 64
    assert http.get(f"/runs/acme-read/events?token={forged}").status_code == 403
    tokens.revoke(record.id)
    deadline = time.monotonic() + TOKEN_TTL + 3
    while http.get(f"/runs/acme-read/events?token={read}").status_code != 403:
        assert time.monotonic() < deadline, "a revoked token's read token still reads"
        time.sleep(0.2)
    # The read tokens other tokens got read on.
    assert http.get(f"/runs/acme-read/events?token={other}").status_code == 200
    assert http.get(f"/runs/acme-read/events?token={admin}").status_code == 200


def test_an_admin_token_from_the_cli_sees_every_tenant(http: Any, tokens: Tokens) -> None:
    _, acme = tokens.create("acme")
    _, admin = tokens.create(None, "ops", admin=True)
    start = {"workflow": "tenants-probe", "input": {}, "run_id": "acme-2"}
    assert http.post("/runs", json=start, headers=_bearer(acme)).status_code == 202
    assert http.get("/runs/acme-2", headers=_bearer(admin)).json()["tenant"] == "acme"
    assert http.get("/schedules", headers=_bearer(admin)).status_code == 200


def test_cairn_tokens_prints_a_token_once_lists_none_and_revokes(
    settings: Settings, tokens: Tokens
) -> None:
    env = {"CAIRN_DATABASE_URL": settings.database_url}
    made = _cairn("tokens", "create", "--tenant", "acme", "--name", "back end", env=env)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1]
    found = tokens.check(token)
    assert found is not None and (found.tenant, found.name, found.admin) == (
        "acme",
        "back end",
        False,
    )
    listed = _cairn("tokens", "list", "--json", env=env)
    parts = parse(token)
    assert parts is not None and parts[1] not in listed.stdout  # never the secret again
    [row] = [t for t in json.loads(listed.stdout)["tokens"] if t["id"] == found.id]
    assert (row["tenant"], row["revoked_at"]) == ("acme", None)
    assert _cairn("tokens", "revoke", found.id, env=env).returncode == 0
    assert tokens.check(token) is None
    for args, says in (
        (("tokens", "create"), "give --tenant NAME"),
        (("tokens", "create", "--tenant", "a b"), "tenant 'a b' is not valid"),
        (("tokens", "revoke", "nope"), "no token 'nope'"),
    ):
        wrong = _cairn(*args, env=env)
        assert wrong.returncode != 0 and says in wrong.stderr and "Traceback" not in wrong.stderr


def test_the_runs_page_shows_a_tenants_budget_to_an_admin_and_to_the_tenant(
    http: Any, tokens: Tokens
) -> None:
    import uuid

    tenant = f"pb-{uuid.uuid4().hex[:8]}"
    _, theirs = tokens.create(tenant, "test")
    url = f"/tenants/{tenant}/budget"
    body = {"usd": 2.5, "tokens": 1000, "per": "month", "soft": 0.8}
    assert http.put(url, json=body, headers=_bearer(ADMIN)).status_code == 200
    assert http.delete(url, headers=_bearer(theirs)).status_code == 403  # an admin's

    login(http, ADMIN)
    page = http.get(f"/ui/runs?tenant={tenant}").text
    assert 'id="tenant-budget"' in page and f"tenant:{tenant}" in page
    assert "$0 · $0 / $2.50" in page and "0 · 0 / 1000" in page
    assert "per month since" in page and "-01 00:00 UTC" in page
    assert 'id="tenant-budget"' not in http.get("/ui/runs").text  # no tenant, no budget
    assert 'id="tenant-budget"' not in http.get(f"/ui/runs?tenant={tenant}x").text  # none
    assert f"tenant:{tenant}" in http.get(f"/ui/runs?tenant={tenant}&partial=1").text
    http.cookies.clear()

    # A tenant's session sees its own, whatever it asks for.
    login(http, theirs)
    assert f"tenant:{tenant}" in http.get("/ui/runs").text
    assert f"tenant:{tenant}" in http.get("/ui/runs?tenant=acme").text
    http.cookies.clear()

    assert http.delete(url, headers=_bearer(ADMIN)).status_code == 204
    login(http, ADMIN)
    assert 'id="tenant-budget"' not in http.get(f"/ui/runs?tenant={tenant}").text
    http.cookies.clear()


def test_an_approvals_audit_row_names_the_token_and_tenant_that_decided(
    http: Any, tokens: Tokens, deps: loop.Deps, settings: Settings, sql: Any
) -> None:
    """Over the API with a tenant's token, an admin's `cairn tokens` token and the server's
    own; through a tenant's page session; and from the CLI, which proves only the
    database's URL and so decides as the admin."""
    acme_record, acme = tokens.create("acme", "back end")
    ops_record, ops = tokens.create(None, "ops", admin=True)
    tenants = {"acme-bearer": "acme", "acme-page": "acme", "ops": None, "server": None, "cli": None}
    asked = {}
    for key, tenant in tenants.items():
        assert deps.store.create_run(key, "tenants-asker", {}, tenant=tenant)
        assert loop.run(key, deps) == cairn.RunStatus.WAITING
    for found in http.get("/approvals", headers=_bearer(ADMIN)).json()["approvals"]:
        asked[found["run_id"]] = found["approval_id"]

    def decide(key: str, headers: dict[str, str]) -> Any:
        url = f"/approvals/{asked[key]}/decision"
        return http.post(url, json={"decision": "approve"}, headers=headers)

    assert decide("acme-bearer", _bearer(acme)).status_code == 200
    assert decide("ops", _bearer(ops)).status_code == 200
    assert decide("server", _bearer(ADMIN)).status_code == 200
    login(http, acme, "/ui/approvals")
    assert decide("acme-page", {"X-Cairn-Page": "1"}).status_code == 200
    http.cookies.clear()
    env = {"CAIRN_DATABASE_URL": settings.database_url, "CAIRN_REDIS_URL": settings.redis_url}
    made = _cairn("approvals", "approve", str(asked["cli"]), env=env)
    assert made.returncode == 0, made.stderr

    rows = sql(
        "SELECT run_id, decided_by, decided_token, decided_tenant FROM approval_decisions"
        " WHERE approval_id = ANY(%s)",
        list(asked.values()),
    )
    assert {r[0]: r[1:] for r in rows} == {
        "acme-bearer": (f"token {acme_record.id}", acme_record.id, "acme"),
        "acme-page": (f"token {acme_record.id}", acme_record.id, "acme"),
        "ops": (f"token {ops_record.id}", ops_record.id, None),
        "server": ("admin", None, None),
        "cli": ("admin", None, None),
    }
    # As the API answers it, and as the run reads it.
    got = http.get(f"/approvals/{asked['acme-bearer']}", headers=_bearer(acme)).json()
    said = got["decision"]
    assert (said["decided_by"], said["decided_token"], said["decided_tenant"]) == (
        f"token {acme_record.id}",
        acme_record.id,
        "acme",
    )
    assert said["payload"]["by"] == f"token {acme_record.id}"


def test_a_cancel_names_the_token_that_asked_over_http_and_the_admin_from_the_cli(
    http: Any, tokens: Tokens, settings: Settings
) -> None:
    record, acme = tokens.create("acme")
    start = {"workflow": "tenants-probe", "input": {}}
    for run_id in ("cancel-http", "cancel-cli"):
        made = http.post("/runs", json={**start, "run_id": run_id}, headers=_bearer(acme))
        assert made.status_code == 202
    stopped = http.post("/runs/cancel-http/cancel", headers=_bearer(acme)).json()
    assert stopped["cancelled_by"] == f"token {record.id}"
    env = {"CAIRN_DATABASE_URL": settings.database_url, "CAIRN_REDIS_URL": settings.redis_url}
    assert _cairn("runs", "cancel", "cancel-cli", env=env).returncode == 0
    shown = _cairn("runs", "show", "cancel-cli", "--json", env=env)
    assert json.loads(shown.stdout)["run"]["cancelled_by"] == "admin"
    assert " cancelled by admin" in _cairn("runs", "show", "cancel-cli", env=env).stdout
