"""Concurrency keys and priorities: the loop on the in-memory twins (real workers on both
brokers, the HTTP API and the CLI: tests/fleet/test_concurrency.py).

A run enqueued with a concurrency key holds one of its key's slots from its start until
it stops; over the limit it waits as queued in Postgres, holding no worker and no broker
message, and the transaction that stops a run admits the key's next one.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest

import tests.helpers.flows  # noqa: F401 (square)
from cairn.core.errors import InvalidInput
from cairn.core.inputs import check_flow
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.testing import ManualClock, MemoryLeases, MemoryStore
from cairn.testing.chaos.keys import most_at_once
from cairn.workers import broker, loop

SETTINGS = Settings(
    database_url="postgresql://unused.invalid/x", redis_url="redis://unused.invalid/0"
)


# -- the loop on the twins ---------------------------------------------------------------
def test_a_keys_runs_are_sent_one_at_a_time_each_once_as_slots_free() -> None:
    """Three runs of one key at limit 1 and one of another key: only the first of each is
    sent at enqueue; each run's end sends the key's next, at its priority."""
    clock = ManualClock()
    sent: collections.deque[tuple[str, bool, int]] = collections.deque()
    deps = loop.Deps(
        settings=SETTINGS,
        store=MemoryStore(clock),
        leases=MemoryLeases(clock),
        model=None,
        send=lambda run_id, resume, priority: sent.append((run_id, resume, priority)),
    )
    store = deps.store
    for run_id, key, priority in (("a", "u1", 0), ("b", "u1", 0), ("c", "u1", 3), ("x", "u2", 0)):
        store.create_run(run_id, "square", {"n": 2}, priority=priority, concurrency_key=key)
    assert sorted(store.admitted("square", "u1") + store.admitted("square", "u2")) == [
        ("a", 0), ("x", 0),
    ]  # fmt: skip
    assert loop.run("b", deps) == RunStatus.QUEUED  # a queued run's stray message: nothing
    order = []
    queue = collections.deque(["a", "x"])
    while queue:
        run_id = queue.popleft()
        order.append(run_id)
        assert loop.run(run_id, deps) == RunStatus.DONE
        while sent:
            queue.append(sent.popleft()[0])
    assert order == ["a", "x", "c", "b"]  # c's priority first, then b; each sent once
    assert all(store.get(r).status == RunStatus.DONE for r in "abcx")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("key", "limit", "priority", "message"),
    [
        ("user 42", 1, 0, "concurrency key 'user 42' is not valid"),
        ("", 1, 0, "concurrency key '' is not valid"),
        ("u" * 201, 1, 0, "is not valid"),
        (42, 1, 0, "concurrency key 42 is not valid"),
        ("user:42", 0, 0, "concurrency limit must be a whole number from 1 to 10,000"),
        ("user:42", True, 0, "not True"),
        ("user:42", 1, 101, "priority must be a whole number from -100 to 100"),
        (None, 1, 1.5, "priority must be a whole number"),
    ],
)
def test_bad_flow_options_are_clear_errors(
    key: Any, limit: Any, priority: Any, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        check_flow(key, limit, priority)


def test_a_workflows_own_defaults_are_checked_when_it_is_declared() -> None:
    from cairn.steps import registry

    with pytest.raises(ValueError, match="workflow 'w0': concurrency limit"):
        registry.Workflow("w0", concurrency_limit=0)
    assert registry.Workflow("w1", priority=5, concurrency_limit=3).priority == 5


def test_most_at_once_counts_overlaps_and_not_a_handoff() -> None:
    assert most_at_once([(0, 2), (2, 3), (3, 5)]) == 1  # each starts as the last ends
    assert most_at_once([(0, 4), (1, 2), (3, 5), (4.5, 6)]) == 2


def test_a_priority_picks_its_broker_queue() -> None:
    assert [broker.queue_for(p) for p in (5, 1, 0, -1)] == [broker.HIGH] * 2 + [broker.RUNS] * 2
