"""Type-check cairn as it is installed: `mypy -p cairn` with pyproject's [tool.mypy].

mypy cannot follow the editable install's import hook (the repo's store/, steps/ and
workers/ folders are cairn.store, cairn.steps and cairn.workers), so this mirrors the
installed layout as a tree of links under .cairn/typecheck/ and checks that. Error paths
are printed as the repo's own, so an editor jumps to the file.

usage: .venv/bin/python scripts/typecheck.py [FILE...]     (exit status: mypy's)
  FILEs: check these instead (code that uses cairn, checked with cairn as installed)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".cairn" / "typecheck"
TREE = WORK / "tree"


def _link(target: Path, link: Path) -> None:
    # Made aside, then renamed over: two runs at once both end with the right link.
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


def build_tree() -> Path:
    """The installed layout as links, from pyproject's package-dir (its one home)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dir: dict[str, str] = pyproject["tool"]["setuptools"]["package-dir"]
    top = TREE / "cairn"
    top.mkdir(parents=True, exist_ok=True)
    wanted = {p.name: p for p in (ROOT / package_dir["cairn"]).iterdir() if p.name != "__pycache__"}
    for name, folder in package_dir.items():
        if name != "cairn":
            wanted[name.removeprefix("cairn.")] = ROOT / folder
    for old in top.iterdir():  # a module deleted or renamed since the last run
        if old.name not in wanted and not old.name.startswith("."):  # (not a run's _link)
            old.unlink()
    for name, target in wanted.items():
        _link(target, top / name)
    return TREE


def main(files: list[str]) -> int:
    tree = build_tree()
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    cmd += ["--cache-dir", str(WORK / "cache")]
    cmd += [str(Path(f).resolve()) for f in files] or ["-p", "cairn"]
    out = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, check=False)
    # cairn/store/x.py:3: error ... -> store/x.py:3: error ...
    at = re.compile(r"^(cairn/[^:]+\.py)(?=:)", re.MULTILINE)
    real = at.sub(lambda m: os.path.relpath((tree / m[1]).resolve(), ROOT), out.stdout)
    sys.stdout.write(real)
    sys.stderr.write(out.stderr)
    return out.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
