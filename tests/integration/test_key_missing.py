"""A worker that lacks the key a run's payload is sealed under (a key deploy under way):
found at the claim (the input, the state, the signal) or inside a step (a steer message a
ctx.messages() reads), the delivery ends with KeyMissing, an Interrupted the run task hands
back; the run is never failed, its failed attempts and its deliveries (what poison
counts) do not grow, and a worker with the key then finishes it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import cairn
import tests.helpers.steer_flows  # noqa: F401 (steered_chat: ctx.messages() each turn)
from cairn.client import Client
from cairn.core import sealing
from cairn.core.sealing import KeyMissing, KeyRing, new_key
from cairn.core.settings import Settings
from cairn.store import Leases, PgStore
from cairn.workers import loop

OLD = f"k1:{new_key()}"
NEW = f"k2:{new_key()},{OLD}"


@pytest.fixture
def ring() -> Iterator[Callable[[str], None]]:
    yield lambda spec: sealing.use(KeyRing(spec))
    sealing.use(None)


def _row(sql: Callable[..., list[tuple[Any, ...]]], run_id: str) -> tuple[Any, ...]:
    return sql(
        "SELECT status, deliveries, attempts, error FROM checkpoints WHERE run_id = %s", run_id
    )[0]


@pytest.mark.parametrize("where", ["in-a-step", "at-the-claim"])
def test_a_key_missing_hands_the_run_back_and_never_fails_or_poisons_it(
    where: str,
    settings: Settings,
    store: PgStore,
    leases: Leases,
    sql: Callable[..., list[tuple[Any, ...]]],
    ring: Callable[[str], None],
) -> None:
    # One delivery without a save is all poison allows: a hand-back must not count.
    deps = loop.Deps(
        settings=settings.with_options(max_deliveries=1), store=store, leases=leases, model=None
    )
    client = Client(settings=settings, store=store, send=lambda run_id, priority=0: None)
    ring(NEW if where == "at-the-claim" else OLD)  # the API seals the input
    run_id = client.enqueue("steered_chat", {"topic": "keys"})
    ring(NEW)
    client.steer(run_id, "stop")  # sealed under k2: the step's ctx.messages() reads it
    ring(OLD)  # the worker, not yet deployed
    for _ in range(3):
        with pytest.raises(KeyMissing) as got:
            loop.run(run_id, deps)
        assert got.value.key_id == "k2"
    assert _row(sql, run_id) == ("pending", 0, 0, None)  # not failed, nothing counted
    assert leases.holder(run_id) is None  # let go: a worker with the key takes it at once
    ring(NEW)  # a deployed worker
    assert loop.run(run_id, deps) == cairn.RunStatus.DONE
    run = client.get(run_id)
    assert run is not None and run.state == {"got": [["stop"]]}
