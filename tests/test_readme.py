"""The README and the docs pages as a user meets them: the settings table is the code's,
every Python and shell block runs as written from a folder outside the repo (or its page
says why not), and the examples that need a fleet run on real workers. The tutorial, run
as one session, is tests/test_docs.py's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cairn.client.client import Client
from cairn.core.settings import markdown_table
from cairn.testing import fleet
from cairn.testing.standins import MailServer
from tests import pages
from tests.conftest import wait_for

# The tutorial's blocks build on one another: tests/test_docs.py runs them in order.
WHOLE = {"docs/tutorial.md"}
PYTHON = [b for b in pages.ALL if b.lang == "python" and b.page not in WHOLE]
SHELL = [b for b in pages.ALL if b.lang == "bash"]
BIN = Path(sys.executable).parent


def test_the_settings_table_is_generated_from_settings() -> None:
    page = pages.text("docs/reference/settings.md")
    start = page.index("| variable | default | what it does |")
    end = page.index("\n\n", start)
    assert page[start:end] == markdown_table(), (
        "run `cairn settings --markdown` into docs/reference/settings.md"
    )


def _env(settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "ANTHROPIC_"))}
    env.update(
        CAIRN_DATABASE_URL=settings.database_url,
        CAIRN_REDIS_URL=settings.redis_url,
        ANTHROPIC_BASE_URL=settings.anthropic_base_url or "",
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONPATH="",
        **extra,
    )
    return env


def _uvicorn(app: str, env: dict[str, str], tmp_path: Path) -> tuple[fleet.Proc, str]:
    """`uvicorn app` from tmp_path, as the docs serve their examples, once it answers."""
    import httpx

    port = fleet.free_port()
    web = fleet.Proc(
        [str(BIN / "uvicorn"), app, "--port", str(port)],
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


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.id)
def test_every_python_block_runs_as_written_outside_the_repo(
    block: pages.Block, settings, tmp_path: Path
) -> None:
    script = tmp_path / "block.py"
    script.write_text(block.code)
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, f"{block.id}:\n{block.code}\n{out.stderr}"


def test_runs_json_pages_through_a_thousand_runs(settings, client, store) -> None:
    for i in range(1_050):
        store.create_run(f"page-{i:04d}", "invoice", {"i": i})
    env = _env(settings)
    seen: list[str] = []
    after: list[str] = []
    while True:
        out = subprocess.run(
            [str(BIN / "cairn"), "runs", "--json", "--limit", "400", *after],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        page = json.loads(out.stdout)
        assert set(page) == {"runs", "totals", "next_after"}
        assert page["totals"] == {"pending": 1_050}
        seen += [r["run_id"] for r in page["runs"]]
        if page["next_after"] is None:
            break
        after = ["--after", page["next_after"]]
    assert len(seen) == len(set(seen)) == 1_050  # every run once, none skipped
    first = page["runs"][0] if page["runs"] else None
    assert first is None or set(first) >= {"run_id", "status", "created_at", "updated_at"}


def test_version() -> None:
    out = subprocess.run(
        [str(BIN / "cairn"), "--version"], capture_output=True, text=True, check=True
    )
    assert re.fullmatch(r"cairn \d+\.\d+\.\d+\n", out.stdout)


def test_the_shell_blocks_that_are_not_run_say_why() -> None:
    skipped = [b for b in SHELL if b.skip]
    assert all(len(b.skip) > 40 for b in skipped), [b.id for b in skipped]
    for page in pages.PAGES:  # run a page's shell blocks in a test rather than skipping them
        assert len([b for b in skipped if b.page == page]) <= 2, page
    assert len(skipped) <= 6


# A block that starts workers, beat or a server belongs to the whole suite, not --fast.
STARTS = ("cairn worker", "cairn beat", "cairn serve", "cairn chaos", "cairn demo")


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(b, marks=[pytest.mark.fleet] if any(s in b.code for s in STARTS) else [])
        for b in SHELL
        if not b.skip and b.page not in WHOLE
    ],
    ids=lambda b: b.id,
)
def test_every_shell_block_runs_as_written_outside_the_repo(
    block: pages.Block, settings, mail: MailServer, tmp_path: Path
) -> None:
    """Each block under `bash -eu`, in a scratch folder, against this test's Postgres and
    Redis. Whatever a block leaves running is stopped with its session afterwards."""
    env = _env(settings, CAIRN_MAIL_URL=mail.url)
    with pages.bash(block.code, tmp_path, env) as (proc, log):
        proc.wait(timeout=120)
        out = log.read_text()
        assert proc.returncode == 0, f"{block.id}:\n{block.code}\n{out}"
        if "cairn worker" in block.code:  # what it left running is a fleet: use it
            with Client(settings=settings) as client:
                run_id = client.enqueue("invoice", {"customer": "c", "email": "c@example.com"})
                wait_for(lambda: client.get(run_id).status == "done", 60, "the fleet's run")


@pytest.mark.slow
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
    env = _env(settings, MAIL_API=mail.url, ANTHROPIC_API_KEY="local-stand-in")
    command = re.search(r"`(CAIRN_WORKFLOWS=support cairn worker)`", pages.text(support.page))
    assert command is not None, f"{support.page} no longer says how to start the agent's worker"
    argv = [str(BIN / "cairn"), "worker", "--concurrency", "1"]
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


@pytest.mark.fleet
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
    env = _env(settings)
    argv = [str(BIN / "cairn"), "worker", "--concurrency", "1"]
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
