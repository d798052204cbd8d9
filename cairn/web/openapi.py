"""The API's OpenAPI document, complete: every response a route can give, in one error
shape, and every rule a request must follow, so /openapi.json is the API's reference
(tests/fleet/test_openapi.py fuzzes `cairn serve` against it).

A route declares what is its own (its 404 and 409, its models); what every route shares
is added here, once, from the one place that causes it: the guard's 401/403/411/413,
request validation's 400/422, the Client's 503, and each operation's tenancy decision
(`x-cairn-tenancy`: who may call it and why, cairn.client.tenancy; an admin's answers a
tenant's token 403). The shapes themselves are in cairn.web.models and cairn.web.errors.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, get_args

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from cairn.client.tenancy import Decision, Who
from cairn.core.errors import InvalidInput
from cairn.steps import registry
from cairn.web.answers import EVENT_DATA, Event, EventKind
from cairn.web.errors import HEADERS, WHY, ErrorBody
from cairn.web.models import SSE_EVENT

REF = "#/components/schemas/{model}"
ADMIN_403 = "A tenant's token: this operation is an admin's (forbidden)."


def example_workflow() -> str:
    """The workflow the request examples start: the first registered here whose input
    may be {}, so "Try it out" works on this server; a placeholder if it has none (the
    server's 422 then names the workflows it has)."""
    for name in registry.names():
        try:
            registry.get(name).validate({})
        except InvalidInput:
            continue
        return name
    return "my-workflow"


def request_examples(workflow: str) -> dict[tuple[str, str], dict[str, Any]]:
    """Each operation's request body example: every one a request the server takes
    (tests/fleet/test_openapi.py sends each), whatever workflows it has."""
    return {
        ("post", "/runs"): {"workflow": workflow, "input": {}},
        ("post", "/schedules"): {
            "name": "nightly",
            "workflow": workflow,
            "input": {},
            "cron": "0 3 * * *",
        },
        ("post", "/runs/replay"): {
            "workflow": workflow,
            "since": "2026-01-01T00:00:00Z",
            "dry_run": True,
        },
        ("post", "/runs/{run_id}/cancel"): {"reason": "not needed any more"},
        ("post", "/runs/{run_id}/fork"): {"at_seq": 1},
        ("post", "/runs/{run_id}/rewind"): {"to_seq": 1},
        ("post", "/runs/{run_id}/resolve"): {"done": True, "result": {"id": "ch_1"}},
        ("post", "/runs/{run_id}/signals/{event}"): {
            "payload": {"approved": True},
            "signal_id": "approval-1",
        },
        ("post", "/runs/{run_id}/steer"): {"message": "Also check the invoice date."},
        ("post", "/runs/{run_id}/budget"): {"usd": 5.0},
        ("put", "/tenants/{tenant}/budget"): {"usd": 50.0, "per": "day", "soft": 0.8},
        ("post", "/approvals/{approval_id}/decision"): {
            "decision": "approve",
            "note": "checked the invoice",
        },
    }


def document(
    app: FastAPI,
    *,
    open_paths: re.Pattern[str],
    no_store: frozenset[str],
    tenancy: Callable[[str, str], Decision],
) -> None:
    """Have app.openapi() return the complete document. open_paths: reachable without the
    token; no_store: paths that answer without the Client (no 503); tenancy(method, path):
    the operation's decision."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = complete(
                get_openapi(
                    title=app.title,
                    version=app.version,
                    summary=app.summary,
                    description=app.description,
                    routes=app.routes,
                ),
                open_paths=open_paths,
                no_store=no_store,
                tenancy=tenancy,
                # Built at the first request: the workflows are all registered by then.
                examples=request_examples(example_workflow()),
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override


def complete(
    schema: dict[str, Any],
    *,
    open_paths: re.Pattern[str],
    no_store: frozenset[str],
    tenancy: Callable[[str, str], Decision],
    examples: dict[tuple[str, str], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """FastAPI's document with the shared responses, the security scheme and the request
    examples added, and its own validation error model replaced by ErrorBody (what the
    handler answers)."""
    components = schema.setdefault("components", {})
    models = components.setdefault("schemas", {})

    def named(model: type[BaseModel]) -> None:
        body = model.model_json_schema(ref_template=REF, mode="serialization")
        models.update(body.pop("$defs", {}))
        models[model.__name__] = body

    named(ErrorBody)
    # The events' shapes, which no route's model names (the stream passes them on as it
    # holds them): for a client to parse an SSE event's data with.
    named(Event)
    for kind in EVENT_DATA:
        named(kind)
    models["EventKind"] = {
        "type": "string",
        "enum": list(get_args(EventKind)),
        "description": "cairn's own event kinds; a step's ctx.emit names others.",
    }
    models["ServerSentEvent"] = SSE_EVENT
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}

    def add(responses: dict[str, Any], code: int, *, replace: bool = False) -> None:
        given = responses.get(str(code))
        if given is None or (replace and "ErrorBody" not in str(given)):
            responses[str(code)] = {"description": WHY[code], "content": error}
            if code in HEADERS:
                responses[str(code)]["headers"] = HEADERS[code]

    components["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "`Authorization: Bearer $CAIRN_API_TOKEN` (the server's token).",
        }
    }
    schema["security"] = [{"bearer": []}]
    for path, operations in schema.get("paths", {}).items():
        for method, op in operations.items():
            responses = op.setdefault("responses", {})
            for param in op.get("parameters", []):
                _not_null(param)
            if open_paths.match(path):
                op["security"] = []
            else:
                # A route's own credential (the events' read token) is an alternative.
                op["security"] = [{"bearer": []}, *op.get("security", [])]
                add(responses, 401)
                if method != "get":
                    add(responses, 403)
            if "requestBody" in op:
                for code in (400, 411, 413):
                    add(responses, code)
                if (example := (examples or {}).get((method, path))) is not None:
                    op["requestBody"]["content"]["application/json"]["example"] = example
            if op.get("parameters") or "requestBody" in op:
                add(responses, 422, replace=True)
            if path not in no_store:
                add(responses, 503)
            decision = tenancy(method, path)
            op["x-cairn-tenancy"] = {"who": decision.who.value, "why": decision.why}
            if decision.who is Who.ADMIN:
                said = responses.get("403", {}).get("description")
                add(responses, 403)
                responses["403"] = {
                    **responses["403"],
                    "description": f"{said} Or {ADMIN_403[0].lower()}{ADMIN_403[1:]}"
                    if said
                    else ADMIN_403,
                }
    text = repr(schema["paths"])
    for unused in ("HTTPValidationError", "ValidationError"):
        if unused not in text:
            models.pop(unused, None)
    return schema


def _not_null(param: dict[str, Any]) -> None:
    """A parameter is absent or a string, never null: FastAPI's `anyOf: [T, null]` for an
    optional one has a fuzzer send "null"."""
    schema = param.get("schema", {})
    kinds = schema.get("anyOf")
    if kinds and {"type": "null"} in kinds and len(kinds) == 2:
        (kind,) = [k for k in kinds if k != {"type": "null"}]
        del schema["anyOf"]
        param["schema"] = {**kind, **schema}
