"""How every value goes into a jsonb column: the store's one sealing path.

A payload (anything a user or a model gave: an input, a state, a message, a result, an
error's or a cancel's text) is a `Payload`, whose JSON text is cairn.core.sealing.dumps:
sealed when CAIRN_PAYLOAD_KEYS holds a key, else with envelope-shaped objects escaped.
What cairn's SQL must read (visits, a steer read's message numbers, LangGraph's metadata)
is `Clear`: escaped, never sealed. psycopg's Jsonb dumper writes both (it calls the
wrapper's own dumps), so a plain Jsonb, or a bare str for an error column, is the one
way around: tests/integration/test_sealed_columns.py finds what went around it in any
column, and tests/unit/test_payloads.py finds a Jsonb built anywhere in the store.

The connections' loader (store/db.py: opening) reads both back as they were given.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg.types.json import Jsonb

from cairn.core import sealing


class Payload(Jsonb):
    """A payload on its way to a jsonb column: sealed, or escaped without keys."""

    __slots__ = ()

    def __init__(self, obj: Any) -> None:
        super().__init__(obj, sealing.dumps)


class Clear(Jsonb):
    """JSON cairn's SQL reads, on its way to a jsonb column: escaped, never sealed."""

    __slots__ = ()

    def __init__(self, obj: Any) -> None:
        super().__init__(obj, sealing.clear_dumps)


def text(value: str | None) -> Payload | None:
    """An error's or a reason's text (NULL stays NULL)."""
    return None if value is None else Payload(value)


def each(values: Iterable[Any]) -> list[Payload]:
    """A jsonb[] parameter whose every element is a payload (unnested by the SQL)."""
    return [Payload(v) for v in values]
