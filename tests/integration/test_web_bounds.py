"""Bounded: what the API accepts reads back (#52). JSON of every shape near the depth
bound (MAX_DEPTH), through every route that stores a value a caller gives (a run's input,
a signal's payload, a steer message, a schedule's input, a decision's args, a fork's
patch), is accepted exactly when it is within the bound, and then reads back with 200 and
equal; refused, it is a 422 and nothing is stored. The Client and the AsyncClient refuse
the same before they write, at any depth, with InvalidInput and never a RecursionError."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import tests.helpers.flows  # noqa: F401  (registers probe, loop, refund)
from cairn.client.aio import AsyncClient
from cairn.client.client import Client
from cairn.core.errors import InvalidInput
from cairn.core.inputs import MAX_DEPTH
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.workers import loop

TOKEN = "token-of-the-bounds-test"
LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    # jsonb keeps a number's shortest digits: a float past 2**53 reads back as an integer
    # that is not quite it (a round trip of Postgres's, not of the bounds)
    | st.floats(-1e15, 1e15, allow_nan=False)
    | st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=6)
)
KEY = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=4)


@st.composite
def nested(draw: st.DrawFn, depth: int) -> Any:
    """A JSON value exactly depth levels deep (0: a leaf), of mixed objects and lists,
    with leaves and shallower branches beside the deepest path."""
    value = draw(LEAF)
    for level in range(depth):
        # Beside the deepest path: leaves, or (once it is a container) empty ones.
        extra = LEAF | st.just([]) | st.just({}) if level else LEAF
        beside = draw(st.lists(extra, max_size=2))
        if draw(st.booleans()):
            at = draw(st.integers(0, len(beside)))
            value = [*beside[:at], value, *beside[at:]]
        else:
            keys = draw(st.lists(KEY, min_size=len(beside) + 1, max_size=len(beside) + 1,
                                 unique=True))  # fmt: skip
            value = {keys[0]: value, **dict(zip(keys[1:], beside, strict=True))}
    return value


def depth_of(value: Any) -> int:
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d + 1)
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


NEAR = st.integers(MAX_DEPTH - 3, MAX_DEPTH + 3).flatmap(nested)
SHAPES = NEAR | st.integers(0, 8).flatmap(nested) | st.sampled_from([255, 256, 900]).flatmap(nested)


@pytest.fixture
def http(settings: Settings) -> Iterator[TestClient]:
    from cairn.web.api import create_app

    app = create_app(dataclasses.replace(settings, api_token=TOKEN))
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        yield client


def _stored(answer: Any, within: bool, what: str) -> bool:
    """Whether the API took the value, asserting it took it exactly when within."""
    assert answer.status_code < 500, (what, answer.text)
    if answer.status_code == 422:
        assert answer.json()["error"]["type"] == "invalid_input", (what, answer.text)
    took = answer.is_success
    assert took == within, (what, answer.status_code, answer.text[:200])
    return took


@hsettings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=SHAPES)
def test_every_value_the_api_accepted_reads_back_and_every_refused_one_stored_nothing(
    http: TestClient, sql: Callable[..., list[tuple[Any, ...]]], value: Any
) -> None:
    key = uuid.uuid4().hex[:12]
    depth = depth_of(value)
    # A run's input is the object around the value; a schedule's too.
    made = http.post("/runs", json={"workflow": "probe", "run_id": key, "input": {"v": value}})
    if _stored(made, depth + 1 <= MAX_DEPTH, "input"):
        assert http.get(f"/runs/{key}").json()["input"] == {"v": value}
        assert http.get(f"/ui/runs/{key}").status_code == 200
    else:
        assert http.get(f"/runs/{key}").status_code == 404
    target = f"t-{key}"
    assert http.post("/runs", json={"workflow": "probe", "run_id": target}).status_code == 202
    sent = http.post(f"/runs/{target}/signals/go", json={"payload": value})
    if _stored(sent, depth <= MAX_DEPTH, "payload"):
        [(payload,)] = sql("SELECT payload FROM signals WHERE run_id = %s", target)
        assert payload == value
    else:
        assert sql("SELECT count(*) FROM signals WHERE run_id = %s", target) == [(0,)]
    steered = http.post(f"/runs/{target}/steer", json={"message": value})
    took = _stored(steered, depth <= MAX_DEPTH, "message")
    kept = sql("SELECT count(*) FROM steer_messages WHERE run_id = %s", target)
    assert kept == [(1 if took else 0,)]
    assert http.get(f"/runs/{target}").status_code == 200
    schedule = {"name": f"s-{key}", "workflow": "probe", "input": {"v": value}, "every": 3600}
    if _stored(http.post("/schedules", json=schedule), depth + 1 <= MAX_DEPTH, "schedule"):
        [listed] = [
            s for s in http.get("/schedules").json()["schedules"] if s["name"] == f"s-{key}"
        ]
        assert listed["input"] == {"v": value}
    else:
        assert f"s-{key}" not in json.dumps(http.get("/schedules").json())
    assert http.get("/runs").status_code == 200 and http.get("/ui/runs").status_code == 200


@pytest.mark.parametrize("depth", [MAX_DEPTH, MAX_DEPTH + 1, 256, 900, 5_000])
def test_a_decisions_args_and_a_forks_patch_are_bounded_too(
    http: TestClient, client: Client, deps: loop.Deps, depth: int
) -> None:
    run_id = client.enqueue("refund", {"amount": 7}, run_id=f"refund-{depth}")
    assert loop.run(run_id, deps) == RunStatus.WAITING
    [asked] = http.get("/approvals").json()["approvals"]
    within = depth <= MAX_DEPTH
    inner = "[" * (depth - 1) + "1" + "]" * (depth - 1)  # with {"x": ...} around: depth deep
    url = f"/approvals/{asked['approval_id']}/decision"
    body = '{"decision": "edit", "args": {"x": %s}}' % inner  # noqa: UP031 (braces)
    if _stored(_post(http, url, body), within, "args"):
        decided = http.get(f"/approvals/{asked['approval_id']}").json()["decision"]
        assert decided["decision"] == "edit" and decided["payload"]["args"] == json.loads(
            '{"x": %s}' % inner  # noqa: UP031 (braces)
        )
    else:
        assert http.get(f"/approvals/{asked['approval_id']}").json()["decision"] is None
    done = client.enqueue("loop", {"visits": 2}, run_id=f"forked-{depth}")
    assert loop.run(done, deps) == RunStatus.DONE
    body = '{"at_seq": 1, "input_patch": {"visits": 2, "x": %s}}' % inner  # noqa: UP031
    forked = _post(http, f"/runs/{done}/fork", body)
    if _stored(forked, within, "patch"):
        assert http.get(f"/runs/{forked.json()['run_id']}").status_code == 200
    else:
        assert http.get(f"/runs/{done}/forks").json()["forks"] == []


def _post(http: TestClient, url: str, body: str) -> Any:
    """body as it is (json= would recurse into a value this deep)."""
    return http.post(url, content=body.encode(), headers={"content-type": "application/json"})


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):  # no recursion to build it either
        value = [value]
    return value


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1_000, 100_000])
def test_the_client_and_the_async_client_refuse_a_value_too_deep_before_writing(
    client: Client, settings: Settings, sql: Callable[..., list[tuple[Any, ...]]], depth: int
) -> None:
    deep = _deep(depth)
    target = client.enqueue("probe", {}, run_id="target")
    for what, call in {
        "enqueue": lambda: client.enqueue("probe", {"v": deep}, run_id="deep"),
        "signal": lambda: client.signal(target, "go", deep),
        "steer": lambda: client.steer(target, deep),
        "resolve": lambda: client.resolve(target, done=True, result=deep),
    }.items():
        with pytest.raises(InvalidInput, match=f"deeper than {MAX_DEPTH} levels"):
            call()
        assert client.get("deep") is None, what

    async def from_async() -> None:
        async with AsyncClient(settings=settings) as aio:
            with pytest.raises(InvalidInput, match="deeper than"):
                await aio.enqueue("probe", {"v": deep}, run_id="deep-async")
            with pytest.raises(InvalidInput, match="deeper than"):
                await aio.signal(target, "go", deep)

    asyncio.run(from_async())
    assert client.get("deep-async") is None
    assert sql("SELECT count(*) FROM signals") == [(0,)]
    assert sql("SELECT count(*) FROM steer_messages") == [(0,)]
