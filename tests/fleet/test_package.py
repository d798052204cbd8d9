"""A user's own `store`, `steps` and `workers` packages work beside cairn in a real worker."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from cairn.store import PgStore
from cairn.testing import fleet
from tests.helpers.runs import wait_for

USER_STEPS = """
import cairn
from store import remember          # the user's own `store` package, not cairn's

flow = cairn.workflow("user-greet")

@flow.step()
def greet(ctx: cairn.Context) -> cairn.StepResult:
    return cairn.StepResult(cursor="done", state={"greeting": remember(ctx.input["name"])})
"""


ENQUEUE = """
import json, sys
import cairn, cairn.store, store, steps, workers
assert store.__file__.startswith(sys.argv[1]), store.__file__   # theirs, not ours
assert cairn.store.__name__ == "cairn.store"
with cairn.Client(sys.argv[2], sys.argv[3]) as client:
    print(client.enqueue("user-greet", {"name": "Ada"}, run_id="user-1"))
"""


def _user_project(root: Path) -> Path:
    for pkg in ("store", "steps", "workers"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "store" / "__init__.py").write_text(
        "def remember(name):\n    return f'hello {name}, from the user store'\n"
    )
    (root / "steps" / "flows.py").write_text(textwrap.dedent(USER_STEPS))
    (root / "enqueue.py").write_text(textwrap.dedent(ENQUEUE))
    return root


def test_a_user_package_named_store_works_beside_cairn(
    tmp_path: Path, settings, worker_env, store: PgStore
) -> None:
    project = _user_project(tmp_path / "app")
    env = {**worker_env, "PYTHONPATH": "", "CAIRN_WORKFLOWS": "steps.flows"}
    worker = fleet.start_worker(env, tmp_path / "w.log", "user", 1, cwd=project)
    try:
        out = subprocess.run(
            [sys.executable, "enqueue.py", str(project), settings.database_url, settings.redis_url],
            check=False,
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "user-1"
        run = wait_for(
            lambda: (r := store.get("user-1")) and r.status == "done" and r, 30, "the user's run"
        )
        assert run.state == {"greeting": "hello Ada, from the user store"}
    finally:
        worker.kill()
