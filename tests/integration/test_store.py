"""The checkpoint store against a real Postgres: the guard, versions, the window."""

from __future__ import annotations

import dataclasses
import threading
import time
from types import SimpleNamespace

import psycopg
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from cairn.core.errors import CorruptCheckpoint, IncompatibleCheckpoint, RunIdConflict, StaleWrite
from cairn.core.records import Call, RunFilter
from cairn.core.status import STOPPED, RunStatus
from cairn.steps.registry import DONE
from cairn.store import CHECKPOINT_VERSION, Checkpoint, PgStore
from cairn.store.db import Database
from tests.helpers.runs import wait_for


def _run(store: PgStore, run_id: str = "r1") -> Checkpoint:
    store.create_run(run_id, "probe", {"x": 1}, "one")
    cp = store.load(run_id)
    assert cp is not None
    return cp


def _advance(cp: Checkpoint, **changes: object) -> Checkpoint:
    return dataclasses.replace(cp, seq=cp.seq + 1, status="running", **changes)


def test_create_is_idempotent_and_never_restarts(store: PgStore) -> None:
    cp = _run(store)
    nxt = _advance(cp, cursor="two", state={"a": 1})
    store.save(nxt, cp)
    assert store.create_run("r1", "probe", {"x": 1}, "one") is False
    with pytest.raises(RunIdConflict, match="another input"):
        store.create_run("r1", "probe", {"x": 2})
    with pytest.raises(RunIdConflict, match="another workflow"):
        store.create_run("r1", "other", {"x": 1})
    again = store.load("r1")
    assert again is not None and (again.seq, again.cursor, again.input) == (1, "two", {"x": 1})


def test_older_writer_is_rejected_and_row_not_rewound(store: PgStore, sql) -> None:
    cp = _run(store)
    a = _advance(cp, cursor="two", state={"by": "a"})
    b = _advance(a, cursor="three", state={"by": "b"})
    store.save(a, cp)
    store.save(b, a)
    with pytest.raises(StaleWrite):
        store.save(a, cp)  # the older writer replays its seq-1 save
    now = store.load("r1")
    assert now is not None and (now.seq, now.cursor, now.state) == (2, "three", {"by": "b"})
    assert sql("SELECT count(*) FROM window_messages")[0][0] == 0


def test_fenced_epoch_cannot_save_even_with_a_higher_seq(store: PgStore) -> None:
    cp = _run(store)
    zombie = _advance(cp, epoch=1)
    store.save(zombie, cp)
    assert store.claim("r1", 2)  # a new owner fences the run at epoch 2
    with pytest.raises(StaleWrite):
        store.save(_advance(zombie, cursor="evil"), zombie)
    assert store.load("r1").cursor == "one"  # type: ignore[union-attr]
    assert not store.claim("r1", 2), "claim must not go back or sideways"


@pytest.mark.parametrize("status", sorted(STOPPED))
def test_a_claim_leaves_a_stopped_run_as_it_is(store: PgStore, sql, status: str) -> None:
    # The worker claims before it reads: a finished run delivered again must not look
    # alive (updated_at) or count a delivery.
    _run(store)
    sql("UPDATE checkpoints SET status = %s, updated_at = now() - interval '1 hour'", status)
    before = store.load("r1")
    assert store.claim("r1", 5) is None
    assert store.load("r1") == before
    assert sql("SELECT deliveries FROM checkpoints")[0][0] == 0


def test_the_steps_own_writes_commit_with_the_save_and_roll_back_with_a_rejection(
    store: PgStore, sql
) -> None:
    cp = _run(store)
    for epoch, key in ((1, "kept"), (0, "fenced")):  # the second writer's epoch is stale
        tx = store.transaction()
        tx.connection.execute(
            "INSERT INTO invoice_ledger (idempotency_key, run_id, customer, amount_cents)"
            " VALUES (%s, 'r1', 'c', 1)",
            (key,),
        )
        try:
            if key == "fenced":
                with pytest.raises(StaleWrite):
                    store.save(dataclasses.replace(cp, seq=5, epoch=epoch), cp, tx)
            else:
                store.save(_advance(cp, epoch=epoch), cp, tx)
        finally:
            tx.close()
    assert sql("SELECT idempotency_key FROM invoice_ledger") == [("kept",)]


def test_rejected_save_writes_no_window_messages(store: PgStore, sql) -> None:
    cp = _run(store)
    first = _advance(cp, window=({"role": "user", "content": "hi"},))
    store.save(first, cp)
    stale = _advance(cp, window=({"role": "user", "content": "zombie"},))
    with pytest.raises(StaleWrite):
        store.save(stale, cp)
    assert sql("SELECT message->>'content' FROM window_messages") == [("hi",)]


def test_incompatible_version_refused_loudly(store: PgStore, sql) -> None:
    _run(store)
    sql("UPDATE checkpoints SET version = 99")
    with pytest.raises(IncompatibleCheckpoint) as info:
        store.load("r1")
    assert (info.value.found, info.value.expected) == (99, CHECKPOINT_VERSION)


def test_corrupt_shape_refused(store: PgStore, sql) -> None:
    _run(store)
    sql("""UPDATE checkpoints SET state = '"not an object"'""")
    with pytest.raises(CorruptCheckpoint, match="state"):
        store.load("r1")


def test_window_saves_only_new_messages_and_loads_exactly(store: PgStore, sql) -> None:
    cp = _run(store)
    window: list[dict] = []
    for i in range(30):
        window = [*window, {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"}]
        nxt = _advance(cp, window=tuple(window))
        store.save(nxt, cp)
        cp = nxt
    assert store.load("r1").window == tuple(window)  # type: ignore[union-attr]
    # Append-only: 30 rows, each written once (xmin differs per save, no row rewritten).
    rows = sql("SELECT count(*), count(DISTINCT xmin::text) FROM window_messages")
    assert rows == [(30, 30)]


def test_rewritten_window_is_a_fresh_range(store: PgStore, sql) -> None:
    cp = _run(store)
    long = tuple({"role": "user", "content": f"m{i}"} for i in range(5))
    a = _advance(cp, window=long)
    store.save(a, cp)
    compacted = ({"role": "user", "content": "summary"}, long[-1])
    b = _advance(a, window=compacted, win_start=a.win_end)
    store.save(b, a)
    loaded = store.load("r1")
    assert loaded is not None and loaded.window == compacted and loaded.win_start == 5


def test_ledger(store: PgStore) -> None:
    cp = _run(store)
    assert store.was_done("k") == (False, None)
    assert store.mark_done(cp, "k", {"id": 7})
    assert store.mark_done(cp, "k", {"id": 8})  # first write wins
    assert store.was_done("k") == (True, {"id": 7})


@hsettings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.tuples(st.sampled_from("ab"), st.integers(1, 6), st.integers(0, 3)), max_size=12)
)
def test_any_interleaving_leaves_the_newest_accepted_write(store: PgStore, sql, writes) -> None:
    sql("TRUNCATE runs CASCADE")
    base = _run(store)
    accepted = base
    for writer, seq, epoch in writes:
        cp = dataclasses.replace(base, seq=seq, epoch=epoch, cursor=f"{writer}{seq}.{epoch}")
        try:
            store.save(cp, base)
            assert seq > accepted.seq and epoch >= accepted.epoch
            accepted = cp
        except StaleWrite:
            assert not (seq > accepted.seq and epoch >= accepted.epoch)
    now = store.load("r1")
    assert now is not None and (now.seq, now.epoch, now.cursor) == (
        accepted.seq,
        accepted.epoch,
        accepted.cursor,
    )


def test_the_reapers_second_look_drops_runs_a_worker_touched_since_it_listed_them(
    store: PgStore, sql
) -> None:
    """The reaper lists runs, then checks their leases: a run taken, run and released in
    between has no lease either. Only runs as they were listed may be sent again."""
    for run_id in ("idle", "claimed", "finished", "taken"):
        _run(store, run_id)
    sql(
        "UPDATE checkpoints SET updated_at = now() - interval '1 minute',"
        " created_at = now() - interval '1 minute'"
    )
    cp = store.claim("claimed", 1)
    assert cp is not None
    store.save(_advance(cp, cursor="two"), cp)  # claimed and saved: stalled again later
    finished = store.claim("finished", 1)
    sql("UPDATE checkpoints SET updated_at = now() - interval '1 minute'")
    listed, _ = store.stalled(running_after=1)
    # Never-taken runs are the broker's: counted (unclaimed), never walked.
    assert {r["run_id"] for r in listed} == {"claimed", "finished"}
    unclaimed = store.unclaimed(older_than=30)
    assert [r["run_id"] for r in unclaimed] == ["idle", "taken"]
    assert store.unclaimed_count(older_than=30, upto=100) == 2
    # Meanwhile a worker ends one run and takes another (a claim is a sign of life).
    store.save(dataclasses.replace(_advance(finished, cursor=DONE), status="done"), finished)
    assert store.claim("taken", 1) is not None
    assert "taken" not in {r["run_id"] for r in store.stalled(running_after=1)[0]}
    assert store.unchanged(listed) == {"claimed"}
    assert store.unchanged(unclaimed) == {"idle"}
    assert store.unchanged([]) == set()


def test_sweep_removes_only_old_terminal_runs(store: PgStore, sql) -> None:
    for run_id, status in (
        ("old-done", "done"),
        ("old-failed", "failed"),
        ("old-running", "running"),
        ("new-done", "done"),
    ):
        cp = _run(store, run_id)
        assert store.mark_done(cp, f"k-{run_id}", None)
        store.save(
            dataclasses.replace(
                cp, seq=1, status=status, window=({"role": "user", "content": "m"},)
            ),
            cp,
        )
    sql("UPDATE checkpoints SET updated_at = now() - interval '8 days' WHERE run_id LIKE 'old-%'")
    seen: list[int] = []
    assert store.sweep(older_than=7 * 24 * 3600, batch=1, progress=seen.append) == 2
    assert seen == [1, 2]  # one run per transaction, progress after each
    assert sorted(r.run_id for r in store.list_runs()) == ["new-done", "old-running"]
    assert sorted(r[0] for r in sql("SELECT run_id FROM window_messages")) == [
        "new-done",
        "old-running",
    ]
    assert sorted(r[0] for r in sql("SELECT run_id FROM effects")) == ["new-done", "old-running"]


def test_plain_and_full_saves_interleave_and_record_every_step(store: PgStore, sql) -> None:
    # A step that appends nothing and consumes no signal saves with save_plain (save
    # without those two CTEs); the others with the full save. Mixed, they must keep one
    # history row per step and every message written once.
    cp = _run(store)
    window: tuple[dict, ...] = ()
    for i in range(6):
        if i % 2:
            window = (*window, {"role": "user", "content": f"m{i}"})
        nxt = _advance(cp, window=window, state={"i": i})
        store.save(nxt, cp)
        cp = nxt
    assert sql("SELECT count(*), min(seq), max(seq) FROM step_history") == [(6, 0, 5)]
    assert sql("SELECT idx, message->>'content' FROM window_messages ORDER BY idx") == [
        (0, "m1"),
        (1, "m3"),
        (2, "m5"),
    ]
    loaded = store.load("r1")
    assert loaded is not None and loaded.window == window and loaded.state == {"i": 5}
    with pytest.raises(StaleWrite):  # the plain save is guarded as the full one is
        store.save(dataclasses.replace(cp, state={"late": 1}), cp)


def test_save_plain_is_save_without_the_idle_ctes() -> None:
    from cairn.store.sql import QUERIES, _parse

    full, plain = QUERIES["save"], QUERIES["save_plain"]
    for cte in ("appended", "consumed"):
        assert f"), {cte} AS (" in full and f"), {cte} AS (" not in plain
    for kept in ("WHERE c.seq < EXCLUDED.seq AND c.epoch <= EXCLUDED.epoch", "), history AS ("):
        assert kept in plain and kept in full  # one fragment, included by both
    assert not any("{{" in query for query in QUERIES.values())
    with pytest.raises(ValueError, match="no fragment 'missing'"):
        _parse("-- name: q\nSELECT {{missing}}")


def test_evolve_is_replace_without_the_cost() -> None:
    cp = Checkpoint(
        run_id="r", workflow="w", input={}, seq=1, cursor="a", state={"n": 1}, visits={},
        window=(), win_start=0, cost_usd=0.0,
    )  # fmt: skip
    changes = {"seq": 2, "cursor": "b", "state": {"n": 2}, "window_bytes": 7, "signal": None}
    new = cp.evolve(**changes)
    assert new == dataclasses.replace(cp, **changes) and new.window_bytes == 7
    assert (cp.seq, cp.cursor, cp.window_bytes) == (1, "a", -1)  # the original is untouched
    with pytest.raises(dataclasses.FrozenInstanceError):
        new.seq = 3  # type: ignore[misc]
    with pytest.raises(TypeError, match="no field"):
        cp.evolve(sequence=2)


def test_runs_listed_by_status_page_newest_first_like_the_whole_list(store: PgStore, sql) -> None:
    # Same order and keyset as the unfiltered list, walked on the status index instead.
    for i in range(7):
        cp = _run(store, f"s-{i}")
        if i % 2:
            store.save(dataclasses.replace(cp, seq=1, status="failed"), cp)
    # create_run sets the copy in the statement that inserts the run: the same instant
    same = "SELECT count(*) FROM checkpoints c JOIN runs r USING (run_id) WHERE c.created_at = r.created_at"
    assert sql(same) == [(7,)]
    sql(
        "UPDATE runs SET created_at = now() - make_interval(secs => 10 - split_part(run_id, '-', 2)::int)"
    )
    sql("UPDATE checkpoints c SET created_at = r.created_at FROM runs r WHERE r.run_id = c.run_id")
    everything = [r.run_id for r in store.list_runs(RunFilter(limit=100))]
    failed = [r.run_id for r in store.list_runs(RunFilter(status=RunStatus.FAILED, limit=100))]
    assert failed == [r for r in everything if r in ("s-1", "s-3", "s-5")] == ["s-5", "s-3", "s-1"]
    page1 = store.list_runs(RunFilter(status=RunStatus.FAILED, limit=2))
    page2 = store.list_runs(RunFilter(status=RunStatus.FAILED, limit=2, after=page1[-1].run_id))
    assert [r.run_id for r in page1 + page2] == failed
    assert store.list_runs(RunFilter(status=RunStatus.RUNNING)) == []
    assert len(store.list_runs(RunFilter(status=RunStatus.PENDING))) == 4


def test_a_record_alone_commits_without_waiting_for_the_disk_and_one_with_writes_waits(
    store: PgStore, sql, settings
) -> None:
    # What each record's transaction held at its commit, seen by a trigger at its end.
    sql(
        "CREATE TABLE seen (setting text);"
        "CREATE FUNCTION note() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " INSERT INTO seen VALUES (current_setting('synchronous_commit')); RETURN NULL; END $$;"
        "CREATE TRIGGER note AFTER INSERT ON journal FOR EACH ROW EXECUTE FUNCTION note()"
    )
    cp = _advance(_run(store), cursor="one")
    store.save(cp, store.load("r1"))
    assert store.record_call(cp, 0, Call(pos=0, name="tool", result=1))
    # a call's own ctx.db transaction (a pooled connection: rows as dicts)
    with psycopg.connect(settings.database_url, row_factory=dict_row) as conn:
        conn.execute("CREATE TABLE mine (x int); INSERT INTO mine VALUES (1)")
        assert store.record_call(cp, 0, Call(pos=1, name="tool"), SimpleNamespace(open=conn))
    assert [r[0] for r in sql("SELECT setting FROM seen")] == ["off", "on"]
    assert sql("SELECT x FROM mine") == [(1,)]
    with store.db.connection() as pooled:  # local to the record's transaction: not kept
        assert pooled.execute("SHOW synchronous_commit").fetchone()["synchronous_commit"] == "on"


def test_a_held_connection_serves_its_thread_alone_and_a_broken_one_is_replaced(
    store: PgStore, sql
) -> None:
    db = store.db

    def pid() -> int:
        with db.connection() as conn:
            return int(conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"])

    other: list[int] = []

    def checkouts() -> int:
        return int(db.pool.get_stats().get("requests_num", 0))

    with db.held():
        before = checkouts()
        first = pid()
        assert pid() == pid() == first  # the thread's statements share it
        assert checkouts() - before == 1  # taken once, kept between statements
        with db.connection() as conn:  # lent now: a nested statement checks out its own
            assert conn.execute("SELECT pg_backend_pid() AS p").fetchone()["p"] == first
            assert pid() != first
        thread = threading.Thread(target=lambda: other.append(pid()))
        thread.start()
        thread.join()
        assert other[0] != first  # another thread's statements use the pool as ever
        # Gone under it (a restarted server): the statement's retry takes a new one.
        assert sql("SELECT pg_terminate_backend(%s)", first) == [(True,)]
        replaced = db.retry(pid)
        assert replaced != first
        assert pid() == replaced

    def all_back() -> bool:  # the block's end gave it back (the dead one's is replaced)
        stats = db.pool.get_stats()
        return bool(stats["pool_available"] == stats["pool_size"])

    wait_for(all_back, 5, "every pooled connection back")


def test_a_pool_of_one_holds_nothing_so_other_threads_are_not_kept_waiting(db_url) -> None:
    """CAIRN_DATABASE_POOL_SIZE=1: an async step's records are made on the event loop's
    thread while the delivery's thread waits for the step; a held connection would keep
    the pool's only one from them until the pool's timeout."""
    db = Database(db_url, max_size=1, give_up_after=3.0).open()
    try:
        got: list[int] = []

        def other() -> None:
            with db.connection() as conn:
                got.append(conn.execute("SELECT 1 AS one").fetchone()["one"])

        with db.held():
            with db.connection() as conn:  # would take the held connection here
                conn.execute("SELECT 1")
            thread = threading.Thread(target=other)
            began = time.monotonic()
            thread.start()
            thread.join(10)
            assert got == [1] and time.monotonic() - began < 1.0
    finally:
        db.close()
