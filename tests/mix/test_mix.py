"""The chaos mix in CI: programs of operations and faults from a seed, on one real fleet,
for a fixed budget, every invariant checked after each program
(docs/explanation/guarantees.md lists them). A broken one fails the test with its seed and
its shrunk program as a pytest test to paste here.

CAIRN_MIX_SEED: the seed (unset: a new one each run, printed); CAIRN_MIX_BUDGET: seconds
of programs (default 60: with the fleet's start about 2 minutes, beside the mutants;
the shrinking comes on top, only after a finding);
CAIRN_MIX_SHRINK: seconds at most to shrink a finding (default 45; 0 reports the program
as found, for a mutant that only needs to be caught).
"""

from __future__ import annotations

import os
import random

import pytest

from cairn.testing.mix.rig import MixFleet
from cairn.testing.mix.runner import run_mix
from tests.helpers.mix import plain


def test_programs_of_operations_and_faults_break_no_invariant(mix_fleet: MixFleet) -> None:
    seed = int(os.environ.get("CAIRN_MIX_SEED") or random.SystemRandom().randrange(1, 10**6))
    budget = float(os.environ.get("CAIRN_MIX_BUDGET") or 60)
    shrink = float(os.environ.get("CAIRN_MIX_SHRINK") or 45)
    report = run_mix(
        mix_fleet.options, seed=seed, budget=budget, shrink_budget=shrink, fleet=mix_fleet,
        say=plain,
    )  # fmt: skip
    print(
        f"mix seed {seed}: {report['programs']} programs, {report['operations']} operations, "
        f"{report['faults']} faults landed, {report['checks']} invariant checks, "
        f"{len(report['notes'])} first tries across a pause (not judged) "
        f"in {report['elapsed_s']}s (+{report['shrinking_s']}s shrinking)"
    )
    if not report["ok"]:
        found = report["findings"][0]
        pytest.fail(
            f"CAIRN_MIX_SEED={seed}: {found['detail']}\n"
            f"found after {found['found_after_s']}s in a program of {found['length']} operations, "
            f"shrunk to {found['shrunk_length']}; paste into tests/mix/:\n\n{found['pytest']}",
            pytrace=False,
        )
