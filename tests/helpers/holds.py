"""Racers that meet inside a statement by construction, not by chance: a trigger on a table
waits on an advisory lock the test holds, so every statement that writes a row there is
held at that moment (its snapshot taken, its reads done, its write not yet made) until the
test lets go. A guard that serialises the racers (a row lock taken first) shows as racers
waiting on that lock instead: `blocked()` counts both, so a test waits until every racer
is held or queued, then lets go.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

GATE = 4545  # the advisory lock the trigger waits on while the test holds it


class Gate:
    """The test's side of the hold: how many sessions wait, and the release."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self.closed = True

    def _count(self, kind: str | None) -> int:
        row = self._conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND (%(kind)s::text IS NULL OR wait_event = %(kind)s)",
            {"kind": kind},
        ).fetchone()
        assert row is not None
        return int(row[0])

    def held(self) -> int:
        """Sessions held at the trigger."""
        return self._count("advisory")

    def blocked(self) -> int:
        """Sessions waiting on any lock: held at the trigger, or queued behind one that is."""
        return self._count(None)

    def release(self) -> None:
        if self.closed:
            self._conn.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
            self.closed = False


@contextlib.contextmanager
def held_inside(db_url: str, table: str, event: str = "INSERT") -> Iterator[Gate]:
    """Every `event` on table waits, row by row, until the gate is released (or the block
    ends); the trigger is dropped after."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            f"""
            CREATE FUNCTION cairn_test_gate() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_advisory_xact_lock_shared({GATE}); RETURN NEW; END $$;
            CREATE TRIGGER cairn_test_gate BEFORE {event} ON {table}
               FOR EACH ROW EXECUTE FUNCTION cairn_test_gate();
            """
        )
        conn.execute("SELECT pg_advisory_lock(%s)", (GATE,))
        gate = Gate(conn)
        try:
            yield gate
        finally:
            gate.release()
            conn.execute(
                f"DROP TRIGGER cairn_test_gate ON {table}; DROP FUNCTION cairn_test_gate()"
            )


class Racer(threading.Thread):
    """fn() on a thread of its own, started at once; its result or exception kept."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn: Callable[[], Any] = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # noqa: BLE001 (the test asserts on it)
            self.error = exc

    def outcome(self, timeout: float = 10.0) -> Any:
        self.join(timeout)
        assert not self.is_alive(), "still blocked"
        if self.error is not None:
            raise self.error
        return self.result
