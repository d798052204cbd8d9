"""The pages in a real browser: Debian's headless Chromium, driven by selenium through
chromedriver, against `cairn serve` with real workers moving the runs. Screenshots of
each page are kept in .cairn/artifacts/web/."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from cairn.client.client import Client
from cairn.core.status import RunStatus
from cairn.testing import fleet
from cairn.workers import loop
from tests.helpers.browser import ARTIFACTS, chromium
from tests.helpers.runs import Server, wait_for


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    yield from chromium(tmp_path)


def _text(chrome: webdriver.Chrome, css: str) -> str:
    # Read in one script call: the live part may be replaced between find and read.
    text = chrome.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : '';", css
    )
    return " ".join(text.split())


def _until(chrome: webdriver.Chrome, check: Callable[[], object], what: str, timeout: float = 60):
    try:
        return WebDriverWait(chrome, timeout, poll_frequency=0.1).until(lambda _: check(), what)
    except Exception:
        chrome.save_screenshot(str(ARTIFACTS / "failed.png"))
        raise


def _login(chrome: webdriver.Chrome, server: Server) -> None:
    """The runs page sends us to the login form; the token gets us back."""
    chrome.get(f"{server.url}/ui/runs")
    assert "/login" in chrome.current_url
    chrome.find_element(By.ID, "token").send_keys(server.token)
    chrome.find_element(By.CSS_SELECTOR, "form.login button").click()
    # Loaded whole, not only its URL committed: a get() issued while the login's redirect
    # still loads can lose to it (the next page then never opens).
    _until(
        chrome,
        lambda: (
            chrome.current_url.endswith("/ui/runs")
            and chrome.execute_script("return document.readyState") == "complete"
        ),
        "the runs page",
    )


def test_watch_a_run_move_resume_and_finish_then_cancel_another(
    browser: webdriver.Chrome,
    serve: Callable[..., Server],
    start_worker: Callable[..., fleet.Proc],
    start_beat: Callable[[], fleet.Proc],
    leases,
) -> None:
    server = serve()
    first = start_worker(concurrency=2)
    start_beat()  # the reaper
    # 12 visits of ~0.4 s; a long one to cancel.
    with server.http() as api:
        moving = api.post(
            "/runs",
            json={"workflow": "loop", "run_id": "watched",
                  "input": {"visits": 12, "sleep_after_visit": {str(i): 0.4 for i in range(12)}}},
        ).json()["run_id"]  # fmt: skip
        doomed = api.post(
            "/runs",
            json={"workflow": "loop", "run_id": "doomed",
                  "input": {"visits": 200, "sleep_after_visit": {str(i): 1 for i in range(200)}}},
        ).json()["run_id"]  # fmt: skip

    _login(browser, server)
    _until(
        browser,
        lambda: len(browser.find_elements(By.CSS_SELECTOR, "tr[data-run]")) == 2,
        "both runs listed",
    )
    _until(browser, lambda: "running" in _text(browser, ".pills"), "a running count")
    browser.save_screenshot(str(ARTIFACTS / "runs.png"))

    # The run's page grows while a worker moves it, with no reload.
    browser.find_element(By.LINK_TEXT, moving).click()
    _until(browser, lambda: _text(browser, "#status") == "running", "the run running")
    marker = browser.find_element(By.TAG_NAME, "h1")

    def saved() -> int:
        return len(browser.find_elements(By.CSS_SELECTOR, "tr.step"))

    _until(browser, lambda: saved() >= 3, "three steps on the page")
    # Lose the whole worker mid-run; a new one resumes it once the lease has died.
    wait_for(lambda: leases.holder(moving) is not None, 10, "a lease on the watched run")
    first.kill()
    start_worker(concurrency=2)
    _until(browser, lambda: _text(browser, "#status") == "done", "the run done", timeout=90)
    assert marker.is_displayed()  # the same page: the live part refreshed in place
    assert saved() == 12
    assert "resumed by" in _text(browser, "tr.gaprow-resume")
    assert len(browser.find_elements(By.CSS_SELECTOR, ".timeline .lane")) >= 2  # a lane per process
    assert browser.find_elements(By.CSS_SELECTOR, ".gap-resume")
    assert _text(browser, "#seq") == "12"
    browser.save_screenshot(str(ARTIFACTS / "run.png"))

    # Cancel from the page; the run stops at its next step boundary.
    browser.get(f"{server.url}/ui/runs/{doomed}")
    _until(browser, lambda: _text(browser, "#status") in ("running", "pending"), "doomed moving")
    browser.find_element(By.ID, "cancel").click()
    WebDriverWait(browser, 5).until(expected_conditions.alert_is_present()).accept()
    _until(browser, lambda: _text(browser, "#status") == "cancelled", "the run cancelled", 30)
    assert not browser.find_element(By.ID, "cancel").is_enabled()
    browser.save_screenshot(str(ARTIFACTS / "cancelled.png"))

    # And the runs page counts it.
    browser.get(f"{server.url}/ui/runs?status=cancelled")
    rows = browser.find_elements(By.CSS_SELECTOR, "tr[data-run]")
    assert [r.get_attribute("data-run") for r in rows] == [doomed]


def test_fork_from_here_starts_a_new_run_from_that_step_and_opens_its_page(
    browser: webdriver.Chrome, serve: Callable[..., Server], client: Client, deps: loop.Deps
) -> None:
    original = client.enqueue("loop", {"visits": 3}, run_id="to-fork")
    assert loop.run(original, deps) == RunStatus.DONE
    server = serve()
    _login(browser, server)
    browser.get(f"{server.url}/ui/runs/{original}")
    _until(browser, lambda: _text(browser, "#status") == "done", "the run's page")
    browser.find_element(By.CSS_SELECTOR, '.fork-here[data-seq="2"]').click()
    alert = WebDriverWait(browser, 5).until(expected_conditions.alert_is_present())
    assert "at seq 2" in alert.text and "not touched" in alert.text
    alert.accept()
    _until(
        browser,
        lambda: "/ui/runs/" in browser.current_url and original not in browser.current_url,
        "the fork's page",
    )
    fork = browser.current_url.rsplit("/", 1)[1]
    assert [f.run_id for f in client.forks(original)] == [fork]
    got = client.get(fork)
    assert got is not None and (got.forked_from, got.forked_at, got.seq) == (original, 2, 2)
    _until(browser, lambda: "at seq 2" in _text(browser, "#origin"), "the fork's origin")
    assert (
        browser.find_element(By.CSS_SELECTOR, "#origin a")
        .get_attribute("href")
        .endswith(f"/ui/runs/{original}")
    )
    browser.save_screenshot(str(ARTIFACTS / "forked.png"))
    assert client.get(original).status == "done"  # type: ignore[union-attr]  # untouched


def test_approve_from_the_inbox_and_a_double_click_is_told_it_was_decided(
    browser: webdriver.Chrome,
    serve: Callable[..., Server],
    start_worker: Callable[..., fleet.Proc],
    client: Client,
    deps: loop.Deps,
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    asked = {}
    for amount in (7, 9):
        run_id = client.enqueue("refund", {"amount": amount}, run_id=f"refund-{amount}")
        assert loop.run(run_id, deps) == RunStatus.WAITING  # parked on its request
        asked[amount] = run_id
    server = serve()
    start_worker()
    _login(browser, server)
    browser.get(f"{server.url}/ui/approvals?order=oldest")
    _until(
        browser,
        lambda: len(browser.find_elements(By.CSS_SELECTOR, "tr[data-approval]")) == 2,
        "both requests listed",
    )
    assert "Refund 7 EUR?" in _text(browser, "tr[data-approval]")
    browser.save_screenshot(str(ARTIFACTS / "approvals.png"))

    # A double click: two decisions race; one is sent, the other told it came second.
    approve = browser.find_element(
        By.CSS_SELECTOR, "tr[data-approval] button[data-decision=approve]"
    )
    ActionChains(browser).double_click(approve).perform()
    _until(browser, lambda: len(browser.find_elements(By.CSS_SELECTOR, "#decisions li")) == 2,
           "both answers shown")  # fmt: skip
    said = [_text(browser, f"#decisions li:nth-child({n})") for n in (1, 2)]
    [sent] = [s for s in said if s.endswith(f"approve sent to run {asked[7]}")]
    [refused] = [s for s in said if s != sent]
    assert "approve refused: approval" in refused, said
    assert "was decided already: approve by admin" in refused
    _until(
        browser,
        lambda: len(browser.find_elements(By.CSS_SELECTOR, "tr[data-approval]")) == 1,
        "the decided one off the list",
    )
    browser.save_screenshot(str(ARTIFACTS / "approvals-decided.png"))
    # The worker woke the approved run, which went on with the decision.
    done = client.wait(asked[7], timeout=30)
    assert done.status == RunStatus.DONE and done.state["decided"]["decision"] == "approve"
    assert done.state["decided"]["by"] == "admin"
