"""Debounced enqueues on Postgres, the loop in process: a burst of enqueues of one key is one
run, started by the wake pass after the quiet period with the latest input, as a fresh run
(no resume); in the caller's transaction too; bad options are one line everywhere. Two
enqueuing processes and beat SIGKILLed: tests/fleet/test_debounce.py."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from cairn.client.aio import AsyncClient
from cairn.client.client import Client
from cairn.core.errors import InvalidInput
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.store import PgStore
from cairn.workers import loop
from cairn.workers.wake import Waker


def _enqueue(client: Client, seconds: float, n: int, **options: float) -> str:
    return client.enqueue("sleeper", {"seconds": seconds, "n": n}, debounce_key="conv-1", **options)


def test_a_burst_is_one_run_that_starts_after_the_quiet_period_with_the_latest_input(
    client: Client, store: PgStore, deps: loop.Deps
) -> None:
    sent: list[str] = []
    waker = Waker(store=store, send=sent.append)
    run_id = _enqueue(client, 60, 1, debounce=0.6)
    for n in (2, 3):
        time.sleep(0.2)
        assert _enqueue(client, 0.3, n, debounce=0.6) == run_id
        assert waker.wake() == []  # never within the quiet period
    run = client.get(run_id)
    assert run is not None and run.status == RunStatus.WAITING and run.wakes_at is not None
    assert loop.run(run_id, deps) == RunStatus.WAITING  # a stray message starts nothing
    time.sleep(0.7)
    assert waker.wake() == [run_id] and sent == [run_id]
    # Started: the key's next enqueue is another run, and this one runs as a fresh run
    # with the last input (its own sleep then parks it again, past seq 0).
    other = _enqueue(client, 0.1, 4, debounce=30)
    assert other != run_id
    assert loop.run(run_id, deps) == RunStatus.WAITING
    got = client.get(run_id)
    assert got is not None and got.input == {"seconds": 0.3, "n": 3}
    assert (got.cursor, got.resumes) == ("after", 0)
    assert _enqueue(client, 0.1, 5, debounce=30) == other
    time.sleep(0.4)
    assert waker.wake() == [run_id]
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert [(h.cursor, h.outcome) for h in client.history(run_id)] == [
        ("nap", "saved"),
        ("after", "saved"),
    ]
    assert client.get(other).input == {"seconds": 0.1, "n": 5}  # type: ignore[union-attr]


def test_max_wait_bounds_how_long_a_stream_of_enqueues_puts_the_start_off(
    client: Client, store: PgStore
) -> None:
    waker = Waker(store=store, send=lambda run_id: None)
    started = time.monotonic()
    run_id = _enqueue(client, 1, 0, debounce=0.5, max_wait=1.2)
    woken: list[str] = []
    n = 0
    while not woken:
        n += 1
        assert _enqueue(client, 1, n, debounce=0.5, max_wait=1.2) in (run_id, *woken)
        woken = waker.wake()
        time.sleep(0.1)
        assert time.monotonic() - started < 3
    assert woken == [run_id]
    assert 1.2 <= time.monotonic() - started


def test_a_debounce_in_the_callers_transaction_commits_or_rolls_back_with_it(
    client: Client, store: PgStore, settings: Settings
) -> None:
    with psycopg.connect(settings.database_url) as conn:
        conn.execute("SELECT 1")  # the caller's transaction, open (its own rows' writes)
        run_id = _enqueue_in(client, conn, 1)
        conn.rollback()
        assert client.get(run_id) is None
        conn.execute("SELECT 1")
        run_id = _enqueue_in(client, conn, 2)
        assert _enqueue_in(client, conn, 3) == run_id
        conn.commit()
    run = client.get(run_id)
    assert run is not None and run.status == RunStatus.WAITING and run.input == {"n": 3}

    async def main() -> str:
        async with (
            AsyncClient(settings=settings) as aclient,
            await psycopg.AsyncConnection.connect(settings.database_url) as aconn,
        ):
            got = await aclient.enqueue(
                "sleeper", {"n": 4}, debounce_key="tx", debounce=30, connection=aconn
            )
            await aconn.commit()
            again = await aclient.enqueue("sleeper", {"n": 5}, debounce_key="tx", debounce=30)
            assert again == got
            return got

    assert asyncio.run(main()) == run_id
    assert client.get(run_id).input == {"n": 5}  # type: ignore[union-attr]


def _enqueue_in(client: Client, conn: psycopg.Connection, n: int) -> str:
    return client.enqueue("sleeper", {"n": n}, debounce_key="tx", debounce=30, connection=conn)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"debounce_key": "k", "debounce": 0}, "debounce must be a number of seconds above 0"),
        ({"debounce_key": "k", "debounce": -1.0}, "above 0"),
        ({"debounce_key": "k", "debounce": float("nan")}, "above 0"),
        ({"debounce_key": "k", "debounce": "2"}, "above 0"),
        ({"debounce_key": "k", "debounce": 5, "max_wait": 1}, "at least debounce (5)"),
        ({"debounce": 5}, "needs a debounce_key"),
        ({"debounce_key": "k"}, "above 0"),
        ({"debounce_key": "a b", "debounce": 5}, "debounce key 'a b' is not valid"),
        ({"debounce_key": "k", "debounce": 5, "run_id": "r"}, "takes no run_id"),
        ({"debounce_key": "k", "debounce": 5, "concurrency_key": "c"}, "concurrency_key"),
    ],
)
def test_bad_debounce_options_are_one_line_and_write_nothing(
    client: Client, options: dict[str, object], words: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        client.enqueue("sleeper", {}, **options)  # type: ignore[arg-type]
    assert words in str(caught.value) and "\n" not in str(caught.value)
    assert client.list() == []


def test_the_http_api_debounces_and_answers_422_for_bad_options(settings: Settings) -> None:
    from fastapi.testclient import TestClient

    import tests.helpers.flows  # noqa: F401  (registers sleeper)
    from cairn.web.api import create_app

    body = {"workflow": "sleeper", "debounce_key": "k", "debounce": 30}
    with TestClient(create_app(settings, insecure_no_auth=True)) as http:
        first = http.post("/runs", json={**body, "input": {"n": 1}})
        again = http.post("/runs", json={**body, "input": {"n": 2}})
        assert first.status_code == again.status_code == 202, first.text
        assert again.json()["run_id"] == first.json()["run_id"]
        assert again.json()["status"] == "waiting" and again.json()["input"] == {"n": 2}
        for bad in ({"debounce": 0}, {"max_wait": 1, "debounce": 5}, {"debounce_key": None}):
            answer = http.post("/runs", json={**body, **bad})
            assert answer.status_code == 422, (bad, answer.text)
        with_id = http.post("/runs", json=body, headers={"Idempotency-Key": "r-1"})
        assert with_id.status_code == 422 and "takes no run_id" in with_id.text
