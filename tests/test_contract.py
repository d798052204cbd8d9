"""PgStore and the Redis leases implement the contract the loop is typed against, method
for method and parameter for parameter (a method added to one and not the other fails)."""

from __future__ import annotations

import inspect

import pytest

from cairn.store import Lease, Leases, PgStore
from cairn.store.contract import CheckpointStore, HeldLease, LeaseManager


def _methods(protocol: type) -> list[str]:
    return [n for n, v in vars(protocol).items() if not n.startswith("_") and callable(v)]


def _params(fn: object) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("protocol", "impl"),
    [(CheckpointStore, PgStore), (LeaseManager, Leases), (HeldLease, Lease)],
)
def test_the_implementation_has_every_method_of_the_contract(protocol: type, impl: type) -> None:
    for name in _methods(protocol):
        wanted = _params(getattr(protocol, name))
        found = _params(getattr(impl, name))
        assert found[: len(wanted)] == wanted, f"{impl.__name__}.{name}{found} vs {wanted}"


def test_the_contract_names_what_the_loop_calls_on_the_store() -> None:
    assert {"claim", "save", "end_attempt", "mark_unreadable", "outage"} <= set(
        _methods(CheckpointStore)
    )
