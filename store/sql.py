"""Loads named SQL blocks from store/sql/queries.sql (procrastinate's layout).

A block starts with `-- name: <name>` followed by a description comment; the query
runs to the next block.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

_BLOCK = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _parse(text: str) -> dict[str, str]:
    parts = _BLOCK.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


def sql_text(name: str) -> str:
    return resources.files("cairn.store").joinpath("sql", name).read_text()


def without(query: str, *ctes: str) -> str:
    """query with the named CTEs (a `), name AS (` line up to the next line opening with
    `)`) cut out. Raises if one is missing, so a renamed CTE cannot go unnoticed."""
    lines = query.splitlines()
    for name in ctes:
        start = lines.index(f"), {name} AS (")  # ValueError: no such CTE
        end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith(")"))
        del lines[start:end]
    return "\n".join(lines)


QUERIES = _parse(sql_text("queries.sql"))
# A step that appends no window message and consumes no signal (most steps) saves without
# those two CTEs: Postgres opens their tables and indexes on every execution even when
# they write nothing, about a sixth of the statement's server time. Derived from `save`,
# so the guard and everything else stay written once.
QUERIES["save_plain"] = without(QUERIES["save"], "appended", "consumed")


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
