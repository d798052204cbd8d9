"""Logging in to `cairn serve`'s pages as a browser does: the login form first (it sets
the form's nonce cookie and embeds its check), then the form posted with the token."""

from __future__ import annotations

import re
from typing import Any

import httpx

CHECK = re.compile(r'name="check" value="([^"]+)"')


def check_of(page: str) -> str:
    """The check a page embeds in its form (the login form's, the logout button's)."""
    found = CHECK.search(page)
    assert found, "no form with a check on the page"
    return found.group(1)


def login(http: Any, token: str | None, next: str = "/ui/runs", **options: Any) -> httpx.Response:
    """Post the login form with token, as a browser does, on http (an httpx.Client or a
    TestClient, whose cookies then hold the session)."""
    form = http.get("/login")
    data = {"token": token or "", "next": next, "check": check_of(form.text)}
    return http.post("/login", data=data, **options)  # type: ignore[no-any-return]
