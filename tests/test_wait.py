"""Client.wait and AsyncClient: a run's result, woken by LISTEN/NOTIFY; the docs'
FastAPI app served by uvicorn next to a real worker, under 20 requests at once."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

import cairn
from cairn.client import AsyncClient, Client
from cairn.core.errors import UnknownRun, WaitTimedOut
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.store import PgStore
from cairn.testing import fleet
from tests import pages
from tests.conftest import PGBOUNCER_PORT, wait_for

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


def test_async_client_does_what_the_client_does(settings: Settings, start_worker) -> None:
    start_worker(concurrency=2)

    async def main() -> None:
        async with AsyncClient(settings=settings) as client:
            assert await client.problems() == []
            data = {"email": "a@x.test", "turns": 2}
            run_id = await client.enqueue("agent", data, run_id="async-1")
            assert await client.enqueue("agent", data, run_id="async-1") == run_id
            with pytest.raises(cairn.RunIdConflict):
                await client.enqueue("agent", {**data, "turns": 3}, run_id="async-1")
            run = await client.wait(run_id, timeout=30)
            assert run.status == RunStatus.DONE
            assert (await client.get(run_id, window=True)).window is not None  # type: ignore[union-attr]
            assert [r.run_id for r in await client.list(limit=5)] == [run_id]
            assert (await client.counts())[RunStatus.DONE] == 1
            assert [h.cursor for h in await client.history(run_id)] == ["work", "report"]
            assert await client.signal(run_id, "ping", {"x": 1}, signal_id="s1") is True
            assert await client.signal(run_id, "ping", {"x": 1}, signal_id="s1") is False
            with pytest.raises(UnknownRun):
                await client.signal("nope", "ping")
            assert (await client.cancel(run_id)).status == RunStatus.DONE  # type: ignore[union-attr]
            assert await client.get("nope") is None

    asyncio.run(main())


@pytest.mark.slow
def test_the_readme_fastapi_app_answers_20_requests_at_once(
    settings: Settings, worker_env: dict[str, str], start_worker, tmp_path: Path
) -> None:
    block = pages.starting("# app.py: start a run per request")
    (tmp_path / "app.py").write_text(block.code)
    start_worker(concurrency=4)
    port = fleet.free_port()
    server = fleet.Proc(
        [sys.executable, "-m", "uvicorn", "app:app", "--port", str(port)],
        {**worker_env, "PYTHONPATH": ""},
        tmp_path / "uvicorn.log",
        "uvicorn",
        tmp_path,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(url) or not server.alive(), 30, "uvicorn to start")
        assert server.alive(), server.text()

        async def post_all() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                return await asyncio.gather(
                    *(
                        http.post(
                            "/invoices", params={"customer": f"c{i}", "email": f"c{i}@x.test"}
                        )
                        for i in range(20)
                    )
                )

        started = time.monotonic()
        answers = asyncio.run(post_all())
        elapsed = time.monotonic() - started
    finally:
        server.kill()
    assert [a.status_code for a in answers] == [200] * 20, server.text()[-3000:]
    bodies = [a.json() for a in answers]
    assert {b["status"] for b in bodies} == {"done"}
    assert len({b["run_id"] for b in bodies}) == 20
    assert all(b["result"]["outcome"] == "sent" for b in bodies)
    assert elapsed < 30, f"20 requests took {elapsed:.1f}s"


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/docs", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_async_client_has_every_method_of_client_as_a_coroutine() -> None:
    import inspect

    public = {
        name for name, value in vars(Client).items() if not name.startswith("_") and callable(value)
    }
    assert public <= set(dir(AsyncClient)), public - set(dir(AsyncClient))
    for name in public:
        method = getattr(AsyncClient, name)
        # An iterator's async form is an async iterator (events).
        assert inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method), name
    for name in ("__aenter__", "__aexit__"):
        assert inspect.iscoroutinefunction(getattr(AsyncClient, name))
