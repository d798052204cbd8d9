"""Debian's headless Chromium, driven by selenium through chromedriver, for the tests that
look at the pages as a user does. Screenshots go to .cairn/artifacts/web/."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.helpers.services import ROOT

ARTIFACTS = ROOT / ".cairn" / "artifacts" / "web"


def chromium(tmp_path: Path, *extra: str) -> Iterator[webdriver.Chrome]:
    """A fresh headless Chromium with its own profile under tmp_path, quit afterwards;
    extra: more of its command-line switches."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "Debian's chromium and chromium-driver: run `bash scripts/test`"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",  # as root, in a container
        "--disable-gpu",
        "--disable-dev-shm-usage",
        # This machine's network is closed: no background calls to Google's hosts.
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-quic",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium'}",
        "--window-size=1360,1000",
        *extra,
    ):
        options.add_argument(arg)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    chrome.set_page_load_timeout(30)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    yield chrome
    chrome.quit()
