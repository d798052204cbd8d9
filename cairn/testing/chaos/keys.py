"""Concurrency keys under chaos (`cairn chaos --keys N`): runs spread over N keys at a
limit, and what the verdict checks once every run stopped. No key ran more runs at once
than its limit (each run's span, its first step's start to its last step's end, from
step_history), and no slot, queue entry or key row was left behind.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from cairn.store import admin


def key_of(index: int, keys: int) -> str | None:
    """Run index's concurrency key (None: chaos runs without keys)."""
    return f"k{index % keys}" if keys else None


def verdict(url: str, limit: int) -> tuple[dict[str, Any], list[str]]:
    """The report's keys section and its problems."""
    spans = admin.execute(
        url,
        "SELECT r.concurrency_key AS key, h.run_id, min(h.started_at) AS start,"
        " max(h.ended_at) AS end FROM step_history h JOIN runs r USING (run_id)"
        " WHERE r.concurrency_key IS NOT NULL GROUP BY r.concurrency_key, h.run_id",
    )
    by_key: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
    for s in spans:
        by_key[s["key"]].append((s["start"], s["end"]))
    most = {key: most_at_once(runs) for key, runs in sorted(by_key.items())}
    left = admin.execute(
        url,
        "SELECT (SELECT count(*) FROM slots) AS slots, (SELECT count(*) FROM queued) AS queued,"
        " (SELECT count(*) FROM concurrency_keys) AS keys",
    )[0]
    problems = [
        f"key {key!r} ran {n} runs at once, over its limit of {limit}"
        for key, n in most.items()
        if n > limit
    ]
    if any(left.values()):
        problems.append(
            f"leaked after every run stopped: {left['slots']} slot(s), {left['queued']} "
            f"queued run(s), {left['keys']} key row(s)"
        )
    return {"limit": limit, "most_at_once": most, "left": dict(left)}, problems


def most_at_once(spans: list[tuple[Any, Any]]) -> int:
    """The most spans open at one instant (one that ends as another starts: not both)."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most
