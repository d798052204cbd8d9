"""The chaos database: a fresh, migrated database whose checkpoint_history table records
every version of every checkpoint row (a trigger), and the check that none went backwards."""

from __future__ import annotations

from typing import Any

from cairn.core.status import RunStatus
from cairn.store import admin

HISTORY_SQL = """
CREATE TABLE checkpoint_history (
    id      bigserial PRIMARY KEY,
    run_id  text NOT NULL,
    kind    text NOT NULL,  -- create | save | claim | status
    seq     bigint NOT NULL,
    epoch   bigint NOT NULL,
    cursor  text NOT NULL,
    status  text NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX checkpoint_history_run ON checkpoint_history (run_id, id);

CREATE FUNCTION chaos_record_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO checkpoint_history (run_id, kind, seq, epoch, cursor, status)
    VALUES (
        NEW.run_id,
        CASE
            WHEN TG_OP = 'INSERT' THEN 'create'
            WHEN (NEW.seq, NEW.cursor, NEW.state, NEW.visits, NEW.win_start, NEW.win_end,
                  NEW.status, NEW.error, NEW.updated_at)
                 IS NOT DISTINCT FROM
                 (OLD.seq, OLD.cursor, OLD.state, OLD.visits, OLD.win_start, OLD.win_end,
                  OLD.status, OLD.error, OLD.updated_at) THEN 'claim'
            WHEN (NEW.seq, NEW.cursor, NEW.state, NEW.visits)
                 IS NOT DISTINCT FROM (OLD.seq, OLD.cursor, OLD.state, OLD.visits) THEN 'status'
            ELSE 'save'
        END,
        NEW.seq, NEW.epoch, NEW.cursor, NEW.status);
    RETURN NULL;
END $$;

CREATE TRIGGER chaos_history AFTER INSERT OR UPDATE ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION chaos_record_checkpoint();
"""


def create_database(base_url: str, name: str) -> str:
    """A fresh database next to base_url, migrated, with the checkpoint history trigger."""
    from cairn.store import upgrade

    url = admin.create_database(base_url, name)
    upgrade(url)
    admin.execute(url, HISTORY_SQL)
    return url


drop_database = admin.drop_database


def read_history(url: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The checkpoint_history rows (ordered by id, `at` in epoch seconds) and the runs'
    final checkpoints."""
    history = admin.execute(
        url,
        "SELECT id, run_id, kind, seq, epoch, cursor, status,"
        " extract(epoch FROM at)::float8 AS at FROM checkpoint_history ORDER BY id",
    )
    final = admin.execute(
        url,
        "SELECT run_id, status, cursor, seq, resumes, error, state->>'outcome' AS outcome"
        " FROM checkpoints",
    )
    return history, final


def read_journal_counts(url: str) -> dict[str, int]:
    """Journaled calls recorded, per call name (the model's calls are "model")."""
    rows = admin.execute(url, "SELECT name, count(*) AS n FROM journal GROUP BY name")
    return {r["name"]: int(r["n"]) for r in rows}


def check_history(rows: list[dict[str, Any]]) -> list[str]:
    """Rows of checkpoint_history ordered by id: where did a checkpoint go backwards?"""
    problems: list[str] = []
    last: dict[str, dict[str, Any]] = {}
    for row in rows:
        prev = last.get(row["run_id"])
        last[row["run_id"]] = row
        if prev is None:
            continue
        run = row["run_id"]
        if row["epoch"] < prev["epoch"]:
            problems.append(f"run {run}: epoch went back {prev['epoch']} -> {row['epoch']}")
        if row["seq"] < prev["seq"]:
            problems.append(f"run {run}: seq went back {prev['seq']} -> {row['seq']}")
        elif row["kind"] == "save" and row["seq"] <= prev["seq"]:
            problems.append(f"run {run}: a save did not advance seq ({row['seq']})")
        if prev["status"] == RunStatus.DONE and row["status"] != RunStatus.DONE:
            problems.append(f"run {run}: a done run became {row['status']}")
    return problems
