"""The gauntlet's mutants still point at code and tests that exist: a mutant whose line
moved, or whose killer was renamed, is caught here in a second, not at the end of the run."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from tests.helpers.services import ROOT

_spec = importlib.util.spec_from_file_location("cairn_mutants", ROOT / "scripts" / "mutants.py")
assert _spec is not None and _spec.loader is not None
mutants = importlib.util.module_from_spec(_spec)
sys.modules["cairn_mutants"] = mutants  # dataclasses look their module up there
_spec.loader.exec_module(mutants)


@pytest.mark.parametrize("m", mutants.MUTANTS, ids=[m.id for m in mutants.MUTANTS])
def test_each_mutant_breaks_one_line_and_names_tests_that_exist(m) -> None:
    assert (ROOT / m.file).read_text().count(m.old) == 1, f"{m.id}: its line moved"
    assert m.old != m.new
    for node in m.tests:
        path, _, rest = node.partition("::")
        name = re.split(r"[\[:]", rest)[0] if rest else ""
        source = (ROOT / path).read_text()
        assert not name or re.search(rf"^def {re.escape(name)}\(", source, re.MULTILINE), node


def test_mutant_ids_are_unique() -> None:
    ids = [m.id for m in mutants.MUTANTS]
    assert len(ids) == len(set(ids))
