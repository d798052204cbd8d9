"""The pages' sessions and the forms that make and end them (#52), the app in process on
the real services: a session is random and kept as its hash, ended by a logout (a copied
cookie with it) and by revoking its token; login and logout take only this server's own
forms; the cookies are Secure over HTTPS, a trusted proxy's word included and no one
else's; every answer, an error's too, carries the security headers. The same attacks
from a real browser, from another port and another site: tests/fleet/test_web_attacks.py."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

import tests.helpers.flows  # noqa: F401  (registers probe)
from cairn.core.settings import Settings
from cairn.store.db import Database
from cairn.store.tokens import Tokens
from cairn.web.headers import HEADERS
from tests.helpers.web import check_of, login

ADMIN = "admin-token-for-the-sessions-test"


@pytest.fixture
def app_of(settings: Settings) -> Iterator[Callable[..., TestClient]]:
    from cairn.web.api import create_app

    opened: list[TestClient] = []

    def app(client: tuple[str, int] = ("127.0.0.1", 5000), **options: Any) -> TestClient:
        made = create_app(settings.with_options(**{"api_token": ADMIN, **options}))
        opened.append(TestClient(made, client=client, follow_redirects=False).__enter__())
        return opened[-1]

    yield app
    for c in opened:
        c.__exit__(None, None, None)


@pytest.fixture
def tokens(settings: Settings) -> Iterator[Tokens]:
    db = Database(settings.database_url, max_size=2)
    yield Tokens(db)
    db.close()


def _held(http: TestClient, value: str, path: str = "/runs") -> int:
    """The status path answers a request carrying only the session cookie value."""
    return http.get(path, headers={"cookie": f"cairn_session={value}"}).status_code


def test_a_session_is_random_kept_as_its_hash_and_ended_by_logout(
    app_of: Callable[..., TestClient], sql: Callable[..., list[tuple[Any, ...]]]
) -> None:
    http = app_of()
    values = []
    for _ in range(2):
        assert login(http, ADMIN).status_code == 303
        values.append(http.cookies["cairn_session"])
    first, second = values
    assert first != second and ADMIN not in first  # random, never the token nor a MAC of it
    kept = {bytes(h) for (h,) in sql("SELECT hash FROM page_sessions")}
    assert hashlib.sha256(second.encode()).digest() in kept  # the hash, never the value
    assert not any(second.encode() in h for h in kept)
    # The second login ended the first session the browser held.
    assert _held(http, first) == 401 and _held(http, second) == 200

    page = http.get("/ui/runs")
    assert 'action="/logout"' in page.text
    # GET /logout is no logout (an <img> could do it), nor a post without the page's check.
    assert http.get("/logout").status_code == 405
    assert http.post("/logout", data={"check": "guessed"}).status_code == 403
    assert _held(http, second) == 200
    out = http.post("/logout", data={"check": check_of(page.text)})
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert "cairn_session" not in http.cookies
    assert _held(http, second) == 401, "a copied cookie outlived the logout"
    assert _held(http, second, "/ui/runs") == 303
    assert sql("SELECT count(*) FROM page_sessions") == [(0,)]


def test_login_takes_only_this_servers_own_form(app_of: Callable[..., TestClient]) -> None:
    http = app_of()

    def form() -> str:
        """A login form served to this client (its nonce in the cookie jar): its check."""
        return check_of(http.get("/login").text)

    tries = {
        "no check": ("", {}),
        "a check of another nonce": ("0" * 64, {}),
        "a same-site page's post": (None, {"sec-fetch-site": "same-site"}),
        "a cross-site page's post": (None, {"sec-fetch-site": "cross-site"}),
        "another origin's post": (None, {"origin": "http://127.0.0.1:9999"}),
    }
    for what, (check, headers) in tries.items():
        own = form()
        data = {"token": ADMIN, "check": own if check is None else check}
        sent = http.post("/login", data=data, headers=headers)
        assert sent.status_code == 403, what
        assert "did not come from this page" in sent.text, what
        assert "cairn_session" not in http.cookies, what
    # Without the nonce's cookie, a check read from another browser's form is nothing.
    check = form()
    http.cookies.clear()
    assert http.post("/login", data={"token": ADMIN, "check": check}).status_code == 403
    # The form as served, from its own origin: in.
    check = form()
    ok = http.post(
        "/login",
        data={"token": ADMIN, "check": check, "next": "/ui/approvals"},
        headers={"sec-fetch-site": "same-origin", "origin": "http://testserver"},
    )
    assert ok.status_code == 303 and ok.headers["location"] == "/ui/approvals"
    assert "cairn_login" not in http.cookies  # a nonce serves once
    # A login bounces only within this server: "/\\host" is "//host" to a browser.
    for away in ("//evil.test/", "/\\evil.test/", "https://evil.test/", "/x\r\nSet-Cookie: a=b"):
        assert login(http, ADMIN, next=away).headers["location"] == "/ui/runs", away


def test_a_revoked_tokens_sessions_end_with_it_and_another_server_token_opens_none(
    app_of: Callable[..., TestClient], tokens: Tokens, sql: Callable[..., list[tuple[Any, ...]]]
) -> None:
    record, token = tokens.create("acme")
    http = app_of()
    login(http, token)
    acme = http.cookies["cairn_session"]
    http.cookies.clear()
    login(http, ADMIN)
    admin = http.cookies["cairn_session"]
    assert _held(http, acme) == 200 and _held(http, admin) == 200
    tokens.revoke(record.id)
    assert sql("SELECT count(*) FROM page_sessions WHERE token_id IS NOT NULL") == [(0,)]
    deadline = time.monotonic() + 5
    while _held(http, acme) != 401:
        assert time.monotonic() < deadline, "a revoked token's session still works"
        time.sleep(0.2)
    # A server started with another CAIRN_API_TOKEN: the old token's sessions open nothing.
    other = app_of(api_token="a-new-token")
    assert _held(other, admin) == 401
    assert _held(http, admin) == 200


def test_a_session_ends_when_it_expires(app_of: Callable[..., TestClient]) -> None:
    http = app_of(web_session_seconds=1.0)
    login(http, ADMIN)
    value = http.cookies["cairn_session"]
    assert _held(http, value) == 200
    time.sleep(3.5)  # its time, and the guard's memory of it (TOKEN_TTL)
    assert _held(http, value) == 401


@pytest.mark.parametrize(
    ("options", "peer", "proto", "secure"),
    [
        ({}, "127.0.0.1", None, False),
        ({}, "127.0.0.1", "https", False),  # no proxy is trusted: the header is anyone's
        ({"web_trusted_proxies": ("10.0.0.0/8",)}, "10.1.2.3", "https", True),
        ({"web_trusted_proxies": ("10.0.0.0/8",)}, "192.168.1.9", "https", False),
        ({"web_trusted_proxies": ("10.0.0.5",)}, "10.0.0.5", "http", False),
        ({"web_secure_cookies": True}, "127.0.0.1", None, True),
    ],
)
def test_the_cookies_are_secure_over_https_as_a_trusted_proxy_says(
    app_of: Callable[..., TestClient],
    options: dict[str, Any],
    peer: str,
    proto: str | None,
    secure: bool,
) -> None:
    http = app_of(client=(peer, 5000), **options)
    headers = {"x-forwarded-proto": proto} if proto else {}
    form = http.get("/login", headers=headers)
    [made] = form.headers.get_list("set-cookie")
    name = "__Host-cairn_login" if secure else "cairn_login"
    assert made.startswith(f"{name}=") and ("; secure" in made.lower()) == secure, made
    assert "httponly" in made.lower() and "samesite=strict" in made.lower()
    nonce = made.split(";")[0].split("=", 1)[1]
    data = {"token": ADMIN, "check": check_of(form.text)}
    sent = http.post("/login", data=data, headers={**headers, "cookie": f"{name}={nonce}"})
    assert sent.status_code == 303, sent.text
    session = next(c for c in sent.headers.get_list("set-cookie") if "cairn_session=" in c)
    assert session.startswith("__Host-cairn_session=" if secure else "cairn_session=")
    assert ("; secure" in session.lower()) == secure and "path=/" in session.lower()


def test_token_ids_of_any_bytes_are_401_without_a_query(app_of: Callable[..., TestClient]) -> None:
    http = app_of()
    mac = "0" * 64
    for what, (path, headers) in {
        "a NUL in a session": ("/runs", {"cookie": 'cairn_session="ab\\000cd"'}),
        "a megabyte session": ("/runs", {"cookie": "cairn_session=" + "a" * 1_000_000}),
        "a NUL in a read token": (f"/runs/x/events?token=ab%00cdef0123.{mac}", {}),
        "non-UTF-8 in a read token": (f"/runs/x/events?token=%ff%fe%fd.{mac}", {}),
        "a huge read token": (f"/runs/x/events?token={'a' * 60_000}.{mac}", {}),
        "a megabyte token": ("/runs", {"authorization": "Bearer cairn_" + "a" * 1_000_000 + "_s"}),
        "a token id of other bytes": ("/runs", {"authorization": b"Bearer cairn_\xff\xfe_s"}),
    }.items():
        assert http.get(path, headers=headers).status_code == 401, what


def test_every_answer_carries_the_headers_a_crash_too(app_of: Callable[..., TestClient]) -> None:
    http = app_of()

    @http.app.get("/crash")  # type: ignore[attr-defined]
    def crash() -> None:
        raise RuntimeError("boom")

    raw = TestClient(http.app, raise_server_exceptions=False)
    answers = [
        raw.get("/crash", headers={"authorization": f"Bearer {ADMIN}"}),
        raw.get("/runs"),  # 401 from the guard
        raw.get("/login"),
        raw.get("/static/cairn.js"),
        raw.post(
            "/runs", content=b"[" * 70 + b"]" * 70, headers={"authorization": f"Bearer {ADMIN}"}
        ),
    ]
    assert [a.status_code for a in answers] == [500, 401, 200, 200, 422]
    for answer in answers:
        for name, value in HEADERS.items():
            assert answer.headers.get(name) == value, (answer.request.url, name)


def test_a_run_id_holding_slashes_is_encoded_in_every_link_and_its_page_opens(
    app_of: Callable[..., TestClient],
) -> None:
    http = app_of()
    login(http, ADMIN)
    run_id = f"a/../../logout/{uuid.uuid4().hex[:6]}"
    made = http.post(
        "/runs",
        json={"workflow": "probe", "run_id": run_id},
        headers={"authorization": f"Bearer {ADMIN}"},
    )
    assert made.status_code == 202
    encoded = run_id.replace("/", "%2F")
    page = http.get("/ui/runs").text
    assert f'href="/ui/runs/{encoded}"' in page and f'href="/ui/runs/{run_id}"' not in page
    own = http.get(f"/ui/runs/{encoded}")
    assert own.status_code == 200 and f'<h1 class="mono">{run_id}</h1>' in own.text
