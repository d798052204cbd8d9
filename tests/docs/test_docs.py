"""The documentation site: it builds with `mkdocs build --strict`, and the README stays a
landing page whose links land. The tutorial, run as one shell session on real workers, is
tests/fleet/test_docs.py's."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.helpers import pages
from tests.helpers.services import ROOT


def test_the_site_builds_strict(tmp_path: Path) -> None:
    """Strict: a broken link, a missing page in the nav or a docstring mkdocstrings cannot
    read fails the build."""
    out = subprocess.run(
        [str(pages.BIN / "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "api" / "index.html").exists()


def test_the_readme_is_a_landing_page_whose_links_land() -> None:
    readme = pages.text("README.md")
    assert len(readme.splitlines()) <= 250
    links = re.findall(r"\]\(((?:docs/)[^)#]+)(?:#[^)]*)?\)", readme)
    assert links, "the README links to the docs pages"
    assert [link for link in links if not (ROOT / link).exists()] == []


def test_the_benchmarks_page_names_every_section() -> None:
    # The page's `--only` list is what a reader copies: every section python -m bench has,
    # once each (a merge once left two half lists there).
    from bench.common import SECTIONS

    text = (ROOT / "docs" / "benchmarks.md").read_text()
    lists = re.findall(r"`--only ((?:\w+,)+\w+)`", text)
    assert lists, "docs/benchmarks.md: no `--only a,b,...` list"
    assert [tuple(lst.split(",")) for lst in lists] == [SECTIONS]
