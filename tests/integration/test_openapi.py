"""The HTTP API's OpenAPI document is pinned (tests/helpers/openapi.json): it changes only
when someone means it to. Fuzzing a real `cairn serve` against it is
tests/fleet/test_openapi.py's.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

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


def _open(schema: dict[str, Any]) -> bool:
    """An object that says nothing of its fields: no properties, and any others allowed."""
    if schema.get("type") != "object" or schema.get("properties"):
        return False
    return schema.get("additionalProperties", True) in (True, {})


def test_every_answer_is_a_named_typed_schema() -> None:
    """A generated client knows each answer's fields (issue 45): every 2xx JSON body of
    the pinned document is a $ref to a named schema that is no open object, and so is
    each of its properties' objects but the user's own data (input, state, a result)."""
    document = json.loads(PINNED.read_text())
    models = document["components"]["schemas"]
    user_data = {
        "input",
        "state",
        "result",
        "data",
        "payload",
        "input_patch",
        "request",
        "args",
    }  # request, args: what a step asks a person, its tool's arguments
    bodies = 0
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            for code, response in op["responses"].items():
                if not code.startswith("2"):
                    continue
                for media, content in response.get("content", {}).items():
                    where = f"{method.upper()} {path} {code} {media}"
                    if not media.endswith("json") and media != "text/event-stream":
                        continue
                    ref = content.get("schema", {}).get("$ref", "")
                    assert ref.startswith("#/components/schemas/"), f"{where}: not named"
                    schema = models[ref.rsplit("/", 1)[1]]
                    assert not _open(schema), f"{where}: an open object"
                    bodies += 1
    assert bodies >= 18
    for name, schema in models.items():
        for field, prop in schema.get("properties", {}).items():
            kinds = prop.get("anyOf", [prop])
            if field not in user_data:
                assert not any(_open(k) for k in kinds), f"{name}.{field}: an open object"
    for kind in ("Run", "Step", "Call", "Event", "Schedule", "RunEndedData", "TokenData"):
        assert kind in models


def test_the_event_kinds_of_the_document_are_cairns_own() -> None:
    """EventKind is core.events.RESERVED, and each kind with data has its model."""
    from typing import get_args

    from cairn.core.events import RESERVED
    from cairn.web import answers

    assert set(get_args(answers.EventKind)) == RESERVED
    named = {m.__name__.removesuffix("Data").lower() for m in answers.EVENT_DATA}
    assert {k.replace("_", "") for k in RESERVED} - named == {"stepstarted"}
