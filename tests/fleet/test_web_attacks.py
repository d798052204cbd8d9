"""The security review of `cairn serve` (#52), mounted as an attacker would: the admin
logged in, in Debian's headless Chromium, opens pages of the attacker's served on another
port of the same host (another origin, the same site: SameSite cookies still go) and on
another site (evil.test, mapped to 127.0.0.1 inside this Chromium only). Each attack must
fail: a login as the attacker's tenant, a logout, a framed click that approves. Beside
them, what the review found with a plain client: the headers on every answer, a session
cookie copied before a logout, token ids of any bytes, JSON nested too deep, and a run id
holding "/../" in a link."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from cairn.client.client import Client
from cairn.core.inputs import MAX_DEPTH
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.store.db import Database
from cairn.store.tokens import Tokens
from cairn.workers import loop
from tests.helpers.browser import ARTIFACTS, chromium
from tests.helpers.runs import Server, wait_for

EVIL = "evil.test"  # another site: this name means 127.0.0.1 to the test's Chromium only
HEADERS = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


class Attacker:
    """The attacker's web server: their pages, on a port of their own."""

    def __init__(self) -> None:
        self.pages: dict[str, str] = {}
        pages = self.pages

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.get(self.path.split("?")[0], "").encode()
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, where: str, name: str, html: str) -> str:
        """A page of theirs at name, as reached from another port or another site."""
        self.pages[f"/{name}"] = f"<!doctype html><html><body>{html}</body></html>"
        host = "127.0.0.1" if where == "port" else EVIL
        return f"http://{host}:{self.port}/{name}"


@pytest.fixture
def attacker() -> Iterator[Attacker]:
    a = Attacker()
    yield a
    a.server.shutdown()
    a.server.server_close()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    yield from chromium(tmp_path, f"--host-resolver-rules=MAP {EVIL} 127.0.0.1")


@pytest.fixture
def tokens(settings: Settings) -> Iterator[Tokens]:
    db = Database(settings.database_url, max_size=2)
    yield Tokens(db)
    db.close()


def _until(chrome: webdriver.Chrome, check: Callable[[], object], what: str, timeout: float = 30):
    try:
        return WebDriverWait(chrome, timeout, poll_frequency=0.1).until(lambda _: check(), what)
    except Exception:
        chrome.save_screenshot(str(ARTIFACTS / "attack-failed.png"))
        raise


def _loaded(chrome: webdriver.Chrome, prefix: str) -> bool:
    return chrome.current_url.startswith(prefix) and (
        chrome.execute_script("return document.readyState") == "complete"
    )


def _login(chrome: webdriver.Chrome, server: Server, token: str | None) -> None:
    chrome.get(f"{server.url}/login?next=/ui/runs")
    chrome.find_element(By.ID, "token").send_keys(token or "")
    chrome.find_element(By.CSS_SELECTOR, "form.login button").click()
    _until(chrome, lambda: _loaded(chrome, f"{server.url}/ui/runs"), "the runs page")


def _listed(chrome: webdriver.Chrome, server: Server) -> set[str]:
    """The runs this browser's session lists (whose session it is), or {"<login>"}."""
    chrome.get(f"{server.url}/ui/runs")
    if "/login" in chrome.current_url:
        return {"<login>"}
    # Read in one call: the list is drawn again every second.
    return set(
        chrome.execute_script(
            "return [...document.querySelectorAll('tr[data-run]')].map((r) => r.dataset.run);"
        )
    )


def _session(chrome: webdriver.Chrome) -> str | None:
    cookie = chrome.get_cookie("cairn_session")
    return cookie["value"] if cookie else None


def _two_tenants(server: Server, tokens: Tokens) -> str:
    """A run of the admin's and one of tenant evil's; the evil tenant's token."""
    _, evil = tokens.create("evil", "the attacker's own, legitimately")
    with server.http() as admin, server.http(evil) as theirs:
        assert admin.post("/runs", json={"workflow": "probe", "run_id": "admins-own"}).is_success
        assert theirs.post("/runs", json={"workflow": "probe", "run_id": "evils-own"}).is_success
    return evil


@pytest.mark.parametrize("where", ["port", "site"])
def test_a_login_posted_by_another_origin_does_not_log_the_admin_in_as_the_attacker(
    where: str,
    browser: webdriver.Chrome,
    serve: Callable[..., Server],
    attacker: Attacker,
    tokens: Tokens,
) -> None:
    server = serve()
    evil = _two_tenants(server, tokens)
    _login(browser, server, server.token)
    admins = {"admins-own", "evils-own"}
    assert _listed(browser, server) == admins
    before = _session(browser)

    # The attacker's form: their own token, posted from their page on arrival. From the
    # same host they also plant the login form's nonce cookie (cookies ignore ports) with
    # the check they read from a login page served to them.
    with httpx.Client(base_url=server.url, timeout=30) as theirs:
        form = theirs.get("/login")
        nonce = theirs.cookies.get("cairn_login") or ""
        found = [p.split('"')[0] for p in form.text.split('name="check" value="')[1:]]
    check = found[0] if found else ""
    plant = f'document.cookie = "cairn_login={nonce}; path=/";' if where == "port" else ""
    page = attacker.url(
        where,
        "login",
        f'<form id="f" method="post" action="{server.url}/login">'
        f'<input name="token" value="{evil}"><input name="next" value="/ui/runs">'
        f'<input name="check" value="{check}"></form>'
        f'<script>{plant} document.getElementById("f").submit();</script>',
    )
    browser.get(page)
    _until(browser, lambda: _loaded(browser, server.url), "the form posted to cairn")
    browser.save_screenshot(str(ARTIFACTS / f"attack-login-{where}.png"))
    # Still the admin, with the same session: the attacker's login did not happen.
    assert _listed(browser, server) == admins, f"login CSRF from another {where} worked"
    assert _session(browser) == before


@pytest.mark.parametrize("where", ["port", "site"])
def test_an_image_or_a_form_of_another_origin_does_not_log_the_admin_out(
    where: str, browser: webdriver.Chrome, serve: Callable[..., Server], attacker: Attacker
) -> None:
    server = serve()
    _login(browser, server, server.token)
    before = _session(browser)
    image = attacker.url(where, "img", f'<img src="{server.url}/logout" alt="">')
    browser.get(image)
    _until(browser, lambda: _loaded(browser, image), "the attacker's image page")
    assert _listed(browser, server) != {"<login>"}, f"an image from another {where} logged out"
    form = attacker.url(
        where,
        "form",
        f'<form id="f" method="post" action="{server.url}/logout">'
        '<input name="check" value="guessed"></form>'
        '<script>document.getElementById("f").submit();</script>',
    )
    browser.get(form)
    _until(browser, lambda: _loaded(browser, server.url), "the form posted to cairn")
    assert _listed(browser, server) != {"<login>"}, f"a form from another {where} logged out"
    assert _session(browser) == before


@pytest.mark.parametrize("where", ["port", "site"])
def test_a_framed_inbox_under_a_decoy_takes_no_click(
    where: str,
    browser: webdriver.Chrome,
    serve: Callable[..., Server],
    attacker: Attacker,
    client: Client,
    deps: loop.Deps,
) -> None:
    run_id = client.enqueue("refund", {"amount": 7}, run_id="framed-refund")
    assert loop.run(run_id, deps) == RunStatus.WAITING  # parked on its request
    server = serve()
    with server.http() as admin:
        [asked] = admin.get("/approvals").json()["approvals"]
    _login(browser, server, server.token)
    # Where the Approve button is, in a window of this size.
    browser.get(f"{server.url}/ui/approvals")
    box = _until(
        browser,
        lambda: browser.execute_script(
            "const b = document.querySelector('button[data-decision=approve]');"
            "if (!b) return null; const r = b.getBoundingClientRect();"
            "return [r.left + r.width / 2, r.top + r.height / 2];"
        ),
        "the approve button",
    )
    x, y = int(box[0]), int(box[1])
    page = attacker.url(
        where,
        "frame",
        f'<button style="position:fixed;left:{x - 60}px;top:{y - 15}px;width:120px;height:30px">'
        "Claim your prize</button>"
        f'<iframe id="f" src="{server.url}/ui/approvals" style="position:fixed;top:0;left:0;'
        'width:100vw;height:100vh;border:0;opacity:0.01;z-index:2"></iframe>',
    )
    browser.get(page)
    time.sleep(1.5)  # the frame's page, had it loaded, refreshes its live part each second
    browser.switch_to.frame(browser.find_element(By.ID, "f"))
    framed = browser.find_elements(By.CSS_SELECTOR, "header.top")  # a page of cairn's
    buttons = browser.find_elements(By.CSS_SELECTOR, "button.decide")
    browser.switch_to.default_content()
    actions = ActionChains(browser)
    actions.w3c_actions.pointer_action.move_to_location(x, y).click()
    actions.perform()
    time.sleep(2)  # a click that landed would have posted the decision by now
    browser.save_screenshot(str(ARTIFACTS / f"attack-frame-{where}.png"))
    with server.http() as admin:
        decided = admin.get(f"/approvals/{asked['approval_id']}").json()["decision"]
    assert decided is None, f"a framed click from another {where} decided: {decided}"
    assert not framed, f"another {where} framed a page of cairn's ({len(buttons)} buttons)"


RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__violations.push(e.effectiveDirective + " " + e.blockedURI));
"""


def test_the_pages_run_under_a_policy_that_refuses_inline_script_and_break_none_of_it(
    browser: webdriver.Chrome, serve: Callable[..., Server], client: Client, deps: loop.Deps
) -> None:
    done = client.enqueue("loop", {"visits": 3}, run_id="with-a-timeline")
    assert loop.run(done, deps) == RunStatus.DONE
    server = serve()
    browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_VIOLATIONS})
    _login(browser, server, server.token)
    with server.http() as api:
        events = api.post(f"/runs/{done}/events/token").json()["url"]
    for path in (
        "/ui/runs",
        f"/ui/runs/{done}",
        "/ui/approvals",
        "/login",
        f"/static/live.html?events={quote(events, safe='')}",
        "/docs",  # Swagger UI's own script is not on this closed network: nothing to refuse
    ):
        browser.get(server.url + path)
        _until(browser, lambda: _loaded(browser, server.url), path)
        time.sleep(0.5)
        assert browser.execute_script("return window.__violations") == [], path
    # The run's timeline is placed by the script, from data attributes: no inline style.
    browser.get(f"{server.url}/ui/runs/{done}")
    _until(browser, lambda: browser.find_elements(By.CSS_SELECTOR, ".bar"), "the timeline")
    lefts = browser.execute_script(
        "return [...document.querySelectorAll('.bar')].map((b) => [b.dataset.left, b.style.left]);"
    )
    # As numbers: a bar at 0.0 reads back "0%".
    assert lefts and all(
        style.endswith("%") and float(style[:-1]) == float(left) for left, style in lefts
    ), lefts
    # And the policy has teeth: a script that found a way into the page runs nothing.
    browser.execute_script(
        "const s = document.createElement('script'); s.textContent = 'window.__ran = 1';"
        "document.body.append(s);"
    )
    assert browser.execute_script("return window.__ran") is None
    assert any(
        v.startswith("script-src") for v in browser.execute_script("return window.__violations")
    )


def test_every_answer_carries_the_security_headers(serve: Callable[..., Server]) -> None:
    server = serve()
    with server.http() as http, server.http(None) as anonymous:
        answers = {
            "a page": http.get("/ui/runs"),
            "JSON": http.get("/runs"),
            "an unknown run": http.get("/runs/nope"),
            "a wrong method": http.delete("/runs"),
            "a bad body": http.post(
                "/runs", content=b"{", headers={"content-type": "application/json"}
            ),
            "the API's reference": http.get("/docs"),
            "no token": anonymous.get("/runs"),
            "the login form": anonymous.get("/login"),
            "a static file": anonymous.get("/static/cairn.js"),
            "the probe": anonymous.get("/healthz"),
            "a page without a session": anonymous.get("/ui/runs", follow_redirects=False),
        }
    for what, answer in answers.items():
        for name, value in HEADERS.items():
            assert answer.headers.get(name) == value, (what, name, answer.headers)
        policy = answer.headers.get("content-security-policy", "")
        assert (
            "frame-ancestors 'none'" in policy
            and "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]
        ), (what, policy)
    assert answers["a page"].headers["cache-control"] == "no-store"


def test_a_session_cookie_copied_before_a_logout_opens_nothing_after_it(
    browser: webdriver.Chrome, serve: Callable[..., Server]
) -> None:
    server = serve()
    _login(browser, server, server.token)
    copied = _session(browser)
    assert copied and server.token not in copied
    with httpx.Client(base_url=server.url, cookies={"cairn_session": copied}, timeout=30) as thief:
        assert thief.get("/runs").status_code == 200  # the copy works while the session lives
        browser.find_element(By.CSS_SELECTOR, "form.logout button, a[href='/logout']").click()
        _until(browser, lambda: _loaded(browser, f"{server.url}/login"), "the login page")
        assert _session(browser) is None
        assert thief.get("/runs").status_code == 401, "a copied cookie outlived the logout"
        assert thief.get("/ui/runs", follow_redirects=False).status_code == 303


def _raw(server: Server, head: bytes) -> int:
    """The status of a request sent byte for byte (no client would send these)."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head + b"Host: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def test_token_ids_of_any_bytes_are_401_never_a_500(serve: Callable[..., Server]) -> None:
    server = serve()
    mac = b"0" * 64
    for what, head in {
        "a NUL in a session cookie": b'GET /runs HTTP/1.1\r\nCookie: cairn_session="ab\\000cd"\r\n',
        "a non-UTF-8 session cookie": b"GET /runs HTTP/1.1\r\nCookie: cairn_session=ab\xff\xfe\r\n",
        "a huge session cookie": b"GET /runs HTTP/1.1\r\nCookie: cairn_session="
        + b"a" * 8000
        + b"\r\n",
        "a NUL in a read token's id": b"GET /runs/x/events?token=ab%00cdef0123."
        + mac
        + b" HTTP/1.1\r\n",
        "a non-UTF-8 read token's id": b"GET /runs/x/events?token=%ff%fe%fd."
        + mac
        + b" HTTP/1.1\r\n",
        "a huge read token's id": b"GET /runs/x/events?token="
        + b"a" * 8000
        + b"."
        + mac
        + b" HTTP/1.1\r\n",
        "a NUL-escaped token id": b"GET /runs HTTP/1.1\r\nAuthorization: Bearer cairn_ab%00cd_secret\r\n",
        "a non-UTF-8 token id": b"GET /runs HTTP/1.1\r\nAuthorization: Bearer cairn_\xff\xfe_secret\r\n",
        "a huge token id": b"GET /runs HTTP/1.1\r\nAuthorization: Bearer cairn_"
        + b"a" * 8000
        + b"_s\r\n",
    }.items():
        assert _raw(server, head) == 401, what
    assert server.proc.text().count("Traceback") == 0


def _nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


def test_json_nested_too_deep_is_a_422_and_stores_nothing(
    serve: Callable[..., Server], client: Client, deps: loop.Deps, sql: Callable[..., Any]
) -> None:
    parked = client.enqueue("refund", {"amount": 7}, run_id="deep-decision")
    assert loop.run(parked, deps) == RunStatus.WAITING
    server = serve()
    with server.http() as http:
        [asked] = http.get("/approvals").json()["approvals"]
        assert http.post("/runs", json={"workflow": "probe", "run_id": "target"}).is_success
        # Each route's body around a value (the bytes as sent: no client nests so deep).
        routes = {
            "/runs": b'{"workflow": "probe", "run_id": "deep", "input": {"x": %s}}',
            "/runs/target/signals/go": b'{"payload": %s}',
            "/runs/target/steer": b'{"message": %s}',
            f"/approvals/{asked['approval_id']}/decision": b'{"decision": "edit", "args": {"x": %s}}',
        }
        for path, body in routes.items():
            # The value's own depth: each is over the bound (an input's object is a level).
            for depth in (65, 66, 255, 256, 300, 900, 1000, 100_000):
                answer = http.post(path, content=body % _nested(depth).encode(),
                                   headers={"content-type": "application/json"})  # fmt: skip
                assert answer.status_code == 422, (path, depth, answer.text)
                assert answer.json()["error"]["type"] == "invalid_input", (path, depth)
        assert http.get("/runs/deep").status_code == 404
        assert http.get("/runs/target").status_code == 200
        assert http.get(f"/approvals/{asked['approval_id']}").json()["decision"] is None
        # At the bound: accepted, and read back whole (an input 64 deep, a payload too).
        at = json.loads(_nested(MAX_DEPTH - 1))
        got = http.post("/runs", json={"workflow": "probe", "run_id": "ok", "input": {"x": at}})
        assert got.status_code == 202, got.text
        assert http.get("/runs/ok").json()["input"] == {"x": at}
        payload = json.loads(_nested(MAX_DEPTH))
        sent = http.post("/runs/ok/signals/go", json={"payload": payload})
        assert sent.status_code == 202, sent.text
        assert sql("SELECT count(*) FROM signals") == [(1,)]
        assert http.get("/runs/ok").status_code == 200
    assert sql("SELECT count(*) FROM signals WHERE run_id = 'target'") == [(0,)]
    assert sql("SELECT count(*) FROM steer_messages") == [(0,)]
    assert server.proc.text().count("Traceback") == 0


def test_a_run_id_holding_dot_dot_is_encoded_in_its_link_and_opens_its_own_page(
    browser: webdriver.Chrome, serve: Callable[..., Server]
) -> None:
    server = serve()
    spoof, away = "spoof/../decoy", "x/../../logout"  # both valid run ids
    with server.http() as http:
        for run_id in ("decoy", spoof, away):
            assert http.post("/runs", json={"workflow": "probe", "run_id": run_id}).is_success
    _login(browser, server, server.token)
    for run_id in (spoof, away):
        browser.get(f"{server.url}/ui/runs")
        link = _until(
            browser,
            lambda run_id=run_id: browser.execute_script(
                "const a = [...document.querySelectorAll('tr[data-run] a')]"
                ".find((a) => a.textContent === arguments[0]); return a && a.getAttribute('href');",
                run_id,
            ),
            f"the link of {run_id}",
        )
        assert link == "/ui/runs/" + run_id.replace("/", "%2F"), link
        # Found and clicked in one call: the list is drawn again every second.
        browser.execute_script(
            "[...document.querySelectorAll('tr[data-run] a')]"
            ".find((a) => a.textContent === arguments[0]).click();",
            run_id,
        )
        _until(browser, lambda: _loaded(browser, f"{server.url}/ui/runs/"), "the run's page")
        heading = browser.execute_script("return document.querySelector('h1').textContent;")
        assert heading == run_id, browser.current_url  # its own page
    assert _listed(browser, server) >= {"decoy", spoof, away}  # and still logged in


def test_the_page_sessions_of_a_revoked_token_end_with_it(
    browser: webdriver.Chrome, serve: Callable[..., Server], tokens: Tokens
) -> None:
    server = serve()
    record, token = tokens.create("acme", "to revoke")
    _login(browser, server, token)
    copied = _session(browser)
    assert copied
    tokens.revoke(record.id)
    with httpx.Client(base_url=server.url, cookies={"cairn_session": copied}, timeout=30) as held:
        wait_for(lambda: held.get("/runs").status_code == 401, 10, "the session refused")
    assert _listed(browser, server) == {"<login>"}
