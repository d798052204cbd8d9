"""The database agrees with the code where both name the same facts."""

from __future__ import annotations

import difflib
import glob
import os
import re
import shutil
import subprocess

import psycopg

from cairn.core.status import RunStatus
from cairn.store import upgrade
from cairn.store.sql import sql_text
from tests.helpers.services import BASE_DB


def test_the_status_check_constraint_lists_exactly_the_run_statuses(sql) -> None:
    ((definition,),) = sql(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conname = 'checkpoints_status_check'"
    )
    assert set(re.findall(r"'(\w+)'::text", definition)) == {s.value for s in RunStatus}


def _dump(url: str) -> list[str]:
    """The schema-only dump of the database at url, minus what varies between dumps."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_dump")) or [shutil.which("pg_dump")]
    out = subprocess.run(
        [found[-1], "--schema-only", "--no-owner", "--no-privileges",
         "--exclude-table=cairn_migrations", url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    # \restrict carries a random key per dump; comments and SET lines say nothing of ours.
    skip = ("--", "SET ", "SELECT pg_catalog.set_config", "\\restrict", "\\unrestrict")
    return [line for line in out.splitlines() if line.strip() and not line.startswith(skip)]


def test_schema_sql_is_what_the_migrations_build() -> None:
    names = [f"cairn_schema_{os.getpid()}_{kind}" for kind in ("migrated", "fresh")]
    with psycopg.connect(BASE_DB, autocommit=True) as conn:
        for name in names:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {name}")
    migrated, fresh = (BASE_DB.rsplit("/", 1)[0] + "/" + name for name in names)
    try:
        upgrade(migrated)
        with psycopg.connect(fresh, autocommit=True) as conn:
            conn.execute(sql_text("schema.sql"))
        a, b = _dump(migrated), _dump(fresh)
        diff = "\n".join(difflib.unified_diff(a, b, "migrations", "schema.sql", lineterm=""))
        assert a == b, f"store/sql/schema.sql differs from the migrations:\n{diff}"
    finally:
        with psycopg.connect(BASE_DB, autocommit=True) as conn:
            for name in names:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
