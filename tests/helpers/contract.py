"""The contracts' methods as the contract tests read them (tests/contract)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


def contract_methods(protocol: type) -> dict[str, Callable[..., Any]]:
    """The protocol's methods, its bases' included (CheckpointStore is three audiences)."""
    found: dict[str, Callable[..., Any]] = {}
    for cls in reversed(protocol.__mro__):
        if cls in (object, Protocol) or not getattr(cls, "_is_protocol", False):
            continue
        found.update({n: v for n, v in vars(cls).items() if not n.startswith("_") and callable(v)})
    return found


def on_both(request: Any, model: Any = None) -> Any:
    """The loop's deps for a test parametrized ["memory", "pg"]: the in-memory twins on a
    manual clock, or the test's Postgres store and Redis leases."""
    from cairn.core.settings import Settings
    from cairn.testing import ManualClock, MemoryLeases, MemoryStore
    from cairn.workers import loop

    if request.param == "memory":
        clock = ManualClock()
        unused = Settings(
            database_url="postgresql://unused.invalid/x", redis_url="redis://unused.invalid/0"
        )
        return loop.Deps(
            settings=unused, store=MemoryStore(clock), leases=MemoryLeases(clock), model=model
        )
    return loop.Deps(
        settings=request.getfixturevalue("settings"),
        store=request.getfixturevalue("store"),
        leases=request.getfixturevalue("leases"),
        model=model,
    )
