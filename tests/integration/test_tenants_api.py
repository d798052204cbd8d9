"""Two tenants' tokens against one server (the app in process, on the real services):
every route of the pinned OpenAPI document, walked from the document itself, the pages and
the events stream answer another tenant's run as no run (404, or absent from a list) and
one's own as usual; an admin token sees both; a revoked token is refused within seconds."""

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
    http: Any, method: str, path: str, op: dict[str, Any], token: str, run_id: str, ask: int = 0
) -> Any:
    url = path.replace("{run_id}", run_id).replace("{event}", "go").replace("{name}", "nightly")
    url = url.replace("{approval_id}", str(ask)).replace("{tenant}", "acme")
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
    mine = http.post("/runs", json={**start, "run_id": "acme-1"}, headers=_bearer(acme)).json()
    theirs = http.post("/runs", json={**start, "run_id": "globex-1"}, headers=_bearer(globex))
    assert (mine["tenant"], theirs.json()["tenant"]) == ("acme", "globex")
    their_ask = _asking(http, deps, globex, "globex-ask")
    my_ask = _asking(http, deps, acme, "acme-ask")
    # A stopped run of its own, so its event stream ends (a pending one's would follow it).
    http.post("/runs/acme-1/cancel", headers=_bearer(acme))

    walked = 0
    for method, path, op in _operations():
        if path == "/runs" and method == "POST":
            continue  # the enqueues above
        if "{approval_id}" in path:
            # Another tenant's approval is no approval: what a made-up id gets, word for word.
            other = _call(http, method, path, op, acme, "", their_ask)
            ghost = _call(http, method, path, op, acme, "", 10**9)
            assert other.status_code == 404, (method, path, other.text)
            assert other.text.replace(str(their_ask), "?") == ghost.text.replace(str(10**9), "?")
            own = _call(http, method, path, op, acme, "", my_ask)
            assert own.status_code == 200, (method, path, own.status_code, own.text)
        elif "{run_id}" in path:
            other = _call(http, method, path, op, acme, "globex-1")
            assert other.status_code == 404, (method, path, other.text)
            # Word for word what a run that does not exist gets: nothing tells them apart.
            ghost = _call(http, method, path, op, acme, "globex-9")
            assert other.text.replace("globex-1", "?") == ghost.text.replace("globex-9", "?")
            own = _call(http, method, path, op, acme, "acme-1")
            assert own.status_code not in (401, 403, 404) and own.status_code < 500, (
                method, path, own.status_code, own.text,
            )  # fmt: skip
            walked += 1
        elif path in ("/runs/replay", "/metrics") or path.startswith(("/schedules", "/tenants")):
            refused = _call(http, method, path, op, acme, "")
            assert refused.status_code == 403, (method, path, refused.text)
        else:
            answer = _call(http, method, path, op, acme, "")
            assert answer.status_code == 200, (method, path, answer.text)
            assert "globex-1" not in answer.text
    assert walked >= 12  # every run route of the document was tried

    listed = http.get("/runs", headers=_bearer(acme)).json()["runs"]
    assert sorted(r["run_id"] for r in listed) == ["acme-1", "acme-ask"]
    assert http.get("/counts", headers=_bearer(acme)).json() == {"cancelled": 1, "waiting": 1}
    # The other tenant's run is as it was: not cancelled, signalled nor steered.
    seen = http.get("/runs/globex-1", headers=_bearer(ADMIN)).json()
    assert seen["status"] == "pending" and seen["tenant"] == "globex"
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
