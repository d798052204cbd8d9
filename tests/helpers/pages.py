"""The README and the documentation pages as the tests read them: each page's ```python,
```bash and ```typescript blocks in order (the TypeScript one: tests/fleet/test_typescript.py), with the reason a block is not run when an HTML comment right
above it gives one (`<!-- not run by the tests: why -->`)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from cairn.core.settings import Settings
from cairn.testing import leash
from tests.helpers.services import ROOT

# The virtualenv's commands (cairn, uvicorn, mkdocs), as a user who installed cairn has them.
BIN = Path(sys.executable).parent
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(
    r"(?:<!-- not run by the tests: ([^>]*)-->\n)?```(python|bash|typescript)\n(.*?)```", re.DOTALL
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Block:
    page: str  # relative to the repo: README.md, docs/guides/enqueue.md
    lang: str  # python, bash or typescript
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
    counts = {"python": 0, "bash": 0, "typescript": 0}
    for m in BLOCK.finditer(text(page)):
        skip, lang, code = m.groups()
        found.append(Block(page=page, lang=lang, index=counts[lang], code=code, skip=skip))
        counts[lang] += 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]
# Pages whose blocks build on one another, run in order as one session, not block by
# block: the tutorial (tests/fleet/test_docs.py).
WHOLE = {"docs/tutorial.md"}
# A shell block that starts workers, beat or a server runs in tests/fleet; the others in
# tests/docs.
STARTS = ("cairn worker", "cairn beat", "cairn serve", "cairn chaos", "cairn demo")


def shell_blocks(*, starting: bool) -> list[Block]:
    """The shell blocks the tests run one by one (not skipped, not of a WHOLE page) that
    start a process (starting) or start none."""
    return [
        b
        for b in ALL
        if b.lang == "bash"
        and not b.skip
        and b.page not in WHOLE
        and any(s in b.code for s in STARTS) == starting
    ]


def starting(first_line: str) -> Block:
    """The one python block, on whichever page, whose first line starts so."""
    [block] = [b for b in ALL if b.lang == "python" and b.code.startswith(first_line)]
    return block


def user_env(settings: Settings, **extra: str) -> dict[str, str]:
    """A user's environment for a page's blocks: the test's servers, cairn's commands on
    PATH, none of the repository's modules on the path, and extra."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "ANTHROPIC_", "OPENAI_"))
    }
    env.update(
        CAIRN_DATABASE_URL=settings.database_url,
        CAIRN_REDIS_URL=settings.redis_url,
        ANTHROPIC_BASE_URL=settings.anthropic_base_url or "",
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONPATH="",
        **extra,
    )
    if settings.openai_base_url:  # set empty, the SDK would take it as the address
        env.setdefault("OPENAI_BASE_URL", settings.openai_base_url)
    return env


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
