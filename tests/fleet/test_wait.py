"""AsyncClient beside a real worker, and the docs' FastAPI app served by uvicorn next to
one, under 20 requests at once.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import httpx
import pytest

import cairn
from cairn.client import AsyncClient
from cairn.core.errors import UnknownRun
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.testing import fleet
from tests.helpers import pages
from tests.helpers.runs import wait_for


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
