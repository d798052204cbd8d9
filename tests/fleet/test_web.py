"""The HTTP API through the real thing: `cairn serve` (uvicorn) on loopback, real Postgres,
Redis and Celery workers, spoken to over HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from cairn.testing import fleet
from tests.helpers.runs import Server, wait_for
from tests.helpers.services import ROOT
from tests.helpers.web import login


@pytest.fixture
def api(serve: Callable[..., Server]) -> Iterator[httpx.Client]:
    with serve().http() as client:
        yield client


def test_serve_refuses_to_start_without_a_token(worker_env: dict[str, str]) -> None:
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "cairn.cli", "serve", "--port", str(fleet.free_port())],
        check=False,
        env=worker_env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 1
    assert "CAIRN_API_TOKEN is not set" in out.stderr and "--insecure-no-auth" in out.stderr
    assert time.monotonic() - started < 10


def test_insecure_no_auth_serves_without_a_token(serve: Callable[..., Server]) -> None:
    server = serve("--insecure-no-auth", token=None)
    with server.http(None) as http:
        assert http.get("/runs").status_code == 200
        assert "no CAIRN_API_TOKEN" in server.proc.text()


def test_every_route_but_healthz_needs_the_token(serve: Callable[..., Server]) -> None:
    server = serve()
    with server.http(None) as anonymous, server.http("not-the-token") as wrong:
        assert anonymous.get("/healthz").status_code == 200
        for path in ("/runs", "/counts", "/runs/x", "/runs/x/steps", "/metrics", "/docs",
                     "/openapi.json"):  # fmt: skip
            for client in (anonymous, wrong):
                response = client.get(path)
                assert response.status_code == 401, path
                assert response.headers["www-authenticate"] == "Bearer"
                assert "Authorization: Bearer" in response.json()["error"]["message"]
        assert anonymous.post("/runs", json={"workflow": "probe"}).status_code == 401
        assert anonymous.post("/runs/x/cancel").status_code == 401
        # A page sends the browser to the login form instead.
        page = anonymous.get("/ui/runs", follow_redirects=False)
        assert page.status_code == 303 and page.headers["location"].startswith("/login")
    with server.http() as http:
        assert http.get("/docs").status_code == 200
        assert "/runs/{run_id}/signals/{event}" in http.get("/openapi.json").json()["paths"]


def test_the_page_session_comes_from_the_token_and_guards_writes(
    serve: Callable[..., Server],
) -> None:
    server = serve()
    with httpx.Client(base_url=server.url, timeout=30, follow_redirects=True) as browser:
        bad = login(browser, "nope")
        assert bad.status_code == 200 and "not this server" in bad.text
        assert browser.get("/runs").status_code == 401
        login(browser, server.token, next="https://evil.test/")
        session = browser.cookies.get("cairn_session")
        assert session and server.token not in session  # derived, never the token itself
        assert browser.get("/ui/runs").status_code == 200
        assert browser.get("/runs").status_code == 200
        # A cross-site form could post with the cookie, but not with this header.
        forged = browser.post("/runs/x/cancel")
        assert forged.status_code == 403
        sent = browser.post("/runs/x/cancel", headers={"X-Cairn-Page": "1"})
        assert sent.status_code == 404


def _wait_status(http: httpx.Client, run_id: str, status: str, timeout: float = 60) -> dict:
    def reached() -> dict | None:
        run = http.get(f"/runs/{run_id}").json()
        return run if run["status"] == status else None

    return wait_for(reached, timeout, f"run {run_id} to be {status}")


def test_a_run_started_over_http_runs_to_done(
    api: httpx.Client, start_worker: Callable[..., fleet.Proc]
) -> None:
    start_worker()
    response = api.post("/runs", json={"workflow": "loop", "input": {"visits": 3}})
    assert response.status_code == 202, response.text
    run = response.json()
    assert run["workflow"] == "loop" and run["status"] in ("pending", "running")
    assert run["input"] == {"visits": 3}

    done = _wait_status(api, run["run_id"], "done")
    assert done["state"] == {"n": 3} and done["seq"] == 3
    steps = api.get(f"/runs/{run['run_id']}/steps").json()["steps"]
    assert [(s["seq"], s["cursor"], s["visit"], s["outcome"]) for s in steps] == [
        (0, "think", 0, "saved"),
        (1, "think", 1, "saved"),
        (2, "think", 2, "saved"),
    ]
    assert all(s["seconds"] >= 0 and s["worker"] for s in steps)
    listed = api.get("/runs", params={"status": "done"}).json()["runs"]
    assert [r["run_id"] for r in listed] == [run["run_id"]]
    assert api.get("/counts").json() == {"done": 1}
    metrics = api.get("/metrics").text
    assert 'cairn_runs{status="done"} 1.0' in metrics
    assert 'cairn_http_requests_total{method="POST",route="/runs",status="202"} 1.0' in metrics


def test_a_retried_post_is_the_same_run_and_a_changed_body_is_a_conflict(
    api: httpx.Client, sql: Callable[..., list[tuple[Any, ...]]]
) -> None:
    body = {"workflow": "loop", "input": {"visits": 2}}
    first = api.post("/runs", json=body, headers={"Idempotency-Key": "order-17"})
    again = api.post("/runs", json=body, headers={"Idempotency-Key": "order-17"})
    assert first.status_code == again.status_code == 202
    assert first.json()["run_id"] == again.json()["run_id"] == "order-17"
    by_id = api.post("/runs", json={**body, "run_id": "order-17"})
    assert by_id.json()["run_id"] == "order-17"
    assert sql("SELECT count(*) FROM runs") == [(1,)]

    changed = api.post(
        "/runs", json={**body, "input": {"visits": 5}}, headers={"Idempotency-Key": "order-17"}
    )
    assert changed.status_code == 409
    assert changed.json()["error"]["type"] == "run_id_conflict"
    assert "order-17" in changed.json()["error"]["message"]
    both = api.post("/runs", json={**body, "run_id": "a"}, headers={"Idempotency-Key": "b"})
    assert both.status_code == 422 and "differ" in both.json()["error"]["message"]
    assert sql("SELECT input FROM runs") == [({"visits": 2},)]


BAD_REQUESTS = [
    # (what, method, path, body (json text), headers, status, error type, words in message)
    ("not JSON", "POST", "/runs", '{"workflow": "loop",', {}, 400, "invalid_json", "not valid JSON"),
    ("no workflow", "POST", "/runs", '{"input": {}}', {}, 422, "invalid_request", "workflow"),
    ("unknown workflow", "POST", "/runs", '{"workflow": "nope"}', {}, 422, "unknown_workflow",
     "nope"),
    ("unknown field", "POST", "/runs", '{"workflow": "loop", "inputs": {}}', {}, 422,
     "invalid_request", "inputs"),
    ("input not an object", "POST", "/runs", '{"workflow": "loop", "input": [1]}', {}, 422,
     "invalid_request", "input"),
    ("NaN in input", "POST", "/runs", '{"workflow": "loop", "input": {"visits": NaN}}', {}, 422,
     "invalid_input", "NaN"),
    ("NUL in input", "POST", "/runs", '{"workflow": "loop", "input": {"a": "x\\u0000"}}', {},
     422, "invalid_input", "NUL"),
    ("bad run id", "POST", "/runs", '{"workflow": "loop", "run_id": "a b"}', {}, 422,
     "invalid_input", "run id"),
    ("bad idempotency key", "POST", "/runs", '{"workflow": "loop"}',
     {"Idempotency-Key": "x" * 300}, 422, "invalid_input", "run id"),
    ("negative cost cap", "POST", "/runs", '{"workflow": "loop", "max_cost_usd": -1}', {}, 422,
     "invalid_request", "max_cost_usd"),
    ("oversized body", "POST", "/runs",
     json.dumps({"workflow": "loop", "input": {"blob": "x" * 200_000}}), {}, 413,
     "body_too_large", "CAIRN_MAX_INPUT_BYTES"),
    ("input over the limit", "POST", "/runs",
     json.dumps({"workflow": "loop", "input": {"blob": "x" * 20_000}}), {}, 422, "invalid_input",
     "CAIRN_MAX_INPUT_BYTES"),
    ("unknown run", "GET", "/runs/nope", None, {}, 404, "unknown_run", "nope"),
    ("steps of an unknown run", "GET", "/runs/nope/steps", None, {}, 404, "unknown_run", "nope"),
    ("cancel an unknown run", "POST", "/runs/nope/cancel", None, {}, 404, "unknown_run", "nope"),
    ("signal an unknown run", "POST", "/runs/nope/signals/go", None, {}, 404, "unknown_run",
     "nope"),
    ("signal payload with NUL", "POST", "/runs/nope/signals/go", '{"payload": "\\u0000"}', {},
     422, "invalid_input", "NUL"),
    ("steer an unknown run", "POST", "/runs/nope/steer", '{"message": "hi"}', {}, 404,
     "unknown_run", "nope"),
    ("steer without a message", "POST", "/runs/nope/steer", "{}", {}, 422, "invalid_request",
     "message"),
    ("bogus status", "GET", "/runs?status=bogus", None, {}, 422, "invalid_request", "status"),
    ("limit 0", "GET", "/runs?limit=0", None, {}, 422, "invalid_request", "limit"),
    ("limit too large", "GET", "/runs?limit=100000", None, {}, 422, "invalid_request", "limit"),
    ("bad since", "GET", "/runs?since=yesterday", None, {}, 422, "invalid_request", "since"),
]  # fmt: skip


def test_bad_requests_get_a_clear_error_and_write_nothing(
    serve: Callable[..., Server], sql: Callable[..., list[tuple[Any, ...]]]
) -> None:
    server = serve(CAIRN_MAX_INPUT_BYTES="10000")
    with server.http() as http:
        for what, method, path, body, headers, status, kind, words in BAD_REQUESTS:
            started = time.monotonic()
            response = http.request(
                method,
                path,
                content=body,
                headers={"Content-Type": "application/json", **headers} if body else headers,
            )
            assert time.monotonic() - started < 2, what
            assert response.status_code == status, (what, response.text)
            error = response.json()["error"]
            assert error["type"] == kind, (what, error)
            assert words in error["message"], (what, error)
        # A wrong method: Allow names the path's methods, whichever router holds them.
        for method, path, methods in (
            ("DELETE", "/runs", "GET, POST"),
            ("PUT", "/runs/replay", "POST"),
            ("PUT", "/schedules", "GET, POST"),
            ("GET", "/schedules/x", "DELETE"),
        ):
            wrong = http.request(method, path)
            assert wrong.status_code == 405, (method, path, wrong.text)
            assert wrong.headers["allow"] == methods, (method, path, wrong.headers)
            assert wrong.json()["error"]["type"] == "method_not_allowed"
    assert sql("SELECT count(*) FROM runs") == [(0,)]


def test_keyset_pages_over_the_runs(api: httpx.Client, store: Any) -> None:
    for i in range(120):
        store.create_run(f"r{i:03d}", "loop" if i % 3 else "probe", {"visits": 1})
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = api.get("/runs", params={"limit": 50, **({"cursor": cursor} if cursor else {})})
        body = page.json()
        seen += [r["run_id"] for r in body["runs"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == [f"r{i:03d}" for i in reversed(range(120))]  # newest first, each once
    probes = api.get("/runs", params={"workflow": "probe", "limit": 500}).json()
    assert len(probes["runs"]) == 40 and probes["next_cursor"] is None
    assert api.get("/counts").json() == {"pending": 120}


def test_cancel_and_signal_over_http(
    api: httpx.Client, start_worker: Callable[..., fleet.Proc], store: Any
) -> None:
    store.create_run("idle", "loop", {"visits": 1})  # no message sent: it stays pending
    cancelled = api.post("/runs/idle/cancel", json={"reason": "not needed"})
    assert cancelled.status_code == 202
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["error"] is None or "not needed" in (cancelled.json()["error"] or "")

    start_worker()
    invoice = {"customer": "acme", "email": "ap@acme.test", "await_payment": True,
               "payment_timeout_s": 600}  # fmt: skip
    run_id = api.post("/runs", json={"workflow": "invoice", "input": invoice}).json()["run_id"]
    _wait_status(api, run_id, "waiting")
    steered = api.post(f"/runs/{run_id}/steer", json={"message": {"role": "user", "content": "hi"}})
    assert (steered.status_code, steered.json()) == (202, {"n": 1})
    body = {"payload": {"paid": 120}, "signal_id": "psp-1"}
    first = api.post(f"/runs/{run_id}/signals/payment", json=body)
    again = api.post(f"/runs/{run_id}/signals/payment", json=body)
    assert first.status_code == again.status_code == 202
    assert (first.json()["stored"], again.json()["stored"]) == (True, False)
    done = _wait_status(api, run_id, "done")
    assert done["cursor"] == "done"
    late = api.post(f"/runs/{run_id}/steer", json={"message": "too late"})
    assert late.status_code == 409 and late.json()["error"]["type"] == "run_ended"


class _Silent:
    """A port that accepts connections and never answers: a hung Postgres."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.mark.parametrize("outage", ["refused", "hung"])
def test_a_postgres_outage_is_a_503_within_seconds(
    serve: Callable[..., Server], outage: str
) -> None:
    silent = _Silent()
    port = silent.port if outage == "hung" else fleet.free_port()
    try:
        server = serve(CAIRN_DATABASE_URL=f"postgresql://postgres@127.0.0.1:{port}/cairn")
        with server.http() as http:
            for method, path, body in (
                ("GET", "/runs", None),
                ("POST", "/runs", {"workflow": "loop", "input": {"visits": 1}}),
                ("GET", "/healthz", None),
            ):
                started = time.monotonic()
                response = http.request(method, path, json=body)
                took = time.monotonic() - started
                assert response.status_code == 503, (path, response.text)
                assert took < 6.0, (path, took)
                if path == "/healthz":
                    assert f"127.0.0.1:{port}" in response.json()["problems"][0]
                else:
                    assert response.json()["error"]["type"] == "store_unavailable"
                    assert response.headers["retry-after"] == "5"
    finally:
        silent.close()


def _unknown(store: Any, run_id: str) -> str:
    """A run stopped as unknown: an at-most-once effect's intent without its mark."""
    from cairn.core.status import RunStatus

    store.create_run(run_id, "probe", {}, "one")
    cp = store.claim(run_id, 1)
    key = f"cairn:{run_id}:one:0"
    assert store.record_intent(cp, key) == ("written", None)
    store.end_attempt(cp, RunStatus.UNKNOWN, "outcome unknown")
    return key


def test_resolve_over_http(api: httpx.Client, store: Any) -> None:
    key = _unknown(store, "lost")
    assert api.get("/runs/lost").json()["status"] == "unknown"
    refused = api.post("/runs/lost/resolve", json={"done": "maybe"})
    assert refused.status_code == 422
    resolved = api.post("/runs/lost/resolve", json={"done": True, "result": {"id": "ch_1"}})
    assert resolved.status_code == 202 and resolved.json()["status"] == "pending"
    assert store.was_done(key) == (True, {"id": "ch_1"})
    assert api.post("/runs/nope/resolve", json={"done": False}).status_code == 404
