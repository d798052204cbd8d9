"""Loads named SQL blocks from store/sql/queries.sql (procrastinate's layout).

A block starts with `-- name: <name>` followed by a description comment; the query
runs to the next block. A `-- fragment: <name>` block is no query: named queries include
it where they say `{{name}}`, so a shared part (the guarded upsert, a column list) is
written once.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

_BLOCK = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"\{\{(\w+)\}\}")


def _parse(text: str) -> dict[str, str]:
    parts = _BLOCK.split(text)
    blocks: dict[str, dict[str, str]] = {"name": {}, "fragment": {}}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        blocks[kind][name] = "\n".join(lines).strip().rstrip(";")
    fragments = blocks["fragment"]

    def include(match: re.Match[str]) -> str:
        try:
            return _INCLUDE.sub(include, fragments[match.group(1)])  # a fragment may include
        except KeyError:
            raise ValueError(f"queries.sql: no fragment {match.group(1)!r}") from None

    return {name: _INCLUDE.sub(include, query) for name, query in blocks["name"].items()}


def sql_text(name: str) -> str:
    return resources.files("cairn.store").joinpath("sql", name).read_text()


QUERIES = _parse(sql_text("queries.sql"))


def migrations(directory: Any = None) -> list[tuple[int, str, str]]:
    """(version, name, sql) for every numbered migration (NNNN_name.sql), in order: cairn's
    own, or those in directory (the user's, for the tables their steps write)."""
    found = []
    where = directory or resources.files("cairn.store").joinpath("sql", "migrations")
    for entry in where.iterdir():
        m = re.match(r"^(\d{4})_(\w+)\.sql$", entry.name)
        if m:
            found.append((int(m.group(1)), m.group(2), entry.read_text()))
    return sorted(found)
