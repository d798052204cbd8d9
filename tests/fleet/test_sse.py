"""GET /runs/{id}/events on a real `cairn serve`: Server-Sent Events of a run the loop
drives beside it, resumed with Last-Event-ID without a gap or a duplicate; keep-alives on
an idle stream; who may read what."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import cairn.testing.demos.chat  # noqa: F401  (registers chat, as the worker and server do)
from cairn.client.client import Client
from cairn.client.events import read_token
from cairn.core.settings import Settings
from cairn.steps.model import ModelClient
from cairn.store.events import RedisEvents
from cairn.workers import loop
from cairn.workers.outbox import Outbox
from tests.helpers.runs import Server


def _events(resp: httpx.Response, stop: int | None = None) -> Iterator[dict[str, Any]]:
    """The SSE messages of a streamed response, parsed; keep-alive comments as {"comment"}."""
    message: dict[str, Any] = {}
    for line in resp.iter_lines():
        if line.startswith(":"):
            yield {"comment": line[1:].strip()}
        elif line.startswith("id: "):
            message["id"] = line[4:]
        elif line.startswith("event: "):
            message["event"] = line[7:]
        elif line.startswith("data: "):
            message["data"] = json.loads(line[6:])
        elif line == "" and message:
            yield message
            message = {}


@pytest.fixture
def driven(settings: Settings, store: Any, leases: Any) -> Iterator[Any]:
    """Runs driven in this process, as a worker would, with their events on."""
    model = ModelClient(base_url=settings.anthropic_base_url, give_up_after=10.0)
    outbox = Outbox(RedisEvents(leases.client), settings)
    deps = loop.Deps(settings=settings, store=store, leases=leases, model=model, events=outbox)
    threads: list[threading.Thread] = []

    def drive(prompt: str) -> str:
        run_id = f"sse-{uuid.uuid4().hex[:8]}"
        store.create_run(run_id, "chat", {"prompt": prompt, "max_tokens": 512})
        t = threading.Thread(target=loop.run, args=(run_id, deps))
        threads.append(t)
        t.start()
        return run_id

    yield drive
    for t in threads:
        t.join(30)
    model.close()


def test_a_reader_that_reconnects_with_last_event_id_misses_nothing_and_repeats_nothing(
    serve: Any, driven: Any
) -> None:
    server: Server = serve()
    words = " ".join(f"w{i}" for i in range(40))
    with server.http() as http:
        run_id = driven(f"REPLY: {words}\nTOKEN_MS: 15")
        first: list[dict[str, Any]] = []
        with http.stream("GET", f"/runs/{run_id}/events") as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            for m in _events(resp):
                if "id" in m:
                    first.append(m)
                if sum(1 for x in first if x["data"]["kind"] == "token") >= 10:
                    break  # the reader goes away mid-answer
        rest: list[dict[str, Any]] = []
        headers = {"Last-Event-ID": first[-1]["id"]}
        with http.stream("GET", f"/runs/{run_id}/events", headers=headers) as resp:
            for m in _events(resp):
                if "id" in m:
                    rest.append(m)
        assert rest[-1]["data"]["kind"] == "run_ended"
        with http.stream("GET", f"/runs/{run_id}/events") as resp:
            whole = [m for m in _events(resp) if "id" in m]
        # "0", which many SSE clients send to mean the start, is the start.
        with http.stream("GET", f"/runs/{run_id}/events", headers={"Last-Event-ID": "0"}) as resp:
            assert resp.status_code == 200
            again = [m for m in _events(resp) if "id" in m]
    assert [m["id"] for m in first + rest] == [m["id"] for m in whole]
    assert [m["id"] for m in again] == [m["id"] for m in whole]
    assert whole[0]["data"]["kind"] == "step_started"  # the stream is whole: no gap
    text = "".join(m["data"]["data"]["text"] for m in whole if m["data"]["kind"] == "token")
    assert text == words
    # A step's own kind comes unnamed (an EventSource's onmessage), cairn's by name.
    [answered] = [m for m in whole if m["data"]["kind"] == "answered"]
    assert "event" not in answered and whole[-1]["event"] == "run_ended"


def test_an_idle_stream_gets_keep_alives_and_who_may_read_it(
    serve: Any, settings: Settings, store: Any
) -> None:
    server: Server = serve(CAIRN_SSE_KEEPALIVE="0.3")
    store.create_run("idle-1", "chat", {"prompt": "no worker takes this"})
    with server.http() as http:
        started = time.monotonic()
        with http.stream("GET", "/runs/idle-1/events") as resp:
            assert resp.status_code == 200
            comments = []
            for m in _events(resp):
                comments.append(m)
                if len(comments) == 2:
                    break
        assert comments == [{"comment": "keep-alive"}] * 2
        assert time.monotonic() - started < 5
        missing = http.get("/runs/no-such-run/events")
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "unknown_run"
        bad = http.get("/runs/idle-1/events", headers={"Last-Event-ID": "yesterday"})
        assert bad.status_code == 422
    assert server.token is not None
    with server.http(token=None) as anonymous:
        assert anonymous.get("/runs/idle-1/events").status_code == 401
        own = read_token(server.token, "idle-1")
        with Client(settings=dataclasses.replace(settings, api_token=server.token)) as c:
            assert c.events_token("idle-1") == own  # what an app hands its user's browser
        assert anonymous.get(f"/runs/other/events?token={own}").status_code == 403
        assert anonymous.get(f"/runs/idle-1?token={own}").status_code == 401  # events only
        with anonymous.stream("GET", f"/runs/idle-1/events?token={own}") as resp:
            assert resp.status_code == 200
