"""Child runs (StepResult.spawn): the loop on the in-memory twins (real workers:
tests/fleet/test_children.py).

The spawn's children are created by the save of the step that spawned them, so a replay
spawns nothing more; the parent waits holding no worker until enough children stopped,
then its next step reads their results and errors (ctx.children()).
"""

from __future__ import annotations

import collections
from typing import Any

import pytest

import cairn
import tests.helpers.flows  # noqa: F401 (fanout, square, recursive)
from cairn.core import errors
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.testing import ManualClock, MemoryLeases, MemoryStore
from cairn.workers import loop
from cairn.workers.reaper import Reaper

SETTINGS = Settings(
    database_url="postgresql://unused.invalid/x",
    redis_url="redis://unused.invalid/0",
    max_spawn_depth=3,
)


class Broker:
    """The messages the loop sends, run one at a time by `drain` (a fleet of one)."""

    def __init__(self) -> None:
        self.queue: collections.deque[tuple[str, bool]] = collections.deque()

    def send(self, run_id: str, resume: bool, priority: int = 0) -> None:
        self.queue.append((run_id, resume))

    def drain(self, deps: loop.Deps) -> list[tuple[str, bool]]:
        seen = []
        while self.queue:
            run_id, resume = self.queue.popleft()
            seen.append((run_id, resume))
            loop.run(run_id, deps)
        return seen


@pytest.fixture
def broker() -> Broker:
    return Broker()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def mem(broker: Broker, clock: ManualClock) -> loop.Deps:
    return loop.Deps(
        settings=SETTINGS,
        store=MemoryStore(clock),
        leases=MemoryLeases(clock),
        model=None,
        send=broker.send,
    )


def _start(deps: loop.Deps, workflow: str, data: dict[str, Any], run_id: str = "p") -> str:
    assert deps.store.create_run(run_id, workflow, data)
    return run_id


def test_a_parent_waits_for_its_children_and_reads_their_results_and_errors(
    mem: loop.Deps, broker: Broker
) -> None:
    parent = _start(mem, "fanout", {"ns": [1, 2, -3, 4]})
    assert loop.run(parent, mem) == RunStatus.WAITING
    kids = [f"p.split.0.{i}" for i in range(4)]
    assert broker.queue == collections.deque((k, False) for k in kids)  # sent after the save
    seen = broker.drain(mem)
    assert seen[-1] == (parent, True)  # the last child to stop woke the parent, once
    assert [s for s in seen if s[0] == parent] == [(parent, True)]
    run = mem.store.get(parent)
    assert run is not None and run.status == RunStatus.DONE
    assert run.state is not None and run.state["total"] == 1 + 4 + 16
    assert run.state["failed"] == ["step 'sq' raised ValueError: cannot square -3: negative"]
    assert [k.run_id for k in mem.store.children(parent)] == kids
    assert all(k.parent_id == parent for k in mem.store.children(parent))


def test_a_parent_waiting_for_any_child_goes_on_at_the_first(
    mem: loop.Deps, broker: Broker
) -> None:
    parent = _start(mem, "fanout", {"ns": [5, 6, 7], "wait": "any"})
    loop.run(parent, mem)
    first, _ = broker.queue.popleft()
    loop.run(first, mem)  # one child stops: the parent is woken
    assert broker.queue[-1] == (parent, True)
    broker.queue.pop()
    assert loop.run(parent, mem) == RunStatus.DONE
    run = mem.store.get(parent)
    assert run is not None and run.state is not None
    assert run.state["total"] == 25 and run.state["statuses"] == ["done", "pending", "pending"]


def test_a_spawn_replayed_after_a_crash_spawns_each_child_once(
    mem: loop.Deps, broker: Broker, clock: ManualClock
) -> None:
    """The worker dies after the spawn's save, before its messages: the children exist
    (made by the save), nothing spawns them again, and the reaper sends them."""
    parent = _start(mem, "fanout", {"ns": [1, 2, 3]})

    def die(run_id: str, resume: bool, priority: int) -> None:
        raise SystemExit("killed between the save and the sends")

    with pytest.raises(SystemExit):
        loop.run(parent, loop.Deps(**{**vars(mem), "send": die}))
    assert [k.run_id for k in mem.store.children(parent)] == [f"p.split.0.{i}" for i in range(3)]
    # The parent's message comes again (the broker redelivers it): it finds the parent
    # waiting, spawns nothing more, and sends the children no worker has taken, once.
    assert loop.run(parent, mem) == RunStatus.WAITING
    assert len(mem.store.children(parent)) == 3
    assert sorted(broker.queue) == [(f"p.split.0.{i}", False) for i in range(3)]
    assert loop.run(parent, mem) == RunStatus.WAITING and len(broker.queue) == 3
    broker.queue.clear()  # those messages lost too: the reaper sends the children
    clock.advance(SETTINGS.resend_window + 1)
    reaper = Reaper(
        store=mem.store,
        leases=mem.leases,
        settings=SETTINGS,
        in_flight=lambda _: 0,
        send=lambda run_id: broker.send(run_id, True),
    )
    assert reaper.reap() == 3
    broker.drain(mem)
    run = mem.store.get(parent)
    assert run is not None and run.status == RunStatus.DONE and run.state["total"] == 14


def test_cancelling_the_parent_cancels_its_children(mem: loop.Deps, broker: Broker) -> None:
    parent = _start(mem, "fanout", {"ns": [1, 2]})
    loop.run(parent, mem)
    assert mem.store.cancel(parent, "user asked") == RunStatus.CANCELLED
    for kid in mem.store.children(parent):
        assert (kid.status, kid.error) == (RunStatus.CANCELLED, "its parent was cancelled")
    broker.drain(mem)  # their messages find them stopped
    assert {k.status for k in mem.store.children(parent)} == {RunStatus.CANCELLED}


def test_a_workflow_that_spawns_itself_fails_at_the_depth_limit(
    mem: loop.Deps, broker: Broker
) -> None:
    parent = _start(mem, "recursive", {})
    loop.run(parent, mem)
    broker.drain(mem)
    chain = [parent]
    while kids := mem.store.children(chain[-1]):
        chain.append(kids[0].run_id)
    deepest = mem.store.get(chain[-1])
    assert len(chain) == SETTINGS.max_spawn_depth + 1
    assert deepest is not None and deepest.status == RunStatus.FAILED
    assert "CAIRN_MAX_SPAWN_DEPTH=3" in (deepest.error or "")
    # Its failure is each ancestor's child result: all of them end.
    assert all(mem.store.get(r).status == RunStatus.DONE for r in chain[:-1])  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("kids", "wait", "message"),
    [
        ([], "all", "1 to 10,000 children"),
        ([cairn.Child("square", {"n": 1})], 2, "1..1 children"),
        ([cairn.Child("square", {"n": 1})], "most", '"all", "any"'),
        ([cairn.Child("square", key="a"), cairn.Child("square", key="a")], "all", "same key"),
        ([cairn.Child("square", key="a b")], "all", "child key 'a b'"),
    ],
)
def test_a_bad_spawn_is_a_clear_error(kids: list[Any], wait: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cairn.StepResult.spawn(kids, cursor="total", wait=wait)


def test_a_child_of_an_unknown_workflow_fails_the_parent_and_spawns_nothing(
    mem: loop.Deps,
) -> None:
    from cairn.steps import StepResult, workflow

    bad = workflow("spawns_unknown")

    @bad.step()
    def go(ctx: cairn.Context) -> StepResult:
        return StepResult.spawn([cairn.Child("no_such_flow", {})], cursor="go")

    parent = _start(mem, "spawns_unknown", {})
    assert loop.run(parent, mem) == RunStatus.FAILED
    run = mem.store.get(parent)
    assert run is not None and "no_such_flow" in (run.error or "")
    assert mem.store.children(parent) == []


def test_cairn_events_cannot_be_signalled_by_hand() -> None:
    from cairn.core.inputs import check_event

    with pytest.raises(errors.InvalidInput, match="cairn's own"):
        check_event("cairn.children:3")
