"""mkdocs hook: lay out the installed `cairn` namespace for the API reference.

The repo's `steps/`, `store/` and `workers/` are installed as `cairn.steps`, `cairn.store`
and `cairn.workers` (pyproject's package-dir). griffe, which reads the source for
mkdocstrings, finds packages by folder, so it is given a tree of links shaped as installed:
`.cairn/docs-src/cairn/` holds a link to each file of `cairn/` and one per mapped folder.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / ".cairn" / "docs-src"


def _link(link: Path, target: Path) -> None:
    # Updated in place, never removed and rebuilt: a `mkdocs serve` may be reading it.
    if link.is_symlink() and link.readlink() == target:
        return
    link.unlink(missing_ok=True)
    link.symlink_to(target)


def lay_out() -> None:
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    top = TREE / "cairn"
    top.mkdir(parents=True, exist_ok=True)
    wanted = {top / entry.name: entry for entry in (ROOT / dirs["cairn"]).iterdir()}
    wanted |= {
        TREE / name.replace(".", "/"): ROOT / d for name, d in dirs.items() if name != "cairn"
    }
    for link in top.iterdir():
        if link not in wanted:
            link.unlink()
    for link, target in wanted.items():
        _link(link, target)


# Laid out as mkdocs loads this hook, before any plugin's on_config: mkdocstrings takes
# its `paths` as it is configured, and in a fresh clone the tree is not there yet.
lay_out()


def on_config(config: Any) -> Any:
    lay_out()  # again for `mkdocs serve`'s rebuilds, files added since
    return config
