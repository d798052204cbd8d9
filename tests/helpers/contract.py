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
