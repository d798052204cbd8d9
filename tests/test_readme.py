"""The README as a user meets it: its settings table is the code's, its Python blocks run
as written from a folder outside the repo, and its workflow example runs on a real worker
with its own migration and ctx.db table."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cairn.testing import fleet
from cairn.testing.standins import MailServer
from cairn.workers.client import Client
from cairn.workers.settings import markdown_table
from tests.conftest import ROOT, wait_for

README = (ROOT / "README.md").read_text()
PYTHON = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
BASH = re.findall(r"```bash\n(.*?)```", README, re.DOTALL)
# Shell blocks with what comes just before them: a block is run by the tests unless an
# HTML comment right above it says why not.
SHELL = re.findall(r"(<!-- not run by the tests: [^>]*-->\n)?```bash\n(.*?)```", README, re.DOTALL)
BIN = Path(sys.executable).parent


def test_the_settings_table_is_generated_from_settings() -> None:
    start = README.index("| variable | default | what it does |")
    end = README.index("\n\n", start)
    assert README[start:end] == markdown_table(), "run `cairn settings --markdown` into the README"


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
    """`uvicorn app` from tmp_path, as the README serves its examples, once it answers."""
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


@pytest.mark.parametrize("index", range(1, len(PYTHON)))
def test_every_python_block_runs_as_written_outside_the_repo(
    index: int, settings, tmp_path: Path
) -> None:
    script = tmp_path / f"block{index}.py"
    script.write_text(PYTHON[index])
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, f"README python block {index}:\n{PYTHON[index]}\n{out.stderr}"


@pytest.mark.slow
def test_the_workflow_example_runs_with_its_own_table_on_a_real_worker(
    settings, mail: MailServer, tmp_path: Path
) -> None:
    assert PYTHON[0].startswith("# mypkg/flows.py")
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "flows.py").write_text(PYTHON[0])
    env = _env(settings, CAIRN_MAIL_URL=mail.url)
    migrate = next(b for b in BASH if "--migrations" in b)
    done = subprocess.run(
        ["bash", "-euc", migrate],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and "applied your migrations: [1]" in done.stdout, done.stderr
    # The command as the README gives it, from the folder that holds mypkg.
    command = re.search(r"`(CAIRN_WORKFLOWS=mypkg\.flows cairn worker)`", README)
    assert command is not None, "the README no longer says how to start the workers"
    variable, _, args = command.group(1).partition(" ")
    key, _, value = variable.partition("=")
    argv = [str(BIN / "cairn"), *args.split()[1:], "--concurrency", "1"]
    worker = fleet.wait_ready(
        fleet.Proc(argv, {**env, key: value}, tmp_path / "w.log", "readme", tmp_path)
    )
    try:
        with Client(settings=settings) as client:
            run_id = client.enqueue("onboard", {"email": "ada@example.com"})
            wait_for(lambda: client.get(run_id).status in ("done", "failed"), 30, "onboard")
            run = client.get(run_id)
            assert run.status == "done", run.error
        rows = subprocess.run(
            [str(BIN / "cairn"), "show", run_id, "--json"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        shown = json.loads(rows.stdout)
        assert [s["cursor"] for s in shown["steps"]] == ["plan", "welcome", "record"]
        assert mail.stats()["deliveries"] == 1
    finally:
        worker.kill()


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
    skipped = [reason for reason, _ in SHELL if reason]
    assert len(skipped) <= 3, "run README shell blocks in a test rather than skipping them"
    assert all(len(reason) > 40 for reason in skipped)


RUN_SHELL = [i for i, (reason, _) in enumerate(SHELL) if not reason]


@pytest.mark.parametrize("index", RUN_SHELL)
def test_every_shell_block_runs_as_written_outside_the_repo(
    index: int, settings, mail: MailServer, tmp_path: Path
) -> None:
    """Each block under `bash -eu`, in a scratch folder, against this test's Postgres and
    Redis. Whatever a block leaves running is stopped with its session afterwards."""
    block = SHELL[index][1]
    env = _env(settings, CAIRN_MAIL_URL=mail.url)
    log = tmp_path / "out.txt"
    with log.open("w") as sink:  # a file, not a pipe: background jobs keep theirs open
        proc = subprocess.Popen(
            ["bash", "-euc", block],
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        proc.wait(timeout=120)
        out = log.read_text()
        assert proc.returncode == 0, f"README shell block {index}:\n{block}\n{out}"
        if "cairn worker" in block:  # what it left running is a fleet: use it
            with Client(settings=settings) as client:
                run_id = client.enqueue("invoice", {"customer": "c", "email": "c@example.com"})
                wait_for(lambda: client.get(run_id).status == "done", 60, "the fleet's run")
    finally:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_the_pydantic_ai_example_answers_from_a_worker_behind_fastapi(
    settings, mail: MailServer, model, tmp_path: Path
) -> None:
    """support.py on `cairn worker`, app.py on uvicorn, as the README gives them: a web
    request enqueues the agent, the worker runs it (the stand-in calls its tool), and the
    answer comes back with the email sent once under the tool call's key."""
    import httpx

    for first_line, name in (("# support.py", "support.py"), ("# app.py: ask", "app.py")):
        block = next(b for b in PYTHON if b.startswith(first_line))
        (tmp_path / name).write_text(block)
    # The model's key from the environment, as the README says (the stand-in ignores it).
    env = _env(settings, MAIL_API=mail.url, ANTHROPIC_API_KEY="local-stand-in")
    command = re.search(r"`(CAIRN_WORKFLOWS=support cairn worker)`", README)
    assert command is not None, "the README no longer says how to start the agent's worker"
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


def test_the_chat_example_streams_a_runs_answer_to_its_own_client(
    settings, model, tmp_path: Path
) -> None:
    """chat.py on uvicorn, as the README gives it, next to a real worker: the answer comes
    to the app's own client token by token (several chunks, over time) and whole."""
    import time

    import httpx

    block = next(b for b in PYTHON if b.startswith("# chat.py"))
    (tmp_path / "chat.py").write_text(block)
    env = _env(settings)
    argv = [str(BIN / "cairn"), "worker", "--concurrency", "1"]
    worker = fleet.wait_ready(fleet.Proc(argv, env, tmp_path / "w.log", "w", tmp_path))
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
