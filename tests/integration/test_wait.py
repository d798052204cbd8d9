"""Client.wait and AsyncClient: a run's result, woken by LISTEN/NOTIFY; behind PgBouncer in
transaction mode by a look every 2 s, or by CAIRN_LISTEN_URL's notification. Many waits at
once: test_wait_many.py. Beside a real worker (and the docs' FastAPI app under 20 requests
at once): tests/fleet/test_wait.py."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest

from cairn.client import AsyncClient, Client
from cairn.core.errors import UnknownRun, WaitTimedOut
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.store import PgStore
from tests.helpers.services import PGBOUNCER_PORT

NOTIFIED = pytest.mark.skipif(
    bool(PGBOUNCER_PORT), reason="PgBouncer in transaction mode passes no notifications"
)


def _later(seconds: float, fn: object) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), fn()))  # type: ignore[operator]
    thread.start()
    return thread


@NOTIFIED
def test_wait_is_woken_by_the_status_change_not_by_polling(store: PgStore) -> None:
    store.create_run("w1", "probe", {})
    cp = store.claim("w1", 1)
    assert cp is not None
    thread = _later(0.5, lambda: store.mark_failed(cp, "boom"))
    started = time.monotonic()
    run = store.wait("w1", timeout=20, poll=30)  # one look every 30 s: only a NOTIFY is quick
    elapsed = time.monotonic() - started
    thread.join()
    assert run.status == RunStatus.FAILED and run.error == "boom"
    assert 0.4 < elapsed < 2.0


def test_wait_returns_at_once_for_a_settled_run_and_times_out_clearly(client: Client) -> None:
    store = client.store
    store.create_run("w2", "probe", {})
    cp = store.claim("w2", 1)
    assert cp is not None
    started = time.monotonic()
    with pytest.raises(WaitTimedOut, match="w2 is still pending") as info:
        client.wait("w2", timeout=0.5)
    assert isinstance(info.value, TimeoutError) and time.monotonic() - started < 1.5
    store.save(cp.evolve(seq=1, status=RunStatus.WAITING, cursor="next"), cp)
    assert client.wait("w2", timeout=5).status == RunStatus.WAITING  # parked: settled
    with pytest.raises(UnknownRun):
        client.wait("no-such-run", timeout=1)


def test_async_client_has_every_method_of_client_as_a_coroutine() -> None:
    import inspect

    public = {
        name for name, value in vars(Client).items() if not name.startswith("_") and callable(value)
    }
    assert public <= set(dir(AsyncClient)), public - set(dir(AsyncClient))
    for name in public - {"for_tenant"}:  # a view on the same pools: nothing to await
        method = getattr(AsyncClient, name)
        # An iterator's async form is an async iterator (events).
        assert inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method), name
    for name in ("__aenter__", "__aexit__"):
        assert inspect.iscoroutinefunction(getattr(AsyncClient, name))


def _bouncer(db_url: str) -> str:
    """db_url through scripts/services.sh's PgBouncer in transaction mode (on the Postgres
    port + 10000, which scripts/test starts), or a skip when none answers there."""
    parts = urlsplit(db_url)
    port = int(PGBOUNCER_PORT or (parts.port or 5432) + 10000)
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        pytest.skip(f"no PgBouncer on 127.0.0.1:{port}")
    return parts._replace(netloc=parts.netloc.rsplit(":", 1)[0] + f":{port}").geturl()


def test_behind_pgbouncer_waits_look_again_and_a_listen_url_wakes_them_at_once(
    settings: Settings, db_url: str, store: PgStore
) -> None:
    behind = dataclasses.replace(settings, database_url=_bouncer(db_url), database_prepare=False)
    # No notification through PgBouncer: the 2 s look; CAIRN_LISTEN_URL straight to
    # Postgres: the notification, well before the first look again (1 s at the soonest).
    for listen_url, within in ((None, 3.5), (db_url, 0.9)):
        run_id = f"behind-{within}"
        store.create_run(run_id, "probe", {})
        cp = store.claim(run_id, 1)
        assert cp is not None
        with Client(settings=dataclasses.replace(behind, listen_url=listen_url)) as client:
            thread = _later(0.3, lambda cp=cp: store.mark_failed(cp, "boom"))
            started = time.monotonic()
            run = client.wait(run_id, timeout=10)
            elapsed = time.monotonic() - started
            thread.join()
        assert run.status == RunStatus.FAILED
        assert elapsed < within, (listen_url, elapsed)
