"""Every write a step makes is fenced the same way: a share lock on the run's row, taken by
the write's own statement (or its transaction's first), against the claim's update of the
row's epoch. So a claim waits for a write in flight (which lands first, as the old owner's
legitimate write), and a write that waits for a claim sees the new epoch and writes nothing:
never a write checked against the old epoch that commits after the claim. A fenced
transaction left idle (its process paused) is ended by the server after `hold`, so a claim
never waits on a zombie for longer than that.

On real Postgres, with the moment held open by a trigger that waits on an advisory lock
the test holds (the statement is in flight, its fence already taken).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from cairn.core.errors import StoreUnavailable
from cairn.core.records import Call
from cairn.store import Checkpoint, Database, PgStore
from cairn.store.db import translated
from cairn.store.graphs import Fence, GraphStore
from tests.helpers.holds import Racer

HELD = 4242  # the advisory lock a trigger waits on while the test holds it


def _running(store: PgStore, run_id: str = "r1") -> Checkpoint:
    """A run claimed at epoch 1 that saved one step."""
    assert store.create_run(run_id, "probe", {"x": 1}, "one")
    claimed = store.claim(run_id, 1)
    assert claimed is not None
    cp = dataclasses.replace(claimed, seq=1, cursor="two", status="running", visits={"one": 1})
    store.save(cp, claimed)
    return cp


def _graph(store: PgStore) -> GraphStore:
    return GraphStore(store.db)


def _fence(cp: Checkpoint) -> Fence:
    return Fence(cp.run_id, cp.epoch)


# Each fenced write of a step, at the checkpoint cp (its run, seq and epoch): True if it
# landed, False if fenced.
WRITES: dict[str, tuple[str, Callable[[PgStore, Checkpoint], bool]]] = {
    "record_call": (
        "journal",
        lambda s, cp: s.record_call(cp, 0, Call(pos=0, name="tool")) is not None,
    ),
    "record_intent": ("effects", lambda s, cp: s.record_intent(cp, "k")[0] == "written"),
    "mark_done": ("effects", lambda s, cp: s.mark_done(cp, "k", {"ok": True})),
    "graph_put": (
        "graph_checkpoints",
        lambda s, cp: _graph(s).put(
            cp.run_id, "", "0001", None, ("json", b"{}"), {}, {}, [], Fence(cp.run_id, cp.epoch)
        ),
    ),
    "graph_put_writes": (
        "graph_writes",
        lambda s, cp: _graph(s).put_writes(
            cp.run_id, "", "0001", "task", "", [(0, "c", "json", b"1")], False, _fence(cp)
        ),
    ),
}


@pytest.fixture
def held(db_url: str) -> Iterator[Callable[[str], psycopg.Connection[Any]]]:
    """held(table): inserts into table wait, inside their statement, until the returned
    connection lets go of the advisory lock (conn.execute(...unlock...))."""
    conn = psycopg.connect(db_url, autocommit=True)

    def hold(table: str) -> psycopg.Connection[Any]:
        conn.execute(
            f"""
            CREATE FUNCTION wait_for_test() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_advisory_xact_lock_shared({HELD}); RETURN NEW; END $$;
            CREATE TRIGGER wait_for_test BEFORE INSERT ON {table}
               FOR EACH ROW EXECUTE FUNCTION wait_for_test();
            """
        )
        conn.execute("SELECT pg_advisory_lock(%s)", (HELD,))
        return conn

    yield hold
    conn.close()


def _waiting_on(sql: Callable[..., list[tuple[Any, ...]]], kind: str) -> bool:
    """Some session of the test's database waits for a lock of that kind."""
    rows = sql(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND wait_event = %s",
        kind,
    )
    return bool(rows[0][0])


def _until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_claim_waits_for_a_fenced_write_in_flight_which_lands_before_it(
    store: PgStore, sql: Callable[..., list[tuple[Any, ...]]], held: Any, write: str
) -> None:
    table, fn = WRITES[write]
    cp = _running(store)
    holder = held(table)
    writer = Racer(lambda: fn(store, cp))
    _until(lambda: _waiting_on(sql, "advisory"), "the write to be held inside its statement")
    claim = Racer(lambda: store.claim(cp.run_id, 2))
    time.sleep(0.3)
    assert claim.is_alive(), "the claim went ahead of the write in flight"
    holder.execute("SELECT pg_advisory_unlock(%s)", (HELD,))
    assert writer.outcome() is True  # the old owner's write, made before the claim: kept
    claimed = claim.outcome()
    assert claimed is not None and claimed.epoch == 2
    assert fn(store, cp) is False  # and from the claim on, the old owner is fenced


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_fenced_write_that_waits_for_a_claim_sees_its_epoch_and_writes_nothing(
    store: PgStore, db_url: str, write: str
) -> None:
    table, fn = WRITES[write]
    cp = _running(store)
    with psycopg.connect(db_url) as claimer:  # the claim's update, not committed yet
        claimer.execute("UPDATE checkpoints SET epoch = 2 WHERE run_id = %s", (cp.run_id,))
        writer = Racer(lambda: fn(store, cp))
        time.sleep(0.3)
        assert writer.is_alive(), "the write did not wait for the claim in flight"
        claimer.commit()
    assert writer.outcome() is False
    with psycopg.connect(db_url) as conn:
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


@pytest.mark.parametrize("how", ["graph_fence", "hold"])
def test_a_fenced_transaction_left_idle_is_ended_after_hold_and_the_claim_goes_on(
    store: PgStore, how: str
) -> None:
    cp = _running(store)
    db = Database(store.db.url, prepare=store.db.prepare, hold=0.5)
    try:
        with db.connection() as conn:
            conn.autocommit = False
            if how == "graph_fence":
                assert GraphStore(db)._fence(conn, Fence(cp.run_id, cp.epoch))
            else:  # a step's own transaction, right before its save or a call's record
                db.hold_row(conn)
                conn.execute("SELECT 1 FROM checkpoints WHERE run_id = %s FOR SHARE", [cp.run_id])
            claim = Racer(lambda: store.claim(cp.run_id, 2))
            time.sleep(0.2)
            assert claim.is_alive()  # waits for the fenced transaction...
            claimed = claim.outcome(timeout=5.0)  # ...no longer than its hold
            assert claimed is not None and claimed.epoch == 2
            # The paused writer's transaction is gone: an outage to heal by a retry, which
            # then meets the fence.
            with pytest.raises(StoreUnavailable), translated():
                conn.execute("SELECT 1")
    finally:
        db.close()
