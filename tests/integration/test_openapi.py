"""The HTTP API's OpenAPI document is pinned (tests/helpers/openapi.json): it changes only
when someone means it to. Fuzzing a real `cairn serve` against it is
tests/fleet/test_openapi.py's.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

from cairn.core.settings import Settings
from tests.helpers.services import ROOT

PINNED = ROOT / "tests" / "helpers" / "openapi.json"


def test_the_document_is_the_one_pinned(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every path, operation, parameter, body, response, schema and example of
    /openapi.json, key order aside, as tests/helpers/openapi.json holds them: what callers and
    generated clients depend on does not move with a refactoring of the server. Left out:
    the version (each release's) and the examples' workflow (the server's first that
    takes {}, so whatever this process has registered)."""
    from fastapi.testclient import TestClient

    from cairn.web import openapi
    from cairn.web.api import create_app

    monkeypatch.setattr(openapi, "example_workflow", lambda: "my-workflow")
    with TestClient(create_app(settings, insecure_no_auth=True)) as http:
        served = http.get("/openapi.json").json()
    del served["info"]["version"]
    text = json.dumps(served, sort_keys=True, indent=1) + "\n"
    pinned = PINNED.read_text()
    if text != pinned:
        (tmp_path / "openapi.json").write_text(text)
        diff = difflib.unified_diff(
            pinned.splitlines(keepends=True), text.splitlines(keepends=True), "pinned", "served"
        )
        pytest.fail(
            f"/openapi.json is not tests/helpers/openapi.json; if the change is meant, pin it: "
            f"cp {tmp_path / 'openapi.json'} {PINNED}\n" + "".join(diff)[:20000]
        )
