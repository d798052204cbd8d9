"""Bulk replay under chaos (`cairn chaos --replay-failed`): every run fails first (the
mail API refuses its send), the cause is fixed and Client.replay re-arms them while the
kills go on. What the verdict checks once every run stopped: each run failed, was
replayed once (by the replay's answer and by its checkpoint's history: one re-arm from
failed), and ended done; the report's step checks say each email went out once.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def verdict(
    ids: list[str],
    failed: list[str],
    replayed: list[str],
    again: list[str],
    history: list[dict[str, Any]],
) -> tuple[dict[str, Any], list[str]]:
    """The report's replay section and its problems."""
    rearms: Counter[str] = Counter()
    last: dict[str, str] = {}
    for row in history:  # ordered by id: every version of every checkpoint row
        prev = last.get(row["run_id"])
        if prev == "failed" and row["status"] in ("pending", "queued"):
            rearms[row["run_id"]] += 1
        last[row["run_id"]] = row["status"]
    twice = sorted(r for r, n in Counter(replayed).items() if n > 1)
    problems = []
    if sorted(failed) != sorted(ids):
        problems.append(f"{len(ids) - len(failed)} run(s) did not fail before the replay")
    if sorted(set(replayed)) != sorted(ids) or twice:
        problems.append(
            f"the replay returned {len(replayed)} run(s) for {len(ids)} failed"
            + (f" ({twice[0]} twice)" if twice else "")
        )
    if again:
        problems.append(f"a second replay re-armed {len(again)} run(s) again")
    off = sorted(r for r in ids if rearms[r] != 1)
    if off:
        problems.append(
            f"{len(off)} run(s) re-armed from failed other than once (e.g. {off[0]}: "
            f"{rearms[off[0]]})"
        )
    section = {
        "failed_first": len(failed),
        "replayed": len(replayed),
        "replayed_again": len(again),
        "rearmed_once": sum(1 for r in ids if rearms[r] == 1),
    }
    return section, problems
