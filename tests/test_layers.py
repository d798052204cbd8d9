"""The layers hold: each of cairn's packages imports only those below it (the face, the
fleet, the step API, the state, the core types), and only the state imports the database
and Redis drivers (pyproject's [tool.importlinter], checked by import-linter over the
installed layout, type-checking imports included)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_layer_imports_only_those_below_it() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import typecheck  # the installed layout as a tree of links (mypy reads it too)
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    tree = typecheck.build_tree()
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "lint-imports"),
            "--no-cache",
            str(ROOT / "pyproject.toml"),
        ],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 3 kept, 0 broken." in done.stdout
