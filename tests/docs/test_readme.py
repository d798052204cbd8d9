"""The README and the docs pages as a user meets them: the settings table is the code's,
every Python block and every shell block that starts no process runs as written from a
folder outside the repo (or its page says why not). The examples that need a fleet, and
the tutorial run as one session, are tests/fleet's (test_readme.py, test_docs.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cairn.core.settings import markdown_table
from cairn.testing.standins import MailServer
from tests.helpers import pages

# Django's recipe is a module of a Django project: test_django.py runs it inside one.
IN_A_PROJECT = "# shop/"
PYTHON = [
    b
    for b in pages.ALL
    if b.lang == "python"
    and b.page not in pages.WHOLE
    and not b.skip
    and not b.code.startswith(IN_A_PROJECT)
]
SHELL = [b for b in pages.ALL if b.lang == "bash"]


def test_the_settings_table_is_generated_from_settings() -> None:
    page = pages.text("docs/reference/settings.md")
    start = page.index("| variable | default | what it does |")
    end = page.index("\n\n", start)
    assert page[start:end] == markdown_table(), (
        "run `cairn settings --markdown` into docs/reference/settings.md"
    )


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.id)
def test_every_python_block_runs_as_written_outside_the_repo(
    block: pages.Block, settings, tmp_path: Path
) -> None:
    script = tmp_path / "block.py"
    script.write_text(block.code)
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=pages.user_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, f"{block.id}:\n{block.code}\n{out.stderr}"


def test_runs_json_pages_through_a_thousand_runs(settings, client, store) -> None:
    for i in range(1_050):
        store.create_run(f"page-{i:04d}", "invoice", {"i": i})
    env = pages.user_env(settings)
    seen: list[str] = []
    after: list[str] = []
    while True:
        out = subprocess.run(
            [str(pages.BIN / "cairn"), "runs", "--json", "--limit", "400", *after],
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
        [str(pages.BIN / "cairn"), "--version"], capture_output=True, text=True, check=True
    )
    assert re.fullmatch(r"cairn \d+\.\d+\.\d+\n", out.stdout)


@pytest.mark.parametrize("block", pages.shell_blocks(starting=False), ids=lambda b: b.id)
def test_every_shell_block_that_starts_no_process_runs_as_written_outside_the_repo(
    block: pages.Block, settings, mail: MailServer, tmp_path: Path
) -> None:
    """Each block under `bash -eu`, in a scratch folder, against this test's Postgres and
    Redis. The blocks that start a worker, beat or server are tests/fleet's."""
    env = pages.user_env(settings, CAIRN_MAIL_URL=mail.url)
    with pages.bash(block.code, tmp_path, env) as (proc, log):
        proc.wait(timeout=120)
        assert proc.returncode == 0, f"{block.id}:\n{block.code}\n{log.read_text()}"


def test_the_shell_blocks_that_are_not_run_say_why() -> None:
    skipped = [b for b in SHELL if b.skip]
    assert all(len(b.skip) > 40 for b in skipped), [b.id for b in skipped]
    for page in pages.PAGES:  # run a page's shell blocks in a test rather than skipping them
        assert len([b for b in skipped if b.page == page]) <= 2, page
    assert len(skipped) <= 6


def test_every_python_block_is_run_by_a_test() -> None:
    skipped = [b.id for b in pages.ALL if b.lang == "python" and b.skip]
    assert skipped == []
    in_a_project = [b.id for b in pages.ALL if b.code.startswith(IN_A_PROJECT)]
    assert in_a_project == ["docs/guides/enqueue.md:python4"]  # tests/docs/test_django.py
