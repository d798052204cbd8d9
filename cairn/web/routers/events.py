"""GET /runs/{run_id}/events: a run's events as Server-Sent Events, live, read through
the app's hub (one blocking XREAD for every open stream). The guard lets a run's own
read token (?token=) in here, for a browser's EventSource that cannot send a header."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Header, Query, Request, Response, Security
from fastapi.responses import StreamingResponse
from fastapi.sse import format_sse_event

from cairn.client.client import Client
from cairn.client.events import EVENT_ID, afollow_batches
from cairn.core.errors import InvalidInput, UnknownRun
from cairn.core.events import RESERVED, Event
from cairn.web.answers import EventsToken
from cairn.web.auth import READ_TOKEN
from cairn.web.deps import AuthDep, ClientDep, HubDep, SettingsDep
from cairn.web.errors import errors
from cairn.web.models import EVENT_ID_SCHEMA

router = APIRouter(tags=["runs"])


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
        return await asyncio.to_thread(self.client.store.history, run_id)

    async def calls(self, run_id: str, limit: int = 500) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.client.store.calls, run_id, limit)


@router.get(
    "/runs/{run_id}/events",
    response_class=StreamingResponse,  # not FastAPI's SSE class: it wants a generator
    # The guard checks it; declared for the document: a run's read token in place of
    # the API token (the run page's EventSource cannot send a header).
    dependencies=[Security(READ_TOKEN)],
    responses={
        200: {
            "description": "The run's events, as Server-Sent Events: each event's data "
            "is one JSON event (id, kind, data, cursor, visit, attempt, seq, ts, durable).",
            "content": {
                "text/event-stream": {"schema": {"$ref": "#/components/schemas/ServerSentEvent"}}
            },
        },
        **errors(403, 404, why={403: "A read token (?token=) that is not this run's (forbidden)."}),
    },
)
async def events(
    run_id: str,
    client: ClientDep,
    hub: HubDep,
    settings: SettingsDep,
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


@router.post("/runs/{run_id}/events/token", response_model=EventsToken, responses=errors(404))
def events_token(
    run_id: str, request: Request, client: ClientDep, settings: SettingsDep, auth: AuthDep
) -> dict[str, Any]:
    """A token that reads this run's events and nothing else (Client.events_token), and
    the URL to open with it: what a web app's back end hands its page, whose EventSource
    cannot send the API token (and must never see it)."""
    if client.get(run_id) is None:
        raise UnknownRun(f"no run {run_id!r}")
    token = ""
    if settings.api_token:
        # Asked with a `cairn tokens` token: bound to it, so its revocation ends this too.
        got = auth.read_token(run_id, request.scope.get("state", {}).get("token_id"))
        if got is None:  # revoked since the guard believed it
            raise UnknownRun(f"no run {run_id!r}")
        token = got
    path = f"/runs/{quote(run_id, safe='')}/events"
    return {"run_id": run_id, "token": token, "url": f"{path}?token={token}" if token else path}
