"""cairn is one installed namespace: a user's own `store`, `steps` and `workers` packages
work beside it, and `import cairn` stays light enough for a web app."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from cairn.store import PgStore
from cairn.testing import fleet
from tests.conftest import ROOT, wait_for

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


def test_import_cairn_loads_no_worker_model_metrics_or_cli_code(tmp_path: Path) -> None:
    code = (
        "import sys, cairn; cairn.Client; cairn.workflow; cairn.Context; cairn.StepResult; "
        "print(' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    modules = set(out.stdout.split())
    assert "cairn.client" in modules  # the Client did load
    heavy = ("celery", "kombu", "anthropic", "prometheus_client", "typer", "rich", "redis")
    loaded = sorted(m for m in modules if m.split(".")[0] in heavy)
    assert loaded == [], f"import cairn loaded {loaded}"


def test_nothing_but_cairn_serve_imports_the_server_extra(tmp_path: Path) -> None:
    """FastAPI, uvicorn and Jinja2 are the `server` extra: the worker, beat, the CLI and
    every module they load work without them (tests/test_wheel.py installs without)."""
    pkgs = {"cairn": ROOT / "cairn", "cairn.testing": ROOT / "cairn" / "testing",
            "cairn.testing.demos": ROOT / "cairn" / "testing" / "demos",
            "cairn.core": ROOT / "cairn" / "core", "cairn.client": ROOT / "cairn" / "client",
            "cairn.cli": ROOT / "cairn" / "cli", "cairn.contrib": ROOT / "cairn" / "contrib",
            "cairn.store": ROOT / "store", "cairn.steps": ROOT / "steps",
            "cairn.workers": ROOT / "workers"}  # fmt: skip
    modules = sorted(
        f"{pkg}.{path.stem}" if path.stem != "__init__" else pkg
        for pkg, folder in pkgs.items()
        for path in folder.glob("*.py")
    )
    # The integrations need their own extras, and so does the LangGraph demo; faulted is
    # the chaos crew's worker app (it wants CAIRN_FAULTS); cairn/web/ is not listed.
    skip = ("cairn.pydantic_ai", "cairn.langgraph", "cairn.contrib.pydantic_ai",
            "cairn.contrib.langgraph", "cairn.testing.demos.graph_agent",
            "cairn.testing.faulted", "cairn.cli.__main__")  # fmt: skip
    modules = [m for m in modules if m not in skip]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "from cairn.testing import chaos; from cairn import cli\n"
        "cli._register_plugins(); cli.app\n"
        "print(' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    server = ("fastapi", "starlette", "uvicorn", "jinja2")
    loaded = sorted(m for m in out.stdout.split() if m.split(".")[0] in server)
    assert loaded == [], f"loaded without cairn serve: {loaded}"
