"""The layers hold: each of cairn's packages imports only those below it (the face, the
fleet, the step API, the state, the core types), and only the state imports the database
and Redis drivers (pyproject's [tool.importlinter], checked by import-linter over the
installed layout, type-checking imports included). And bench/ reaches cairn through the
public API, and its internals through bench/internals.py only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import cairn
import cairn.testing

ROOT = Path(__file__).resolve().parents[2]


def test_every_layer_imports_only_those_below_it() -> None:
    # As a contributor runs it, from the checkout: cairn/store, cairn/steps and
    # cairn/workers are links to the top-level folders, so the tree is the installed layout.
    done = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 3 kept, 0 broken." in done.stdout


# What bench/ may import from cairn outside bench/internals.py: the public API.
PUBLIC: dict[str, set[str] | None] = {
    "cairn": {*cairn.__all__, "__version__"},
    "cairn.testing": set(cairn.testing.__all__),
    "cairn.langgraph": None,  # any of it
    "cairn.pydantic_ai": None,
    "cairn.openai_agents": None,
}


def test_bench_reaches_cairns_internals_only_through_bench_internals() -> None:
    """So a refactoring of cairn's internals asks an edit in one module of bench/, which
    says why it needs each name."""
    wrong = []
    for path in sorted((ROOT / "bench").glob("*.py")):
        if path.name == "internals.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "cairn":
                allowed = PUBLIC.get(node.module or "", set())
                names = {a.name for a in node.names}
                if allowed is not None and not names <= allowed:
                    wrong.append(f"{path.name}:{node.lineno}: from {node.module} import {names}")
            elif isinstance(node, ast.Import):
                wrong += [
                    f"{path.name}:{node.lineno}: import {a.name}"
                    for a in node.names
                    if a.name.split(".")[0] == "cairn" and a.name not in PUBLIC
                ]
    assert not wrong, "import these through bench/internals.py:\n" + "\n".join(wrong)
