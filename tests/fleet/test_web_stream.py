"""A run's live events on the run page and over plain SSE, against `cairn serve` with real
workers: a `chat` run's answer appears token by token in headless Chromium, the attempt
of a SIGKILLed worker stays marked cut while the next one streams the whole answer again;
a reader that reconnects with Last-Event-ID misses nothing and sees nothing twice; and who
may read the stream. Screenshots are kept in .cairn/artifacts/web/."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from cairn.store import Leases
from cairn.testing import fleet
from cairn.web import answers
from tests.helpers.browser import ARTIFACTS, chromium
from tests.helpers.runs import Server, holder_pid, wait_for
from tests.helpers.services import ROOT

# 40 words, one token each from the model stand-in, TOKEN_MS apart: about 4 s of answer,
# long enough to watch it grow and to kill its worker halfway. One is markup, to be shown
# as text.
REPLY = " ".join(f"word{i:02d}" if i != 30 else "<b>bold</b>" for i in range(40))


def _chat(reply: str, token_ms: int) -> dict[str, Any]:
    return {"workflow": "chat", "input": {"prompt": f"REPLY: {reply}\nTOKEN_MS: {token_ms}"}}


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    yield from chromium(tmp_path)


def _until(chrome: webdriver.Chrome, check: Callable[[], object], what: str, timeout: float = 60):
    try:
        return WebDriverWait(chrome, timeout, poll_frequency=0.1).until(lambda _: check(), what)
    except Exception:
        chrome.save_screenshot(str(ARTIFACTS / "stream-failed.png"))
        raise


def _text(chrome: webdriver.Chrome, css: str) -> str:
    text = chrome.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : '';", css
    )
    return " ".join(text.split())


def _data(chrome: webdriver.Chrome, name: str) -> str | None:
    """A data attribute of the Live panel."""
    return chrome.execute_script(
        "return document.getElementById('stream').dataset[arguments[0]];", name
    )


def _attempts(chrome: webdriver.Chrome) -> list[dict[str, str]]:
    """The Live panel's attempt blocks, read in one script call (tokens keep arriving)."""
    return chrome.execute_script(
        """return [...document.querySelectorAll('#attempts .attempt')].map((b) => ({
             cursor: b.dataset.cursor, attempt: b.dataset.attempt, state: b.dataset.state,
             cut: b.dataset.cut || '', cls: b.className,
             text: [...b.querySelectorAll('pre.text')].map((p) => p.textContent).join('')}));"""
    )


def test_the_run_page_streams_the_answer_and_marks_the_killed_attempt_cut(
    browser: webdriver.Chrome,
    serve: Callable[..., Server],
    start_worker: Callable[..., fleet.Proc],
    start_beat: Callable[[], fleet.Proc],
    leases: Leases,
) -> None:
    server = serve()
    browser.get(f"{server.url}/login?next=/ui/runs")
    browser.find_element(By.ID, "token").send_keys(server.token)
    browser.find_element(By.CSS_SELECTOR, "form.login button").click()
    _until(browser, lambda: browser.current_url.endswith("/ui/runs"), "the runs page")
    with server.http() as api:
        run_id = api.post("/runs", json=_chat(REPLY, 100)).json()["run_id"]

    # The page follows before any worker runs the run: every token arrives live.
    browser.get(f"{server.url}/ui/runs/{run_id}")
    _until(browser, lambda: _data(browser, "state") == "live", "the Live panel connected")
    start_worker(concurrency=1)
    start_beat()  # the reaper, should the killed attempt's delivery be lost

    # Token by token: the first attempt's text is seen at several lengths, all short of
    # the whole answer, each a prefix of it.
    seen: list[int] = []
    deadline = time.monotonic() + 60
    while len(seen) < 3 and time.monotonic() < deadline:
        blocks = _attempts(browser)
        if blocks:
            text = blocks[0]["text"]
            assert REPLY.startswith(text), text
            if text and (not seen or len(text) > seen[-1]):
                seen.append(len(text))
        time.sleep(0.05)
    assert len(seen) >= 3 and seen[-1] < len(REPLY), seen
    browser.save_screenshot(str(ARTIFACTS / "stream-live.png"))

    # Lose the process that runs the step, mid-answer; the next attempt answers again.
    pid = wait_for(lambda: holder_pid(leases, run_id), 10, "a lease holder")
    os.kill(pid, signal.SIGKILL)
    start_worker(concurrency=1)
    _until(browser, lambda: _data(browser, "ended") == "done", "run_ended on the page", 90)
    browser.save_screenshot(str(ARTIFACTS / "stream-done.png"))

    blocks = [b for b in _attempts(browser) if b["cursor"] == "answer"]
    cut, last = blocks[0], blocks[-1]
    assert cut["state"] == "cut" and cut["cut"] == "worker lost" and "cut" in cut["cls"].split()
    assert browser.find_elements(By.CSS_SELECTOR, '.attempt.cut[data-cut="worker lost"]')
    assert cut["text"] and len(cut["text"]) < len(REPLY) and REPLY.startswith(cut["text"])
    assert last["state"] == "saved" and last["text"] == REPLY
    assert not browser.find_elements(By.CSS_SELECTOR, "#stream b")  # text, never markup
    assert int(last["attempt"]) > int(cut["attempt"])
    assert all(b["state"] == "cut" for b in blocks[:-1])
    kinds = browser.execute_script(
        "return [...document.querySelectorAll('#feed li')].map((li) => li.dataset.kind);"
    )
    assert {"attempt_abandoned", "resumed", "message", "step_saved"} <= set(kinds)
    assert kinds[-1] == "run_ended"
    _until(browser, lambda: _text(browser, "#status") == "done", "the status card done", 10)
    assert _text(browser, "#resumed") == "1×"
    assert _text(browser, "#stream-state") == "ended: done"
    # The long prompt and answer wrap or scroll in their boxes: the page is as wide as the window.
    assert browser.execute_script(
        "return document.documentElement.scrollWidth <= document.documentElement.clientWidth;"
    )


# -- the EventSource example page (issue 45) -----------------------------------------------


def _live_blocks(chrome: webdriver.Chrome) -> list[dict[str, str]]:
    return chrome.execute_script(
        """return [...document.querySelectorAll('#attempts .attempt')].map((b) => ({
             cursor: b.dataset.cursor, attempt: b.dataset.attempt, state: b.dataset.state,
             text: b.querySelector('pre.text').textContent}));"""
    )


def test_the_eventsource_example_shows_the_cut_attempt_and_the_resumed_answer(
    browser: webdriver.Chrome,
    serve: Callable[..., Server],
    start_worker: Callable[..., fleet.Proc],
    start_beat: Callable[[], fleet.Proc],
    leases: Leases,
    worker_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """/static/live.html, the docs' example, with the read token the API hands out and
    nothing else: the answer grows token by token; its worker is SIGKILLed and the server
    too, mid-answer; the browser's own EventSource reconnects to the server started again
    on its port, and the page shows the cut attempt and the next one's whole answer, once."""
    server = serve()
    with server.http() as api:
        run_id = api.post("/runs", json=_chat(REPLY, 100)).json()["run_id"]
        given = api.post(f"/runs/{run_id}/events/token").json()
        assert api.post("/runs/nope/events/token").json()["error"]["type"] == "unknown_run"
    assert given["url"] == f"/runs/{run_id}/events?token={given['token']}"
    # The docs' excerpt is the page's own code.
    static = ROOT / "cairn" / "web" / "static"
    page = (static / "live.html").read_text() + (static / "live.js").read_text()
    guide = (ROOT / "docs" / "guides" / "live-output.md").read_text()
    excerpt = guide.split("```javascript\n", 1)[1].split("```", 1)[0]
    assert all(line.strip() in page for line in excerpt.splitlines())

    browser.get(f"{server.url}/static/live.html?events={quote(given['url'], safe='')}")
    _until(browser, lambda: _text(browser, "#state") == "live", "the EventSource open")
    start_worker(concurrency=1)
    start_beat()
    _until(browser, lambda: len((_live_blocks(browser) or [{"text": ""}])[0]["text"]) > 40,
           "the first tokens")  # fmt: skip
    first = _live_blocks(browser)[0]["text"]
    assert REPLY.startswith(first) and len(first) < len(REPLY), first

    # Mid-answer: the worker and the server go, a new server comes on the same port.
    pid = wait_for(lambda: holder_pid(leases, run_id), 10, "a lease holder")
    os.kill(pid, signal.SIGKILL)
    server.proc.kill()
    _until(browser, lambda: _text(browser, "#state") == "reconnecting", "the drop seen", 20)
    port = int(server.url.rsplit(":", 1)[1])
    env = {**worker_env, "CAIRN_API_TOKEN": server.token or ""}
    again = fleet.start_server(env, tmp_path / "serve-again.log", port)
    try:
        start_worker(concurrency=1)
        _until(browser, lambda: _text(browser, "#state") == "ended", "run_ended on the page", 90)
        browser.save_screenshot(str(ARTIFACTS / "live-example-done.png"))
        blocks = [b for b in _live_blocks(browser) if b["cursor"] == "answer"]
        cut, last = blocks[0], blocks[-1]
        assert cut["state"] == "cut" and "worker lost" in _text(browser, ".attempt.cut .why")
        assert len(first) <= len(cut["text"]) < len(REPLY) and REPLY.startswith(cut["text"])
        assert last["state"] == "saved" and last["text"] == REPLY  # whole, nothing twice
        assert int(last["attempt"]) > int(cut["attempt"])
        assert _text(browser, "#status") == "done"
        assert not browser.find_elements(By.CSS_SELECTOR, "#attempts b")  # text, not markup
        # What the page read, as the document types it: every event an Event, each of
        # cairn's kinds' data its model (cairn.web.answers), the kill's kinds among them
        # (and chat's own "answered").
        with httpx.Client(base_url=server.url, timeout=30) as http:
            answer = http.get(given["url"] + "&after=0")
            assert answer.status_code == 200, answer.text
            told = answer.text
    finally:
        again.kill()
    models = {m.__name__.removesuffix("Data").lower(): m for m in answers.EVENT_DATA}
    kinds = set()
    for line in told.splitlines():
        if line.startswith("data: "):
            event = answers.Event.model_validate_json(line[6:])
            key = event.kind.replace("_", "")
            if key in models:
                models[key].model_validate(event.data)
            kinds.add(event.kind)
    assert {"token", "attempt_abandoned", "resumed", "message", "run_ended"} <= kinds, kinds


# -- plain SSE ----------------------------------------------------------------------------
