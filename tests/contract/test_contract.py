"""PgStore, ScheduleStore and the Redis leases implement the contract the loop, the reaper
and the Client are typed against, method for method and parameter for parameter, async
where the contract is (a method added to one and not the other fails). The contract is
split by audience (store/contract.py); CheckpointStore is all of the run store's."""

from __future__ import annotations

import inspect

import pytest

from cairn.store import Lease, Leases, PgStore
from cairn.store.approvals import ApprovalStore
from cairn.store.contract import (
    AdminStore,
    Approvals,
    CheckpointStore,
    HeldLease,
    LeaseManager,
    Maintenance,
    RunStore,
    Schedules,
)
from cairn.store.schedules import ScheduleStore
from tests.helpers.contract import contract_methods


def _params(fn: object) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("protocol", "impl"),
    [
        (CheckpointStore, PgStore),
        (Schedules, ScheduleStore),
        (Approvals, ApprovalStore),
        (LeaseManager, Leases),
        (HeldLease, Lease),
    ],
)
def test_the_implementation_has_every_method_of_the_contract(protocol: type, impl: type) -> None:
    for name, fn in contract_methods(protocol).items():
        wanted = _params(fn)
        found = _params(getattr(impl, name))
        assert found[: len(wanted)] == wanted, f"{impl.__name__}.{name}{found} vs {wanted}"
        both = inspect.iscoroutinefunction(fn), inspect.iscoroutinefunction(getattr(impl, name))
        assert both[0] == both[1], f"{impl.__name__}.{name}: async in one, not the other"


def test_the_contract_is_split_by_audience_and_covers_every_operation() -> None:
    loop = set(contract_methods(RunStore))
    admin = set(contract_methods(AdminStore))
    upkeep = set(contract_methods(Maintenance))
    assert {"claim", "save", "end_attempt", "mark_unreadable", "outage", "journal"} <= loop
    assert {"fork", "rewind", "replay", "forks", "wait", "wait_async", "resolve"} <= admin
    assert {"open_intents", "calls", "list_runs", "load_row", "schedule_store"} <= admin
    assert {"stalled", "unclaimed", "unchanged", "sweep", "fold_counts"} <= upkeep
    assert not (loop & admin or loop & upkeep or admin & upkeep)  # each spelled once
    assert set(contract_methods(CheckpointStore)) == loop | admin | upkeep
