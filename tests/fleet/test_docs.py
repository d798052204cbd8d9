"""The README's example on the worker it names, and the tutorial run top to bottom as one
shell session as a new user would: it ends with a run resumed after its worker was
SIGKILLed and its email sent once.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cairn.client.client import Client
from cairn.testing import fleet
from cairn.testing.standins import MailServer, ModelServer
from tests.helpers import pages
from tests.helpers.runs import wait_for

TUTORIAL = "docs/tutorial.md"


def _readme_example(provider: str) -> str:
    """flows.py as the README gives it, or (openai) with the one change the README says
    moves it to OpenAI: the model's name."""
    code = pages.starting("# flows.py").code
    if provider == "anthropic":
        return code
    named = re.search(
        r'`model="(gpt-[^"]+)"` the\s+same two steps run on OpenAI', pages.text("README.md")
    )
    assert named is not None, "the README no longer says which model name runs it on OpenAI"
    anthropic = re.findall(r'model="(claude-[^"]+)"', code)
    assert len(anthropic) == 1, "the README's example names its model once"
    return code.replace(f'model="{anthropic[0]}"', f'model="{named[1]}"')


@pytest.mark.parametrize(
    ("provider", "api"), [("anthropic", "messages"), ("openai", "chat.completions")]
)
def test_the_readme_example_runs_on_the_worker_it_names(
    settings, mail: MailServer, model: ModelServer, tmp_path: Path, provider: str, api: str
) -> None:
    """flows.py as the README gives it: `python flows.py` enqueues, the worker started by
    the command the README quotes runs both steps, and the email goes out once; on
    Anthropic as written, and on OpenAI with only the model's name changed (the stand-in
    speaks both, each through its provider's own SDK)."""
    example = pages.starting("# flows.py")
    assert example.page == "README.md"
    code = _readme_example(provider)
    (tmp_path / "flows.py").write_text(code)
    command = re.search(r"`(CAIRN_WORKFLOWS=flows cairn worker)`", pages.text("README.md"))
    assert command is not None, "the README no longer says how to start the worker"
    variable, _, args = command.group(1).partition(" ")
    key, _, value = variable.partition("=")
    env = pages.user_env(settings, CAIRN_MAIL_URL=mail.url)
    argv = [str(pages.BIN / "cairn"), *args.split()[1:], "--concurrency", "1"]
    worker = fleet.wait_ready(
        fleet.Proc(argv, {**env, key: value}, tmp_path / "w.log", "readme", tmp_path)
    )
    try:
        out = subprocess.run(
            [sys.executable, "flows.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        run_id, status = out.stdout.split()
        assert status == "pending"
        with Client(settings=settings) as client:
            wait_for(lambda: client.get(run_id).status in ("done", "failed"), 30, "welcome")
            run = client.get(run_id)
            assert run.status == "done", (run.error, worker.text()[-3000:])
            assert [h.cursor for h in client.history(run_id)] == ["draft", "send"]
            assert run.cost_usd > 0  # priced by the provider's table
    finally:
        worker.kill()
    assert mail.stats()["deliveries"] == 1
    [asked] = model.received(api)  # the one request, to the named model's provider
    assert f'model="{asked["model"]}"' in code


def test_the_tutorial_ends_with_a_run_resumed_after_its_worker_was_killed(
    settings, sql, tmp_path: Path
) -> None:
    """Its files written where it says, its shell blocks run in order as one `bash -eu`
    session against this test's Postgres, Redis and stand-ins. The mail stand-in answers
    5 s after it delivered, as the page's set-up asks, so the worker is killed after its
    email went out and before `welcome` was saved."""
    blocks = pages.blocks(TUTORIAL)
    for block in blocks:
        named = re.match(r"# (\S+\.py)\n", block.code)
        if block.lang == "python" and named:
            path = tmp_path / named.group(1)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.code)
    script = "\n".join(b.code for b in blocks if b.lang == "bash" and not b.skip)
    with MailServer(delay_ms=5000) as mail:
        env = pages.user_env(settings, CAIRN_MAIL_URL=mail.url)
        with (
            pages.bash(script, tmp_path, env) as (proc, log),
            contextlib.suppress(subprocess.TimeoutExpired),  # failed below, with its output
        ):
            proc.wait(timeout=180)
    out = log.read_text()
    logs = "".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("*.log")))
    assert proc.returncode == 0, f"{out}\n{logs}"
    shown = subprocess.run(
        [str(pages.BIN / "cairn"), "runs", "show", "ada", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    run = json.loads(shown.stdout)
    assert run["run"]["status"] == "done" and run["run"]["resumes"] >= 1, run["run"]
    assert [s["cursor"] for s in run["steps"]] == ["plan", "welcome", "record"]
    stats = mail.stats()
    assert (stats["attempts"], stats["deliveries"], stats["deduplicated"]) == (2, 1, 1), stats
    assert sql("SELECT email FROM onboarded") == [("ada@example.com",)]
