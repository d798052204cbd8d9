"""The API's one error shape, {"error": {"type", "message"}}, whatever the status: its
model for the document, the status each error becomes, and the handlers that answer it.

The status is one a caller can act on: 4xx for what the request got wrong, 503 with
Retry-After when Postgres or the broker is away.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

import fastapi.routing
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match

from cairn.core.errors import (
    AlreadyDecided,
    ApprovalGone,
    CairnError,
    InvalidInput,
    RunEnded,
    RunIdConflict,
    RunNotStopped,
    Transient,
    UnknownApproval,
    UnknownBudget,
    UnknownRun,
    UnknownWorkflow,
)
from cairn.web.headers import HEADERS as HEADERS_OF_EVERY_ANSWER

# The first kind an error is decides its status; any other CairnError is a 400.
_ERROR_STATUS: list[tuple[type[CairnError], int]] = [
    (UnknownRun, 404),
    (UnknownApproval, 404),
    (UnknownBudget, 404),
    (AlreadyDecided, 409),
    (ApprovalGone, 409),
    (RunIdConflict, 409),
    (RunNotStopped, 409),
    (RunEnded, 409),
    (InvalidInput, 422),
    (UnknownWorkflow, 422),
    (Transient, 503),
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
# The headers an error of this status comes with, as the document declares them.
HEADERS: dict[int, dict[str, Any]] = {
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
            **({"headers": HEADERS[code]} if code in HEADERS else {}),
        }
        for code in codes
    }


def error(status: int, kind: str, message: str, **headers: str) -> JSONResponse:
    """An error answered in the API's shape."""
    return JSONResponse(
        {"error": {"type": kind, "message": message}}, status_code=status, headers=headers
    )


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


async def cairn_error(_: Request, exc: CairnError) -> JSONResponse:
    for kind, status in _ERROR_STATUS:
        if isinstance(exc, kind):
            headers = {"Retry-After": "5"} if status == 503 else {}
            return error(status, _snake(type(exc).__name__), str(exc), **headers)
    return error(400, _snake(type(exc).__name__), str(exc))


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    # Starlette's own: no route (404), or none for the method (405), in our shape.
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        # Starlette names only the first route's methods; a path has one per method.
        headers["Allow"] = ", ".join(allowed(request.app.router.routes, request.scope))
    kind = _snake(HTTPStatus(exc.status_code).phrase.replace(" ", ""))
    return error(exc.status_code, kind, str(exc.detail), **headers)


async def crashed(_: Request, exc: Exception) -> JSONResponse:
    # The traceback goes to the server's log (uvicorn logs it), not to the caller. Answered
    # outside every middleware (Starlette's last resort): the headers are put on here.
    answer = error(500, "internal", f"{type(exc).__name__}: see the server's log")
    answer.headers.update(HEADERS_OF_EVERY_ANSWER)
    return answer


async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
    problems = exc.errors()
    for p in problems:
        if p.get("type") == "json_invalid":
            why = p.get("ctx", {}).get("error", "")
            return error(400, "invalid_json", f"the body is not valid JSON: {why}")
    said = "; ".join(
        f"{'.'.join(str(part) for part in p['loc'] if part != 'body') or 'body'}: {p['msg']}"
        for p in problems
    )
    return error(422, "invalid_request", said)


def install(app: FastAPI) -> None:
    """Have app answer every error in the one shape."""
    app.exception_handler(CairnError)(cairn_error)
    app.exception_handler(HTTPException)(http_error)
    app.exception_handler(Exception)(crashed)
    app.exception_handler(RequestValidationError)(invalid)


# Newer FastAPI keeps an included router's routes behind one entry of the app's list;
# this sees through it (older ones copied the routes into the app's own list).
_each_route: Callable[[list[BaseRoute]], Iterable[Any]] = getattr(
    fastapi.routing, "iter_route_contexts", iter
)


def allowed(routes: list[BaseRoute], scope: Any) -> list[str]:
    """The methods of the path a 405 was for: those of the matching routes with the fewest
    parameters, so POST /runs/replay does not advertise GET /runs/{run_id}'s GET."""
    matching = [
        r
        for r in _each_route(routes)
        if getattr(r, "methods", None) and r.matches(scope)[0] != Match.NONE
    ]
    fewest = min((len(r.param_convertors) for r in matching), default=0)
    return sorted({m for r in matching if len(r.param_convertors) == fewest for m in r.methods})
