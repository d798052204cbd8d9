"""The HTTP API: runs started, read, cancelled and signalled over JSON, behind a bearer token.

Every route is a thin call into one shared cairn.Client (thread-safe: a connection pool
and Celery's producer pool), run in FastAPI's thread pool. Errors are one JSON shape,
{"error": {"type", "message"}}, with the status a caller can act on: 4xx for what the
request got wrong, 503 with Retry-After when Postgres or the broker is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import hmac
import logging
import re
import time
from collections.abc import AsyncIterator, Iterator
from http import HTTPStatus
from typing import Annotated, Any, Literal, cast

from fastapi import Body, FastAPI, Header, Path, Query, Request, Response, Security
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    StreamingResponse,
)
from fastapi.security import APIKeyQuery
from fastapi.sse import format_sse_event
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cairn import __version__
from cairn.client.client import Client
from cairn.client.events import EVENT_ID, afollow_batches, read_token
from cairn.core import logs, tracing
from cairn.core.errors import (
    CairnError,
    InvalidInput,
    RunIdConflict,
    RunNotStopped,
    Transient,
    UnknownRun,
    UnknownWorkflow,
)
from cairn.core.events import RESERVED, Event
from cairn.core.inputs import LIMIT_MAX, MAX_PRIORITY, MIN_PRIORITY, RUN_ID_MAX, check_run_id
from cairn.core.settings import Settings
from cairn.core.status import CANCEL_REASON, RunStatus
from cairn.steps import registry
from cairn.store.events import AsyncRedisEvents
from cairn.web.hub import Hub
from cairn.web.openapi import (
    EVENT_ID_SCHEMA,
    EVENT_NAME_PATTERN,
    NO_NUL,
    RUN_ID_SCHEMA,
    SSE_EVENT,
    WHOLE,
    WHOLE_MAX,
    Timestamp,
    allowed,
    document,
    errors,
)

log = logging.getLogger("cairn.web")

COOKIE = "cairn_session"
# Cookie-authenticated writes must carry this header: a cross-site form cannot set it.
PAGE_HEADER = "x-cairn-page"
# Reachable without the token: the probe, the login form and the pages' CSS and JS.
OPEN_PATHS = re.compile(r"^/(healthz|login|static/.*)$")
EVENTS_PATH = re.compile(r"^/runs/([^/]+)/events$")
# Answered without the Client, so never a 503 for Postgres or the broker being away.
NO_STORE = frozenset({"/metrics"})
READ_TOKEN = APIKeyQuery(
    name="token",
    scheme_name="readToken",
    description="A run's own read token (GET /runs/{run_id}/events only).",
    auto_error=False,
)
WHY_SEQ = (
    "The request breaks a rule of this document (invalid_request), or the run saved no "
    "step at that seq: pick one from GET /runs/{run_id}/steps (invalid_input)."
)
_ERROR_STATUS: list[tuple[type[CairnError], int]] = [
    (UnknownRun, 404),
    (RunIdConflict, 409),
    (RunNotStopped, 409),
    (InvalidInput, 422),
    (UnknownWorkflow, 422),
    (Transient, 503),
]


class NewRun(BaseModel):
    """A run to start: the workflow's name and its input (a JSON object)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    # The examples are the operation's (openapi.request_examples): one this server takes.
    workflow: str = Field(min_length=1, max_length=200, pattern=NO_NUL)
    input: dict[str, Any] = Field(default_factory=dict)
    run_id: str | None = Field(
        default=None,
        description="Your id for the run; the same id again is the same run. With an "
        "Idempotency-Key header too, the two must be equal.",
        json_schema_extra=RUN_ID_SCHEMA,
    )
    max_cost_usd: float | None = Field(default=None, ge=0, description="Model cost cap.")
    concurrency_key: str | None = Field(
        default=None,
        description="At most concurrency_limit runs of the workflow with this key at a time; "
        "the others wait as queued.",
        examples=["user:42"],
        json_schema_extra=RUN_ID_SCHEMA,
    )
    concurrency_limit: Annotated[int, Field(ge=1, le=LIMIT_MAX), WHOLE] | None = Field(
        default=None, description="Runs per key at a time (default: the workflow's, or 1)."
    )
    priority: Annotated[int, Field(ge=MIN_PRIORITY, le=MAX_PRIORITY), WHOLE] | None = Field(
        default=None, description="Higher starts first (default: the workflow's, or 0)."
    )


class Fork(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    at_seq: Annotated[int, Field(ge=1, le=WHOLE_MAX), WHOLE] = Field(
        description="The seq of the saved step to go on from."
    )
    new_run_id: str | None = Field(
        default=None, description="The new run's id [a new one].", json_schema_extra=RUN_ID_SCHEMA
    )
    input_patch: dict[str, Any] | None = Field(
        default=None, description="Merged into the run's input (top-level keys)."
    )


class Rewind(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    to_seq: Annotated[int, Field(ge=1, le=WHOLE_MAX), WHOLE] = Field(
        description="The seq of the saved step to go back to."
    )


class Replay(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    workflow: str = Field(
        min_length=1, max_length=200, pattern=NO_NUL, description="Whose stopped runs to replay."
    )
    since: Timestamp = Field(
        description="Runs that stopped at or after this time (RFC 3339; no offset: UTC)."
    )
    until: Timestamp | None = Field(
        default=None, description="And before this time [the replay's start]."
    )
    status: list[Literal["failed", "incompatible"]] = Field(
        default=["failed"], min_length=1, description="Which stopped runs."
    )
    limit: Annotated[int, Field(ge=1, le=WHOLE_MAX), WHOLE] | None = Field(
        default=None, description="At most this many [all]."
    )
    dry_run: bool = Field(default=False, description="Only list them: nothing written.")


class Cancel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    reason: str = Field(default=CANCEL_REASON, max_length=500, pattern=NO_NUL)


class Resolve(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    done: bool = Field(description="Whether the effect whose outcome was unknown happened.")
    result: Any = Field(default=None, description="With done: the effect's result.")


class NewSignal(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    payload: Any = None
    signal_id: str | None = Field(
        default=None,
        description="The same id twice is one signal.",
        json_schema_extra=RUN_ID_SCHEMA,
    )


class Health(BaseModel):
    ok: bool
    problems: list[str] = Field(description="What does not answer: Postgres, the broker.")


def error(status: int, kind: str, message: str, **headers: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"type": kind, "message": message}}, status_code=status, headers=headers
    )


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Auth:
    """The bearer token, or the page session derived from it (never the token itself)."""

    def __init__(self, token: str | None) -> None:
        self.token = token.encode() if token else None
        self.session = (
            hmac.new(self.token, b"cairn page session", hashlib.sha256).hexdigest().encode()
            if self.token
            else None
        )

    def check(self, request: Request) -> Literal["bearer", "cookie"] | None:
        """How the request proved itself, or None."""
        if self.token is None or self.session is None:
            return "bearer"
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token):
            return "bearer"
        cookie = request.cookies.get(COOKIE, "")
        if cookie and hmac.compare_digest(cookie.encode(), self.session):
            return "cookie"
        return None

    def reads(self, request: Request) -> bool | None:
        """For GET /runs/{id}/events with ?token=: whether it reads that run (None: no
        such token on the request)."""
        given = request.query_params.get("token")
        m = EVENTS_PATH.match(request.url.path)
        if given is None or m is None:
            return None
        if self.token is None:
            return False
        expected = read_token(self.token.decode(), m.group(1))
        return hmac.compare_digest(given.encode(), expected.encode())

    def login(self, given: str) -> str | None:
        """The session cookie's value for a correct token, else None."""
        if self.token is None or self.session is None:
            return ""
        return self.session.decode() if hmac.compare_digest(given.encode(), self.token) else None


class RunGauge:
    """cairn_runs{status}: read from Postgres at scrape time, so every server agrees."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily("cairn_runs", "Runs by status.", labels=["status"])
        try:
            counts = self.client.counts()
        except CairnError as exc:  # the scrape still answers, without this family
            log.warning("cairn_runs not collected: %s", exc, extra=logs.run(None, "metrics_failed"))
            return
        for status, n in sorted(counts.items()):
            gauge.add_metric([status], n)
        yield gauge


class Guard:
    """Auth, body limits and request metrics, as plain ASGI (a BaseHTTPMiddleware would
    cost a third of a small request)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        auth: Auth,
        max_body: int,
        settings: Settings,
        requests: Counter,
        latency: Histogram,
    ) -> None:
        self.app, self.auth, self.max_body, self.settings = app, auth, max_body, settings
        self.requests, self.latency = requests, latency

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            refused = self.refuse(Request(scope))
            await (refused or self.app)(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.requests.labels(scope["method"], route, str(status)).inc()
            self.latency.labels(route).observe(time.perf_counter() - started)

    def refuse(self, request: Request) -> Response | None:
        path = request.url.path
        if not OPEN_PATHS.match(path):
            how = self.auth.check(request)
            if how is None and (reads := self.auth.reads(request)) is not None:
                if not reads:
                    return error(403, "forbidden", "this token does not read this run's events")
                return None
            if how is None:
                if request.method == "GET" and (path == "/" or path.startswith("/ui")):
                    return RedirectResponse(f"/login?next={path}", status_code=303)
                return error(
                    401,
                    "unauthorized",
                    "send the API token as `Authorization: Bearer $CAIRN_API_TOKEN`",
                    **{"WWW-Authenticate": "Bearer"},
                )
            writes = request.method not in ("GET", "HEAD")
            if how == "cookie" and writes and request.headers.get(PAGE_HEADER) != "1":
                return error(403, "forbidden", f"a page's request must send {PAGE_HEADER}: 1")
        if request.method in ("POST", "PUT", "PATCH"):
            length = request.headers.get("content-length")
            if length is None and request.headers.get("transfer-encoding"):
                return error(411, "length_required", "send the body with a Content-Length")
            if length is not None and (not length.isdigit() or int(length) > self.max_body):
                return error(
                    413,
                    "body_too_large",
                    f"the body is {length} bytes; the most accepted is {self.max_body:,} "
                    f"(CAIRN_MAX_INPUT_BYTES={self.settings.max_input_bytes:,} plus the envelope)",
                )
        return None


def _sse(event: Event) -> bytes:
    if event.kind == "keepalive":
        return format_sse_event(comment="keep-alive")
    data = event.json()
    # cairn's own kinds by name; a step's own unnamed (an EventSource's onmessage gets
    # them, with the kind in the data): a browser cannot listen for names it does not know.
    named = event.kind if event.kind in RESERVED else None
    return format_sse_event(data_str=data, event=named, id=event.id)


class _Runs:
    """The Client's reads for afollow, off the event loop."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def get(self, run_id: str) -> Any:
        return await asyncio.to_thread(self.client.get, run_id)

    async def history(self, run_id: str) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.client.history, run_id)

    async def calls(self, run_id: str, limit: int = 500) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.client.calls, run_id, limit)


def jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def step_json(step: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = jsonable(step)
    out["seconds"] = round((step["ended_at"] - step["started_at"]).total_seconds(), 6)
    return out


def create_app(settings: Settings, *, insecure_no_auth: bool = False) -> FastAPI:
    """The API and the pages over one Client. Refuses to build without a token unless
    insecure_no_auth (a laptop) is asked for."""
    if not settings.api_token and not insecure_no_auth:
        raise InvalidInput(
            "CAIRN_API_TOKEN is not set: set it (e.g. `export CAIRN_API_TOKEN=$(openssl rand "
            "-hex 32)`) or pass --insecure-no-auth on a machine only you can reach"
        )
    registry.import_modules(settings.workflows)
    tracing.setup(settings, "cairn-web")  # CAIRN_TRACING: before the Client's, to name it
    # Postgres connections of this process: enough for the thread pool's busy requests.
    client = Client(settings=settings, pool_size=16)
    auth = Auth(settings.api_token)
    metrics = CollectorRegistry()
    requests = Counter(
        "cairn_http_requests_total",
        "HTTP requests by route and status.",
        ["method", "route", "status"],
        registry=metrics,
    )
    latency = Histogram(
        "cairn_http_request_seconds",
        "HTTP request latency by route.",
        ["route"],
        registry=metrics,
        buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
    )
    metrics.register(RunGauge(client))
    # A body larger than the largest input (plus room for the envelope) is refused unread.
    max_body = settings.max_input_bytes + 64 * 1024

    hub = Hub(AsyncRedisEvents(settings.redis_url))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        client.close()
        await hub.close()

    app = FastAPI(
        title="cairn",
        version=__version__,
        summary="Durable multi-step LLM agent runs: start, read, cancel and signal them.",
        lifespan=lifespan,
    )
    app.state.client = client
    app.state.auth = auth
    app.state.settings = settings

    app.add_middleware(
        Guard, auth=auth, max_body=max_body, settings=settings, requests=requests, latency=latency
    )

    @app.exception_handler(CairnError)
    async def cairn_error(_: Request, exc: CairnError) -> JSONResponse:
        for kind, status in _ERROR_STATUS:
            if isinstance(exc, kind):
                headers = {"Retry-After": "5"} if status == 503 else {}
                return error(status, _snake(type(exc).__name__), str(exc), **headers)
        return error(400, _snake(type(exc).__name__), str(exc))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # Starlette's own: no route (404), or none for the method (405), in our shape.
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names only the first route's methods; a path has one per method.
            headers["Allow"] = ", ".join(allowed(app.router.routes, request.scope))
        kind = _snake(HTTPStatus(exc.status_code).phrase.replace(" ", ""))
        return error(exc.status_code, kind, str(exc.detail), **headers)

    @app.exception_handler(Exception)
    async def crashed(_: Request, exc: Exception) -> JSONResponse:
        # The traceback goes to the server's log (uvicorn logs it), not to the caller.
        return error(500, "internal", f"{type(exc).__name__}: see the server's log")

    @app.exception_handler(RequestValidationError)
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

    def _run(run_id: str) -> dict[str, Any]:
        run = client.get(run_id)
        if run is None:
            raise UnknownRun(f"no run {run_id!r}")
        return run.to_json()

    @app.post(
        "/runs",
        status_code=202,
        tags=["runs"],
        responses=errors(
            409,
            422,
            why={
                409: "A run with this id exists with another workflow or input (run_id_conflict).",
                422: "The request breaks a rule of this document (invalid_request), or one "
                "the server checks: run_id and Idempotency-Key both sent and not equal, an "
                "input its workflow refuses, over CAIRN_MAX_INPUT_BYTES or with NUL in a "
                "string (invalid_input); a workflow not registered (unknown_workflow).",
            },
        ),
    )
    def start_run(
        request: Request,
        new: Annotated[NewRun, Body()],
        idempotency_key: Annotated[
            str | None,
            Header(
                description="The run id, as a header: a retried POST returns the same run. "
                "With run_id in the body too, the two must be equal (else 422).",
                json_schema_extra=RUN_ID_SCHEMA,
            ),
        ] = None,
    ) -> dict[str, Any]:
        """Start a run. Retrying with the same Idempotency-Key (or run_id) and body returns
        the same run; the same key with another body is 409. Send the id as run_id or as
        Idempotency-Key, or both equal: two different ids are 422."""
        run_id = new.run_id
        if idempotency_key is not None:
            key = check_run_id(idempotency_key)
            if run_id is not None and run_id != key:
                raise InvalidInput("run_id and Idempotency-Key differ: send one, or the same")
            run_id = key
        registry.get(new.workflow)  # UnknownWorkflow (422) names the ones it knows
        with tracing.continuing(request.headers):  # a caller's traceparent: the run joins it
            run_id = client.enqueue(
                new.workflow, new.input, run_id=run_id, max_cost_usd=new.max_cost_usd,
                concurrency_key=new.concurrency_key, concurrency_limit=new.concurrency_limit,
                priority=new.priority,
            )  # fmt: skip
        return _run(run_id)

    @app.get("/runs", tags=["runs"])
    def list_runs(
        status: RunStatus | None = None,
        workflow: Annotated[str | None, Query(max_length=200, pattern=NO_NUL)] = None,
        cursor: Annotated[
            str | None,
            Query(max_length=200, pattern=NO_NUL, description="next_cursor of the previous page"),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        since: Annotated[Timestamp | None, Query()] = None,
        until: Annotated[Timestamp | None, Query()] = None,
    ) -> dict[str, Any]:
        """Runs, newest first, a page at a time (keyset: pass next_cursor as cursor)."""
        runs = client.list(status, limit, workflow=workflow, after=cursor, since=since, until=until)
        return {
            "runs": [r.to_json() for r in runs],
            "next_cursor": runs[-1].run_id if len(runs) == limit else None,
        }

    @app.get("/counts", tags=["runs"])
    def counts() -> dict[str, int]:
        """How many runs are in each status."""
        return cast("dict[str, int]", client.counts())  # a RunStatus is a str

    @app.get("/runs/{run_id}", tags=["runs"], responses=errors(404))
    def get_run(run_id: str) -> dict[str, Any]:
        """One run: status, cursor, input, state (its result once done), error, cost."""
        return _run(run_id)

    @app.get("/runs/{run_id}/children", tags=["runs"], responses=errors(404))
    def children(run_id: str) -> dict[str, Any]:
        """The run's child runs (StepResult.spawn), each spawn's in the order its step
        listed them: status, state (the result once done), error."""
        found = client.children(run_id)
        if not found and client.get(run_id) is None:
            raise UnknownRun(f"no run {run_id!r}")
        return {"run_id": run_id, "children": [r.to_json() for r in found]}

    @app.get("/runs/{run_id}/steps", tags=["runs"], responses=errors(404))
    def steps(run_id: str) -> dict[str, Any]:
        """The run's step timeline, oldest first: one row per step attempt that ended."""
        history = client.history(run_id)
        if not history and client.get(run_id) is None:
            raise UnknownRun(f"no run {run_id!r}")
        return {"run_id": run_id, "steps": [step_json(s) for s in history]}

    @app.get("/runs/{run_id}/calls", tags=["runs"], responses=errors(404))
    def calls(run_id: str) -> dict[str, Any]:
        """The run's journaled calls, oldest first: each model request and tool call a
        step made (a pydantic-ai agent's too), with its result or error and its cost."""
        found = client.calls(run_id)
        if not found and client.get(run_id) is None:
            raise UnknownRun(f"no run {run_id!r}")
        return {"run_id": run_id, "calls": jsonable_encoder(found)}

    @app.get(
        "/runs/{run_id}/events",
        tags=["runs"],
        response_class=StreamingResponse,  # not FastAPI's SSE class: it wants a generator
        # The guard checks it; declared for the document: a run's read token in place of
        # the API token (the run page's EventSource cannot send a header).
        dependencies=[Security(READ_TOKEN)],
        responses={
            200: {
                "description": "The run's events, as Server-Sent Events: each event's data "
                "is one JSON event (id, kind, data, cursor, visit, attempt, seq, ts, durable).",
                "content": {"text/event-stream": {"schema": SSE_EVENT}},
            },
            **errors(
                403, 404, why={403: "A read token (?token=) that is not this run's (forbidden)."}
            ),
        },
    )
    async def events(
        run_id: str,
        after: Annotated[
            str | None,
            Query(description="the last event id seen", json_schema_extra=EVENT_ID_SCHEMA),
        ] = None,
        last_event_id: Annotated[
            str | None,
            Header(description="the last event id seen", json_schema_extra=EVENT_ID_SCHEMA),
        ] = None,
    ) -> Response:
        """The run's events as Server-Sent Events, live, until it ends (`run_ended` is
        the last). Resume with the `Last-Event-ID` header (browsers send it on their own)
        or `?after=`: no gap, no duplicate while the stream keeps the events. An idle
        stream gets a keep-alive comment every CAIRN_SSE_KEEPALIVE seconds."""
        for given in (last_event_id, after):
            if given is not None and not EVENT_ID.fullmatch(given):
                raise InvalidInput(
                    f"event id {given!r}: ids look like 1733312345678-0 (0: from the start)"
                )
        position = last_event_id if last_event_id is not None else after
        stream = afollow_batches(
            _Runs(client),
            hub.log,
            run_id,
            position,
            idle=settings.sse_keepalive,
            live=hub.subscribe,
            parse=False,
        )
        try:
            first = await anext(stream)  # an unknown run is a 404, not an empty stream
        except StopAsyncIteration:
            first = []

        async def body() -> AsyncIterator[bytes]:
            # A client that goes away cancels this (Starlette listens for the disconnect).
            # One write a read: a reader that fell behind catches up in few, large ones.
            try:
                if first:
                    yield b"".join(_sse(e) for e in first)
                async for batch in stream:
                    yield b"".join(_sse(e) for e in batch)
            finally:
                await stream.aclose()

        return StreamingResponse(
            body(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    @app.post("/runs/{run_id}/cancel", status_code=202, tags=["runs"], responses=errors(404))
    def cancel(run_id: str, body: Annotated[Cancel | None, Body()] = None) -> dict[str, Any]:
        """Stop a run: a pending one at once, a running one at its next step boundary."""
        run = client.cancel(run_id, (body or Cancel()).reason)
        if run is None:
            raise UnknownRun(f"no run {run_id!r}")
        return run.to_json()

    @app.post(
        "/runs/{run_id}/fork",
        status_code=202,
        tags=["runs"],
        responses=errors(
            404,
            409,
            422,
            why={
                409: "new_run_id names a run that exists (run_id_conflict).",
                422: WHY_SEQ + " Or input_patch is over CAIRN_MAX_INPUT_BYTES or has NUL in a "
                "string (invalid_input).",
            },
        ),
    )
    def fork(run_id: str, body: Fork, request: Request) -> dict[str, Any]:
        """Start a new run from the step run_id saved at at_seq (run_id is not touched)."""
        with tracing.continuing(request.headers):
            new = client.fork(
                run_id, at_seq=body.at_seq, new_run_id=body.new_run_id,
                input_patch=body.input_patch,
            )  # fmt: skip
        return _run(new)

    @app.post(
        "/runs/{run_id}/rewind",
        status_code=202,
        tags=["runs"],
        responses=errors(
            404,
            409,
            422,
            why={409: "The run is not stopped: cancel it first (run_not_stopped).", 422: WHY_SEQ},
        ),
    )
    def rewind(run_id: str, body: Rewind) -> dict[str, Any]:
        """Move a stopped run back to the step it saved at to_seq, in place (409 for a run
        that is not stopped)."""
        return client.rewind(run_id, to_seq=body.to_seq).to_json()

    @app.get("/runs/{run_id}/forks", tags=["runs"], responses=errors(404))
    def forks(run_id: str) -> dict[str, Any]:
        """The runs forked from this one, oldest first."""
        found = client.forks(run_id)
        if not found and client.get(run_id) is None:
            raise UnknownRun(f"no run {run_id!r}")
        return {"run_id": run_id, "forks": [r.to_json() for r in found]}

    @app.post(
        "/runs/replay",
        status_code=202,
        tags=["runs"],
        responses=errors(
            422, why={422: "The request breaks a rule of this document (invalid_request)."}
        ),
    )
    def replay(body: Replay) -> dict[str, Any]:
        """Replay the workflow's runs that failed in [since, until): each goes on from its
        last saved step, its effects under the same idempotency keys; dry_run lists them."""
        runs = client.replay(
            body.workflow, since=body.since, until=body.until,
            status=tuple(body.status), limit=body.limit, dry_run=body.dry_run,
        )  # fmt: skip
        return {
            "workflow": body.workflow,
            "dry_run": body.dry_run,
            "replayed": 0 if body.dry_run else len(runs),
            "runs": [r.to_json() for r in runs],
        }

    @app.post("/runs/{run_id}/resolve", status_code=202, tags=["runs"], responses=errors(404))
    def resolve(run_id: str, body: Resolve) -> dict[str, Any]:
        """Settle a run stopped as unknown: whether its at-most-once effect happened. The
        run goes on at its cursor."""
        return client.resolve(run_id, done=body.done, result=body.result).to_json()

    @app.post(
        "/runs/{run_id}/signals/{event}",
        status_code=202,
        tags=["runs"],
        responses=errors(
            404,
            422,
            why={
                422: "The request breaks a rule of this document (invalid_request), or its "
                "payload is over CAIRN_MAX_INPUT_BYTES or has NUL in a string (invalid_input)."
            },
        ),
    )
    def signal(
        run_id: str,
        event: Annotated[
            str,
            Path(
                description="What the run waits for; names starting with `cairn.` are cairn's.",
                json_schema_extra={"pattern": EVENT_NAME_PATTERN, "maxLength": RUN_ID_MAX},
            ),
        ],
        body: Annotated[NewSignal | None, Body()] = None,
        idempotency_key: Annotated[
            str | None,
            Header(
                description="The signal id, if the body has none.",
                json_schema_extra=RUN_ID_SCHEMA,
            ),
        ] = None,
    ) -> dict[str, Any]:
        """Send the run a signal; a run waiting for it wakes. The same signal_id twice is
        one signal (stored: false the second time)."""
        body = body or NewSignal()
        if idempotency_key is not None:
            check_run_id(idempotency_key)  # checked even when the body's signal_id wins
        signal_id = body.signal_id if body.signal_id is not None else idempotency_key
        stored = client.signal(run_id, event, body.payload, signal_id=signal_id)
        return {"stored": stored, "run": _run(run_id)}

    @app.get(
        "/healthz",
        tags=["operations"],
        response_model=Health,
        responses={503: {"model": Health, "description": "Postgres or the broker is away."}},
    )
    def healthz() -> JSONResponse:
        """200 when Postgres and the broker answer, else 503 naming what does not."""
        problems = client.problems()
        return JSONResponse({"ok": not problems, "problems": problems}, 503 if problems else 200)

    @app.get("/metrics", tags=["operations"], response_class=PlainTextResponse)
    def prometheus() -> Response:
        """The server's metrics in Prometheus' text format."""
        return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    from cairn.web import pages, schedules

    pages.mount(app)
    schedules.mount(app)
    document(app, open_paths=OPEN_PATHS, no_store=NO_STORE)
    return app
