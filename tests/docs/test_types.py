"""cairn type-checks under `mypy --strict` (scripts/typecheck.py, pyproject's [tool.mypy]),
and so does a user's code written against its public API.

35-50 s from a cold cache on 2 cores, 2-3 s warm (.cairn/typecheck/cache)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What a user writes, as the README shows it: sync and async steps, effects, both clients.
# assert_type pins what a user's checker infers, not only that it accepts the code.
USER_CODE = """
from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, assert_type

import cairn
from cairn.steps import Context, StepResult, workflow
from cairn.store import Checkpoint, PgStore

flow = cairn.workflow("typed")


def double(n: int) -> int:
    return n * 2


@flow.step()
def plan(ctx: cairn.Context) -> cairn.StepResult:
    charged = ctx.once(lambda key: {"charge": key})
    assert_type(charged, dict[str, str])
    got = ctx.call("lookup", double, 21)
    assert_type(got, int)
    assert_type(ctx.parallel([("lookup", double, 1), ("lookup", double, 2)]), list[Any])
    return cairn.StepResult(cursor="write", state={"charged": charged, "got": got})


async def fetch(ctx: Context, n: int) -> dict[str, int]:
    return {"n": n}


@flow.step()
async def write(ctx: cairn.Context) -> cairn.StepResult:
    assert_type(await ctx.acall("fetch", fetch, ctx, 1), dict[str, int])
    return StepResult(cursor=cairn.DONE)


# the decorated step keeps its own type
still_async: Callable[[Context], Coroutine[Any, Any, StepResult]] = write
other = workflow("typed-other")


def enqueue() -> cairn.RunStatus | None:
    with cairn.Client() as client:
        run_id = client.enqueue("typed", {"n": 1})
        runs: list[cairn.Run] = client.list()
        run = client.get(run_id)
        return run.status if run else (runs[0].status if runs else None)


async def aenqueue() -> cairn.Run:
    async with cairn.AsyncClient() as client:
        run_id = await client.enqueue("typed")
        return await client.wait(run_id, timeout=5)


def load(store: PgStore, run_id: str) -> Checkpoint | None:
    return store.load(run_id)


def transient() -> type[cairn.CairnError]:
    return cairn.Transient

"""


def _typecheck(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "typecheck.py"), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


def test_cairn_type_checks_strict() -> None:
    out = _typecheck()
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_users_code_type_checks_strict_against_the_public_api(tmp_path: Path) -> None:
    user = tmp_path / "user_flows.py"
    user.write_text(textwrap.dedent(USER_CODE))
    out = _typecheck(str(user))
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_finds_nothing_to_lint_or_format() -> None:
    """The other two gates: ruff's lint rules and its formatter, over the whole tree
    (pyproject's [tool.ruff])."""
    ruff = Path(sys.executable).parent / "ruff"
    for args in (["check", "."], ["format", "--check", "."]):
        out = subprocess.run(
            [str(ruff), *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
        )
        assert out.returncode == 0, f"ruff {' '.join(args)}:\n{out.stdout}{out.stderr}"
