"""cairn is one installed namespace, and `import cairn` stays light enough for a web app.
A user's own `store`, `steps` and `workers` packages beside it in a real worker:
tests/fleet/test_package.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers.services import ROOT


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
    every module they load work without them (tests/docs/test_wheel.py installs without)."""
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
    # The integrations need their own extras, and so do the LangGraph and Agents SDK demos
    # (the SDK imports MCP, and MCP starlette); faulted is the chaos crew's worker app (it
    # wants CAIRN_FAULTS); cairn/web/ is not listed. The agent demo's version 2 modules
    # register `agent` again (a process holds one version of it: a deploy's new workers).
    skip = ("cairn.pydantic_ai", "cairn.langgraph", "cairn.openai_agents",
            "cairn.contrib.pydantic_ai", "cairn.contrib.langgraph",
            "cairn.testing.demos.graph_agent", "cairn.testing.demos.oa_agent",
            "cairn.testing.demos.agent_v2", "cairn.testing.demos.agent_v2_reordered",
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
