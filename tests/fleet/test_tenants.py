"""Two tenants through the real thing: `cairn serve` and a Celery worker, each a process of
its own, with tokens made by `cairn tokens`' store. A tenant's runs wait for its
concurrency limit and then run to the end; its token reads its own run's live events and
pages, and another tenant's run is a 404 there (every route of the document is walked in
tests/integration/test_tenants_api.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from cairn.core.settings import Settings
from cairn.store.db import Database
from cairn.store.tokens import Tokens
from cairn.testing import fleet
from tests.helpers.runs import Server, wait_for
from tests.helpers.web import login


@pytest.fixture
def tokens(settings: Settings) -> Iterator[Tokens]:
    db = Database(settings.database_url, max_size=1)
    yield Tokens(db)
    db.close()


def test_two_tenants_on_a_real_server_and_worker(
    serve: Callable[..., Server], start_worker: Callable[..., fleet.Proc], tokens: Tokens
) -> None:
    server = serve(CAIRN_TENANT_CONCURRENCY="1")
    _, acme = tokens.create("acme")
    _, globex = tokens.create("globex")
    with server.http(acme) as mine, server.http(globex) as theirs:
        body = {"workflow": "loop", "input": {"visits": 2}}
        first = mine.post("/runs", json={**body, "run_id": "acme-a"}).json()
        second = mine.post("/runs", json={**body, "run_id": "acme-b"}).json()
        other = theirs.post("/runs", json={**body, "run_id": "globex-a"}).json()
        # acme's one slot is the first's; globex's run does not wait for acme's.
        assert (first["status"], second["status"], other["status"]) == (
            "pending",
            "queued",
            "pending",
        )
        assert second["concurrency_key"] == "cairn.tenant:acme"
        start_worker()

        def done(client: httpx.Client, run_id: str) -> bool:
            return client.get(f"/runs/{run_id}").json()["status"] == "done"

        wait_for(lambda: done(mine, "acme-b") and done(theirs, "globex-a"), 30, "all done")

        # The live stream: one's own run's events to its end; another's is no run.
        with mine.stream("GET", "/runs/acme-a/events") as events:
            assert events.status_code == 200
            assert "run_ended" in "".join(events.iter_text())
        assert mine.get("/runs/globex-a/events").status_code == 404
        assert theirs.get("/runs/acme-a/events").status_code == 404
        assert [r["run_id"] for r in theirs.get("/runs").json()["runs"]] == ["globex-a"]

    with httpx.Client(base_url=server.url, timeout=30) as browser:
        login(browser, globex)
        page = browser.get("/ui/runs")
        assert "globex-a" in page.text and "acme-a" not in page.text
        assert browser.get("/ui/runs/acme-a").status_code == 404
        assert browser.get("/ui/runs/globex-a").status_code == 200
