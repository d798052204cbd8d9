"""The README's and the docs' examples that need a fleet, run on real workers: every shell
block as written outside the repo, the chat example's stream, the pydantic-ai example
behind FastAPI.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cairn.client.client import Client
from cairn.testing import fleet
from cairn.testing.standins import MailServer
from tests.helpers import pages
from tests.helpers.runs import wait_for


def _uvicorn(app: str, env: dict[str, str], tmp_path: Path) -> tuple[fleet.Proc, str]:
    """`uvicorn app` from tmp_path, as the docs serve their examples, once it answers."""
    import httpx

    port = fleet.free_port()
    web = fleet.Proc(
        [str(pages.BIN / "uvicorn"), app, "--port", str(port)],
        env,
        tmp_path / "uvicorn.log",
        "uvicorn",
        tmp_path,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/docs", timeout=1).status_code == 200
        except httpx.HTTPError:
            return not web.alive()

    try:
        wait_for(up, 30, "uvicorn to start")
    except BaseException:
        web.kill()
        raise
    return web, url


@pytest.mark.parametrize("block", pages.shell_blocks(starting=True), ids=lambda b: b.id)
def test_every_shell_block_that_starts_a_process_runs_as_written_outside_the_repo(
    block: pages.Block, settings, mail: MailServer, tmp_path: Path
) -> None:
    """Each block under `bash -eu`, in a scratch folder, against this test's Postgres and
    Redis; a fleet it leaves running runs a run. Whatever a block leaves running is stopped
    with its session afterwards. The blocks that start nothing are tests/docs'."""
    env = pages.user_env(settings, CAIRN_MAIL_URL=mail.url)
    with pages.bash(block.code, tmp_path, env) as (proc, log):
        proc.wait(timeout=120)
        out = log.read_text()
        assert proc.returncode == 0, f"{block.id}:\n{block.code}\n{out}"
        if "cairn worker" in block.code:  # what it left running is a fleet: use it
            with Client(settings=settings) as client:
                run_id = client.enqueue("invoice", {"customer": "c", "email": "c@example.com"})
                wait_for(lambda: client.get(run_id).status == "done", 60, "the fleet's run")


def test_the_pydantic_ai_example_answers_from_a_worker_behind_fastapi(
    settings, mail: MailServer, model, tmp_path: Path
) -> None:
    """support.py on `cairn worker`, app.py on uvicorn, as the docs give them: a web
    request enqueues the agent, the worker runs it (the stand-in calls its tool), and the
    answer comes back with the email sent once under the tool call's key."""
    import httpx

    support = pages.starting("# support.py")
    (tmp_path / "support.py").write_text(support.code)
    (tmp_path / "app.py").write_text(pages.starting("# app.py: ask").code)
    # The model's key from the environment, as the page says (the stand-in ignores it).
    env = pages.user_env(settings, MAIL_API=mail.url, ANTHROPIC_API_KEY="local-stand-in")
    command = re.search(r"`(CAIRN_WORKFLOWS=support cairn worker)`", pages.text(support.page))
    assert command is not None, f"{support.page} no longer says how to start the agent's worker"
    argv = [str(pages.BIN / "cairn"), "worker", "--concurrency", "1"]
    worker = fleet.wait_ready(
        fleet.Proc(argv, {**env, "CAIRN_WORKFLOWS": "support"}, tmp_path / "w.log", "w", tmp_path)
    )
    try:
        web, url = _uvicorn("app:app", env, tmp_path)
    except BaseException:
        worker.kill()
        raise
    try:
        question = "TOOLS: email_customer\nWhere is my order?"
        resp = httpx.post(
            f"{url}/support", params={"question": question, "email": "ada@example.com"}, timeout=90
        )
    finally:
        web.kill()
        worker.kill()
    assert resp.status_code == 200, web.text()[-2000:] + worker.text()[-3000:]
    body = resp.json()
    assert body["status"] == "done" and body["answer"], body
    [sent] = mail.messages()
    assert sent["to"] == "ada@example.com"
    assert sent["idempotency_key"] == (
        f"cairn:{body['run_id']}:agent:0:support__function_toolset__<agent>"
        ".call_tool:email_customer:0"
    )
    assert model.stats()["requests"] == 2  # the tool call, then the answer


def test_the_chat_example_streams_a_runs_answer_to_its_own_client(
    settings, model, tmp_path: Path
) -> None:
    """chat.py on uvicorn, as the docs give it, next to a real worker: the answer comes
    to the app's own client token by token (several chunks, over time) and whole."""
    import time

    import httpx

    chat = pages.starting("# chat.py: stream")
    (tmp_path / "chat.py").write_text(chat.code)
    # The demo's chat workflow, on the worker the page starts (no worker loads it unasked).
    command = re.search(r"`CAIRN_WORKFLOWS=(\S+) cairn worker`", pages.text(chat.page))
    assert command is not None, f"{chat.page} no longer says how to start the chat's worker"
    env = pages.user_env(settings)
    argv = [str(pages.BIN / "cairn"), "worker", "--concurrency", "1"]
    worker = fleet.wait_ready(
        fleet.Proc(argv, {**env, "CAIRN_WORKFLOWS": command[1]}, tmp_path / "w.log", "w", tmp_path)
    )
    try:
        web, url = _uvicorn("chat:app", env, tmp_path)
    except BaseException:
        worker.kill()
        raise
    words = " ".join(f"word{i}" for i in range(30))
    chunks: list[tuple[float, str]] = []
    try:
        prompt = f"REPLY: {words}\nTOKEN_MS: 20"
        with httpx.stream("POST", f"{url}/chat", params={"prompt": prompt}, timeout=60) as resp:
            assert resp.status_code == 200
            for text in resp.iter_text():
                chunks.append((time.monotonic(), text))
    finally:
        web.kill()
        worker.kill()
    assert "".join(t for _, t in chunks) == words, web.text()[-2000:] + worker.text()[-3000:]
    assert len(chunks) >= 5  # token by token, not one body at the end
    assert chunks[-1][0] - chunks[0][0] > 0.2  # 30 deltas 20 ms apart arrive over time
