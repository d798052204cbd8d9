"""Step history and the journal partitioned by their run's month (migration 0018): a run's
rows stay in its month's partition however long it lives, its keys and the journal's
fence hold there, and retention drops a month whole once its last run is swept."""

from __future__ import annotations

import dataclasses

from cairn.core.records import Attempt, Call
from cairn.store import Checkpoint, PgStore


def _run_of(store: PgStore, sql, run_id: str, months_ago: int) -> Checkpoint:
    """A claimed run created months_ago months back (its run's and checkpoint's time)."""
    assert store.create_run(run_id, "probe", {}, "one")
    sql(
        "UPDATE runs SET created_at = now() - make_interval(months => %s) WHERE run_id = %s",
        months_ago,
        run_id,
    )
    sql(
        "UPDATE checkpoints c SET created_at = r.created_at FROM runs r"
        " WHERE r.run_id = c.run_id AND c.run_id = %s",
        run_id,
    )
    cp = store.claim(run_id, 1)
    assert cp is not None
    return cp


def _step(store: PgStore, cp: Checkpoint, status: str = "running") -> Checkpoint:
    nxt = dataclasses.replace(cp, seq=cp.seq + 1, status=status, cursor="two")
    store.save(nxt, cp, attempt=Attempt(started=0.0, worker="w"))
    return nxt


def _where(sql, table: str, run_id: str) -> list[str]:
    rows = sql(f"SELECT DISTINCT tableoid::regclass::text FROM {table} WHERE run_id = %s", run_id)
    return sorted(r[0] for r in rows)


def _month(sql, months_ago: int) -> str:
    ((name,),) = sql(
        "SELECT to_char(date_trunc('month', now() - make_interval(months => %s), 'UTC')"
        " AT TIME ZONE 'UTC', 'YYYY_MM')",
        months_ago,
    )
    return str(name)


def test_a_runs_rows_stay_in_its_months_partition_and_the_fence_holds_there(
    store: PgStore, sql
) -> None:
    sql("SELECT cairn_partitions(now() - interval '2 months', 3)")
    cp = _run_of(store, sql, "old", months_ago=2)
    # Written now, a month or two after the run began: still in the run's month.
    assert store.record_call(cp, 0, Call(pos=0, name="tool", result={"n": 1}))
    # The same call again from the same writer is its own row back; from a fenced
    # writer (an older epoch after a claim) nothing.
    assert store.record_call(cp, 0, Call(pos=0, name="tool", result={"n": 1}))
    assert store.claim("old", 2)
    assert store.record_call(cp, 0, Call(pos=0, name="tool", result={"n": 2})) is None
    now = dataclasses.replace(cp, epoch=2)
    _step(store, now)
    month = _month(sql, 2)
    assert _where(sql, "journal", "old") == [f"journal_{month}"]
    assert _where(sql, "step_history", "old") == [f"step_history_{month}"]
    assert sql("SELECT count(*) FROM journal WHERE run_id = 'old'") == [(1,)]
    assert [c.result for c in store.journal("old", "one", 0)] == [{"n": 1}]
    assert [h["cursor"] for h in store.history("old")] == ["one"]


def test_a_month_without_a_partition_goes_to_the_default_and_is_swept_by_rows(
    store: PgStore, sql
) -> None:
    cp = _run_of(store, sql, "ancient", months_ago=60)
    assert store.record_call(cp, 0, Call(pos=0, name="tool", result=1))
    _step(store, cp, status="done")
    assert _where(sql, "step_history", "ancient") == ["step_history_default"]
    assert _where(sql, "journal", "ancient") == ["journal_default"]
    sql("UPDATE checkpoints SET updated_at = now() - interval '8 days'")
    assert store.sweep(older_than=7 * 86400) == 1
    assert sql("SELECT count(*) FROM step_history_default") == [(0,)]
    assert sql("SELECT count(*) FROM journal_default") == [(0,)]


def test_retention_drops_a_month_whole_once_its_last_run_is_swept(store: PgStore, sql) -> None:
    sql("SELECT cairn_partitions(now() - interval '3 months', 3)")
    two, three = _month(sql, 2), _month(sql, 3)
    done = [_step(store, _run_of(store, sql, f"d{i}", months_ago=3), "done") for i in range(3)]
    live = _step(store, _run_of(store, sql, "live", months_ago=2))
    gone2 = _step(store, _run_of(store, sql, "d-two", months_ago=2), "done")
    fresh = _step(store, _run_of(store, sql, "fresh", months_ago=0), "done")
    sql("UPDATE checkpoints SET updated_at = now() - interval '8 days'")

    assert store.sweep(older_than=7 * 86400) == len(done) + 2  # all but the live one
    tables = {r[0] for r in sql("SELECT relname::text FROM pg_class WHERE relkind = 'r'")}
    # Three months back: every run swept, so the month went whole.
    assert f"step_history_{three}" not in tables and f"journal_{three}" not in tables
    # Two months back: a run still lives there, so the month stays, the swept run's rows
    # in it waiting for the drop; this month's swept run went row by row.
    assert f"step_history_{two}" in tables
    assert _where(sql, "step_history", gone2.run_id) == [f"step_history_{two}"]
    assert _where(sql, "step_history", live.run_id) == [f"step_history_{two}"]
    assert _where(sql, "step_history", fresh.run_id) == []
    # Made ahead: this month and the next three.
    for ahead in range(4):
        assert f"journal_{_month(sql, -ahead)}" in tables

    sql("UPDATE checkpoints SET status = 'done', updated_at = now() - interval '8 days'")
    assert store.sweep(older_than=7 * 86400) == 1
    tables = {r[0] for r in sql("SELECT relname::text FROM pg_class WHERE relkind = 'r'")}
    assert f"step_history_{two}" not in tables
    assert sql("SELECT count(*) FROM step_history") == [(0,)]


def test_the_retention_bench_sweeps_both_ways() -> None:
    # Keeps `python -m bench.retention` alive (no timing asserted): each way sweeps every
    # run and leaves no history behind, or sweep_once raises.
    from bench.common import Databases
    from bench.retention import sweep_once
    from tests.helpers.services import BASE_DB

    dbs = Databases(BASE_DB)
    try:
        for months in (0, 3):
            got = sweep_once(dbs, runs=30, steps=2, calls=2, months=months)
            assert got["wal_bytes"] > 0 and got["seconds"] > 0, got
    finally:
        dbs.close()
