"""The README and the documentation pages as the tests read them: each page's ```python and
```bash blocks in order, with the reason a block is not run when an HTML comment right
above it gives one (`<!-- not run by the tests: why -->`)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from cairn.testing import leash
from tests.conftest import ROOT

PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(
    r"(?:<!-- not run by the tests: ([^>]*)-->\n)?```(python|bash)\n(.*?)```", re.DOTALL
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Block:
    page: str  # relative to the repo: README.md, docs/guides/enqueue.md
    lang: str  # python or bash
    index: int  # its place among the page's blocks of that language
    code: str
    skip: str | None  # why the tests do not run it, as the page says

    @property
    def id(self) -> str:
        return f"{self.page}:{self.lang}{self.index}"


def text(page: str) -> str:
    return (ROOT / page).read_text()


def blocks(page: str) -> list[Block]:
    found: list[Block] = []
    counts = {"python": 0, "bash": 0}
    for m in BLOCK.finditer(text(page)):
        skip, lang, code = m.groups()
        found.append(Block(page=page, lang=lang, index=counts[lang], code=code, skip=skip))
        counts[lang] += 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]


def starting(first_line: str) -> Block:
    """The one python block, on whichever page, whose first line starts so."""
    [block] = [b for b in ALL if b.lang == "python" and b.code.startswith(first_line)]
    return block


@contextlib.contextmanager
def bash(
    script: str, cwd: Path, env: dict[str, str]
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`bash -eu` running script from cwd in a session of its own, its output in
    cwd/out.txt (a file, not a pipe: what it leaves in the background keeps its copy
    open); the whole session killed on the way out (the workers and beat it started)."""
    log = cwd / "out.txt"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            ["bash", "-euc", script],
            cwd=cwd,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    leash.hold(proc.pid)  # and if this test run dies first
    try:
        yield proc, log
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        leash.drop(proc.pid)
