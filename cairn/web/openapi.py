"""The API's OpenAPI document, complete: every response a route can give, in one error
shape, and every rule a request must follow, so /openapi.json is the API's reference
(tests/test_openapi.py fuzzes `cairn serve` against it).

A route declares what is its own (its 404 and 409, its models); what every route shares
is added here, once, from the one place that causes it: the guard's 401/403/411/413,
request validation's 400/422, the Client's 503.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import AfterValidator, BaseModel, BeforeValidator, Field
from starlette.routing import Match

from cairn.core.errors import InvalidInput
from cairn.core.inputs import RUN_ID_MAX
from cairn.steps import registry

# A run id's characters (cairn.core.inputs.RUN_ID), anchored as JSON Schema wants. The
# server checks them itself, for an error that says the rule in words.
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+=/-]*$"
RUN_ID_SCHEMA: dict[str, Any] = {"pattern": RUN_ID_PATTERN, "maxLength": RUN_ID_MAX}
# An event id (cairn.workers.events.EVENT_ID): a stream entry's, one told from Postgres
# after it (~k, ~end), or 0 for the run's start (what many SSE clients send).
EVENT_ID_SCHEMA: dict[str, Any] = {
    "pattern": r"^(0|\d{1,20}-\d{1,20}(~(\d{1,9}|end))?)$",
    "examples": ["1733312345678-0", "1733312345678-0~2", "0"],
}
# A signal's event: what check_event refuses (NUL, cairn's own names), as a pattern.
EVENT_NAME_PATTERN = r"^(?!cairn\.)[^\x00]+$"
# One Server-Sent Event of GET /runs/{run_id}/events (OpenAPI 3.1: `schema` is one event).
SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "event": {
            "type": "string",
            "description": "cairn's own kinds by name (run_ended, gap, ...); a step's own "
            "events come unnamed, their kind in data.",
        },
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "description": "The event as JSON: id, kind, data, cursor, visit, attempt, seq, "
            "ts, durable.",
        },
        "id": {"type": "string", "description": "Resume after it: Last-Event-ID or ?after=."},
        "retry": {"type": "integer"},
    },
}

# The largest whole number every JSON parser reads exactly (a double's 53 bits): a bound
# for counts and seqs that a fuzzer's 2**63 + 1 cannot round past.
WHOLE_MAX = 2**53
# A string without NUL, which no Postgres text can hold.
NO_NUL = r"^[^\x00]*$"


def _whole(value: Any) -> Any:
    # JSON Schema's integer: 3 and 3.0 (strict int would refuse 3.0), never "3" nor true.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


WHOLE = BeforeValidator(_whole)  # after the int's own Field, for them to reach the schema
_ISO = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]")


def _iso(value: Any) -> Any:
    # pydantic would take 0.5 as a Unix time: a date-time is a string that looks like one.
    if isinstance(value, dt.datetime):
        return value
    if isinstance(value, str) and _ISO.match(value):
        return dt.datetime.fromisoformat(value)  # ValueError: pydantic's 422
    raise ValueError("a date-time is an RFC 3339 string, e.g. 2026-12-04T19:45:00Z")


def _utc(when: dt.datetime) -> dt.datetime:
    # A time sent without a zone is UTC: the server's zone is not the caller's.
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


Timestamp = Annotated[
    dt.datetime,
    BeforeValidator(_iso),
    AfterValidator(_utc),
    Field(description="RFC 3339, e.g. 2026-12-04T19:45:00Z (without an offset: UTC)."),
]


class ErrorDetail(BaseModel):
    """What went wrong: a kind to branch on and a sentence for a person."""

    type: str = Field(
        description="What kind of error, in snake_case: unknown_run, run_id_conflict, "
        "invalid_request, ...",
        examples=["unknown_run"],
    )
    message: str = Field(description="What went wrong, and what to do about it.")


class ErrorBody(BaseModel):
    """Every error the API answers, whatever its status."""

    error: ErrorDetail


# The default description of each status; a route may say more of its own.
WHY: dict[int, str] = {
    400: "The body is not JSON (invalid_json).",
    401: "No API token, or not this server's (unauthorized).",
    403: "A page session's write without `X-Cairn-Page: 1` (forbidden).",
    404: "No such run (unknown_run).",
    409: "The request conflicts with the run as it is now.",
    411: "A chunked body without Content-Length (length_required).",
    413: "The body is larger than CAIRN_MAX_INPUT_BYTES plus 64 KiB (body_too_large).",
    422: "The request breaks a rule of this document (invalid_request), or one of the "
    "server's own: an input its workflow refuses, or over CAIRN_MAX_INPUT_BYTES, or with "
    "NUL in a string (invalid_input); an unknown workflow (unknown_workflow).",
    503: "Postgres or the broker is away: retry after Retry-After seconds.",
}
_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    503: {
        "Retry-After": {
            "description": "Seconds to wait before retrying.",
            "required": True,
            "schema": {"type": "integer"},
        }
    },
}


def errors(*codes: int, why: dict[int, str] | None = None) -> dict[int | str, dict[str, Any]]:
    """A route's own error responses, for its `responses=`: each an ErrorBody."""
    return {
        code: {
            "model": ErrorBody,
            "description": (why or {}).get(code, WHY[code]),
            **({"headers": _HEADERS[code]} if code in _HEADERS else {}),
        }
        for code in codes
    }


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
    (tests/test_openapi.py sends each), whatever workflows it has."""
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
    }


def document(app: FastAPI, *, open_paths: re.Pattern[str], no_store: frozenset[str]) -> None:
    """Have app.openapi() return the complete document. open_paths: reachable without the
    token; no_store: paths that answer without the Client (no 503)."""

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
    examples: dict[tuple[str, str], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """FastAPI's document with the shared responses, the security scheme and the request
    examples added, and its own validation error model replaced by ErrorBody (what the
    handler answers)."""
    components = schema.setdefault("components", {})
    models = components.setdefault("schemas", {})
    body = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    models.update(body.pop("$defs", {}))
    models["ErrorBody"] = body
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}

    def add(responses: dict[str, Any], code: int, *, replace: bool = False) -> None:
        given = responses.get(str(code))
        if given is None or (replace and "ErrorBody" not in str(given)):
            responses[str(code)] = {"description": WHY[code], "content": error}
            if code in _HEADERS:
                responses[str(code)]["headers"] = _HEADERS[code]

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


def allowed(routes: list[Any], scope: Any) -> list[str]:
    """The methods of the path a 405 was for: those of the matching routes with the fewest
    parameters, so POST /runs/replay does not advertise GET /runs/{run_id}'s GET."""
    matching = [
        r for r in routes if getattr(r, "methods", None) and r.matches(scope)[0] != Match.NONE
    ]
    fewest = min((len(r.param_convertors) for r in matching), default=0)
    return sorted({m for r in matching if len(r.param_convertors) == fewest for m in r.methods})
