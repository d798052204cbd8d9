"""Counts by status (migration 0003): exact against a real GROUP BY through every kind of
transition, under concurrent writers, folders and retention, in one snapshot at any
moment; no status row that serializes transitions; backfilled by `cairn db upgrade`. Under
a real fleet: tests/fleet/test_counts.py."""

from __future__ import annotations

import dataclasses
import itertools
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from cairn.store import Checkpoint, Database, PgStore, upgrade
from cairn.store.rows import FOLD_AT
from cairn.store.sql import migrations
from tests.helpers.counts import consistent, store_counts, true_counts
from tests.helpers.services import BASE_DB, with_db


def _step(store: PgStore, cp: Checkpoint, **changes: Any) -> Checkpoint:
    nxt = dataclasses.replace(cp, seq=cp.seq + 1, **changes)
    store.save(nxt, cp)
    return nxt


def test_every_transition_is_counted(store: PgStore, sql) -> None:
    """Each statement that moves a status, checked against GROUP BY after it: a path that
    forgot to count (or counted twice) shows here."""

    def check() -> None:
        assert store_counts(store) == true_counts(sql)

    def new(run_id: str) -> Checkpoint:
        store.create_run(run_id, "probe", {"x": 1}, "one")
        check()
        cp = store.load(run_id)
        assert cp is not None
        return cp

    done = _step(store, new("done"), status="running")
    check()
    _step(store, done, status="done", cursor="done")
    check()
    failed = _step(store, new("failed"), status="running")
    store.end_attempt(failed, "failed", "boom", retry_in=None)
    check()
    store.create_run("failed", "probe", {"x": 1})  # enqueued again: re-armed to pending
    assert store.get("failed").status == "pending"  # type: ignore[union-attr]
    check()
    store.cancel(new("cancelled-pending").run_id, "no")
    check()
    waiting = _step(store, new("waiting"), status="running")
    _step(store, waiting, status="waiting")
    check()
    store.cancel("waiting", "no")
    check()
    over = _step(store, new("over"), status="running")
    store.end_attempt(over, "budget_exceeded", "spent")
    check()
    assert store.mark_unreadable(new("unreadable").run_id, "incompatible", "v9")
    check()
    retry = _step(store, new("retry"), status="running")
    store.end_attempt(retry, "running", "later", retry_in=5.0)  # no status change
    check()
    store.save(dataclasses.replace(retry, seq=retry.seq + 1), retry)  # a step, same status
    check()
    sql("UPDATE checkpoints SET status = 'failed' WHERE run_id = 'retry'")  # by hand
    check()
    assert store.fold_counts() > 0
    check()
    assert sql("SELECT count(*) FROM run_count_deltas") == [(0,)]
    assert store.sweep(older_than=0, batch=2) == 5  # done, 2 cancelled, over, retry
    check()
    assert store_counts(store) == {"pending": 1, "incompatible": 1}
    sql("TRUNCATE runs CASCADE")
    assert store_counts(store) == {}


def test_a_wake_pass_counts_its_batch_in_one_row_per_status(store: PgStore, sql) -> None:
    """The wake pass (and a debounced run it wakes) counts its own moves, two delta rows a
    batch instead of two a run; the same move made any other way is the trigger's still."""
    for n in range(6):
        store.create_run(f"s{n}", "probe", {"x": n}, "one")
    sql("UPDATE checkpoints SET status = 'waiting', wait_until = now() - interval '1 s'")
    store.debounce("d1", "probe", {"x": 9}, "k", 0.001)
    time.sleep(0.01)
    assert store.fold_counts() > 0
    assert store.wake(batch=4) and store_counts(store) == true_counts(sql)
    assert sql("SELECT status, n FROM run_count_deltas ORDER BY status") == [
        ("pending", 4),
        ("waiting", -4),
    ]
    assert len(store.wake()) == 3 and store.wake() == []
    assert store_counts(store) == true_counts(sql) == {"pending": 7}
    assert sql("SELECT count(*) FROM run_count_deltas") == [(4,)]
    # Outside a wake pass the trigger counts the same move, row by row.
    sql("UPDATE checkpoints SET status = 'waiting' WHERE run_id IN ('s0', 's1')")
    sql("UPDATE checkpoints SET status = 'pending' WHERE run_id IN ('s0', 's1')")
    assert store_counts(store) == true_counts(sql) == {"pending": 7}


def test_a_reader_folds_a_long_tail_of_deltas(store: PgStore, sql) -> None:
    store.create_run("r", "probe", {}, "one")
    # As if no reaper had run for thousands of transitions (pairs that cancel out).
    half = FOLD_AT // 2 + 1
    sql(
        "INSERT INTO run_count_deltas SELECT 'pending', n FROM generate_series(1, %s),"
        " (VALUES (1), (-1)) AS v (n)",
        half,
    )
    assert store_counts(store) == {"pending": 1}
    assert sql("SELECT count(*) FROM run_count_deltas") == [(0,)]
    assert store_counts(store) == {"pending": 1}


def test_status_changes_of_two_runs_do_not_wait_for_each_other(store: PgStore, settings) -> None:
    """The design's point: no row every transition to a status must lock. A per-status
    counter row would hold the second commit until the first transaction ends."""
    for run_id in ("a", "b"):
        store.create_run(run_id, "probe", {}, "one")
    with (
        psycopg.connect(settings.database_url) as first,
        psycopg.connect(settings.database_url) as second,
    ):
        first.execute("UPDATE checkpoints SET status = 'done' WHERE run_id = 'a'")  # open
        second.execute("SET lock_timeout = '1s'")
        second.execute("UPDATE checkpoints SET status = 'done' WHERE run_id = 'b'")
        second.commit()
        first.commit()
    assert store_counts(store) == {"done": 2}


def test_counts_stay_exact_under_concurrent_transitions_folds_and_retention(settings, sql) -> None:
    """Eight writers drive runs through every transition while two folders, a retention
    sweeper and a reader run: every snapshot the reader takes agrees with GROUP BY."""
    stop = threading.Event()
    errors: list[BaseException] = []
    snapshots: list[int] = []
    transitions = [0]
    paths: set[str] = set()

    def guarded(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 (raised again by the test's thread)
                errors.append(exc)
                stop.set()

        return run

    def writer(w: int) -> None:
        rnd = random.Random(w)
        db = Database(settings.database_url, max_size=1, give_up_after=10.0)
        store = PgStore(db)
        try:
            k = 0
            while not stop.is_set():
                run_id = f"w{w}-{k}"
                k += 1
                store.create_run(run_id, "probe", {"k": k}, "one")
                cp = store.load(run_id)
                assert cp is not None
                path = rnd.choice(("done", "failed", "cancel", "wait", "rearm", "stay"))
                paths.add(path)
                if path == "cancel":
                    store.cancel(run_id, "no")
                    continue
                cp = _step(store, cp, status="running")
                if path == "done":
                    _step(store, cp, status="done", cursor="done")
                elif path == "wait":
                    _step(store, cp, status="waiting")
                    store.cancel(run_id, "no")
                elif path in ("failed", "rearm"):
                    store.end_attempt(cp, "failed", "boom")
                    if path == "rearm":  # swept meanwhile or not, it is pending again
                        store.create_run(run_id, "probe", {"k": k}, "one")
                transitions[0] += 1
        finally:
            db.close()

    def folder() -> None:
        db = Database(settings.database_url, max_size=1, give_up_after=10.0)
        try:
            # One fold statement at a time, small ones too, so partial folds race each
            # other and the reader.
            for batch in itertools.cycle((1, 7, 50, 200)):
                if stop.is_set():
                    break
                db.one("fold_counts", {"batch": batch})
                time.sleep(0.01)
        finally:
            db.close()

    def sweeper() -> None:
        db = Database(settings.database_url, max_size=1, give_up_after=10.0)
        try:
            while not stop.is_set():
                PgStore(db).sweep(older_than=0, batch=25)
                time.sleep(0.05)
        finally:
            db.close()

    def reader() -> None:
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            while not stop.is_set():
                counted, truth = consistent(conn)
                assert counted == truth, (counted, truth)
                snapshots.append(sum(truth.values()))

    threads = [threading.Thread(target=guarded(lambda w=w: writer(w))) for w in range(8)]
    threads += [threading.Thread(target=guarded(folder)) for _ in range(2)]
    threads += [threading.Thread(target=guarded(sweeper)), threading.Thread(target=guarded(reader))]
    for t in threads:
        t.start()
    stop.wait(6.0)
    stop.set()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    assert transitions[0] > 200 and len(snapshots) > 20, (transitions, len(snapshots))
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        counted, truth = consistent(conn)
    assert counted == truth == true_counts(sql)
    # The mix really happened (the sweeper removes finished runs at once, so the final
    # counts need not show every status: the paths taken say it).
    assert paths == {"done", "failed", "cancel", "wait", "rearm", "stay"}, paths
    assert "pending" in truth


def test_upgrade_backfills_the_counts_of_an_existing_database(template_db: str, sql) -> None:
    """A database at migration 2 with runs in it: `cairn db upgrade` counts them, and
    transitions after it are counted on top."""
    name = f"counts_upgrade_{random.randrange(10**9)}"
    with psycopg.connect(BASE_DB, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    url = with_db(BASE_DB, name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE cairn_migrations (version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for version, mig, text in migrations():
                if version < 3:
                    conn.execute(text)
                    conn.execute("INSERT INTO cairn_migrations VALUES (%s, %s)", (version, mig))
            conn.execute(
                "INSERT INTO runs (run_id, workflow, input) SELECT 'r' || g, 'probe', '{}'"
                " FROM generate_series(1, 300) g"
            )
            conn.execute(
                "INSERT INTO checkpoints (run_id, seq, cursor, state, version, status)"
                " SELECT 'r' || g, 0, 'one', '{}', 1,"
                " (ARRAY['pending', 'running', 'done', 'failed'])[g % 4 + 1]"
                " FROM generate_series(1, 300) g"
            )
        assert 3 in upgrade(url)
        db = Database(url)
        store = PgStore(db)
        try:
            assert store_counts(store) == {"pending": 75, "running": 75, "done": 75, "failed": 75}
            store.cancel("r4", "no")  # r4 was pending
            assert store.sweep(older_than=0, batch=1000) == 151
            assert store_counts(store) == {"pending": 74, "running": 75}
        finally:
            db.close()
    finally:
        with psycopg.connect(BASE_DB, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
