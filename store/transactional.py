"""Enqueue in the caller's transaction: the run row written on the caller's own psycopg
connection, and a NOTIFY that Postgres delivers only when that transaction commits.

Nothing here commits or rolls back what the caller owns: the statements run in a
savepoint of the caller's transaction (on an idle connection that is not autocommit,
psycopg begins that transaction with the savepoint, and the caller's next commit or
rollback ends it); only an autocommit connection outside any transaction, where the
caller has none to join, gets a transaction of its own, committed at once. A connection
in a failed transaction, closed or broken is refused (InvalidInput).

Nothing here sends: the caller's commit is out of our sight, and a send before it could
start a run the caller then rolls back. Beat's dispatcher (cairn.workers.dispatch) hears
the notification and sends the run; a notification nobody heard (no dispatcher, a killed
one, PgBouncer in transaction mode between them) leaves a pending run that was never
claimed, which the reaper's `stalled` sends after CAIRN_PENDING_AFTER. A debounced
enqueue (debounce_in) needs no notification: its run waits, and beat's wake pass sends it
once it is committed and due.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from cairn.core.errors import InvalidInput
from cairn.core.records import START
from cairn.store.db import Database, translated
from cairn.store.rows import conflict, create_params, debounce_params
from cairn.store.sql import QUERIES

CHANNEL = "cairn_enqueued"  # queries.sql: notify_enqueued says it alike


Row = dict[str, Any] | None
T = TypeVar("T")
# One enqueue's statements, each sent the row its previous one returned: written once
# for psycopg's two drivers (the sync Connection's and the AsyncConnection's).
Statements = Generator[tuple[str, dict[str, Any]], Row, bool]


def is_async(connection: object) -> bool:
    """Whether connection is a psycopg AsyncConnection (AsyncClient awaits those)."""
    return isinstance(connection, psycopg.AsyncConnection)


def _refused(connection: object) -> InvalidInput:
    return InvalidInput(
        f"connection= must be a psycopg 3 Connection or AsyncConnection, not "
        f"{type(connection).__name__} (SQLAlchemy: conn.connection.driver_connection; "
        "Django: connection.connection)"
    )


def _create(names: tuple[str, ...], params: dict[str, Any]) -> Statements:
    first = yield names[0], params
    for name in names[1:]:  # admit, after the keyed insert
        yield name, params
    return first is not None


def _enqueue(
    run_id: str,
    workflow: str,
    input: dict[str, Any],
    max_cost_usd: float | None,
    priority: int,
    concurrency_key: str | None,
    concurrency_limit: int,
    traceparent: str | None,
    tenant: str | None = None,
) -> Statements:
    """PgStore.create_run's statements, then the notification the dispatcher sends the
    run on; returns whether the run is new. Raises RunIdConflict."""
    params = create_params(
        run_id, workflow, input, START, max_cost_usd, priority, concurrency_key,
        concurrency_limit, traceparent, tenant,
    )  # fmt: skip
    names = ("create_run",) if concurrency_key is None else ("create_keyed_run", "admit")
    created = yield from _create(names, params)
    if not created:
        # Another transaction's run with this id blocks the insert until it ends: a
        # committed one is read here (the idempotent repeat), a rolled-back one is not.
        row = yield "existing_run", params
        if row is None:  # swept between the two statements: create it afresh
            created = yield from _create(names, params)
        else:
            conflict(run_id, row, input)
            yield "rearm_failed", {"run_id": run_id}
    yield "notify_enqueued", {"run_id": run_id}
    return created


def create_run_in(connection: object, run_id: str, workflow: str, input: dict[str, Any], *,
                  max_cost_usd: float | None = None, priority: int = 0,
                  concurrency_key: str | None = None, concurrency_limit: int = 1,
                  traceparent: str | None = None,
                  tenant: str | None = None) -> bool:  # fmt: skip
    """PgStore.create_run on the caller's connection, in its transaction, with the
    notification the dispatcher sends the run on; True if the run is new. Commits nothing:
    the caller's commit does. In a savepoint of the caller's transaction (an autocommit
    connection: a transaction of its own), so a refusal (RunIdConflict, a value Postgres
    refuses) leaves that transaction usable.

    Raises InvalidInput (not a psycopg Connection; one in a failed transaction, closed or
    broken) or RunIdConflict.
    """
    steps = _enqueue(
        run_id, workflow, input, max_cost_usd, priority, concurrency_key, concurrency_limit,
        traceparent, tenant,
    )  # fmt: skip
    return bool(_run(_sync(connection), steps))


def debounce_in(connection: object, run_id: str, workflow: str, input: dict[str, Any],
                key: str, debounce: float, max_wait: float | None = None, *,
                max_cost_usd: float | None = None, priority: int = 0,
                traceparent: str | None = None,
                tenant: str | None = None) -> str:  # fmt: skip
    """PgStore.debounce on the caller's connection, in a savepoint of its transaction:
    the run id the enqueue collapsed into. No notification: the wake pass sends the run
    when its quiet period ends, and only a committed one (it is waiting until then)."""
    steps = _debounce(
        run_id,
        workflow,
        input,
        key,
        debounce,
        max_wait,
        max_cost_usd,
        priority,
        traceparent,
        tenant,
    )
    return str(_run(_sync(connection), steps))


def _debounce(*args: Any) -> Generator[tuple[str, dict[str, Any]], Row, str]:
    row = yield "debounce", debounce_params(*args)
    assert row is not None
    return str(row["run_id"])


def _sync(connection: object) -> psycopg.Connection[Any]:
    if not isinstance(connection, psycopg.Connection):
        if is_async(connection):
            raise InvalidInput(
                "connection= is a psycopg AsyncConnection: await AsyncClient.enqueue with "
                "it, or pass a sync Connection to Client.enqueue"
            )
        raise _refused(connection)
    return connection


def _own_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether the enqueue needs a transaction of its own: an autocommit connection outside
    any transaction block (the caller has none to join). Any other connection gets a
    savepoint of the caller's transaction. Raises InvalidInput for a connection no
    statement can run on."""
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise InvalidInput(
            "connection= is in a failed transaction (a statement in it failed): roll it back "
            "(conn.rollback(), or to your savepoint), then enqueue"
        )
    if status not in (TransactionStatus.IDLE, TransactionStatus.INTRANS):
        state = "closed" if conn.closed else "busy with another statement, or broken"
        raise InvalidInput(f"connection= is {state}: pass an open psycopg connection")
    return conn.autocommit and status == TransactionStatus.IDLE


def _in_savepoint(steps: Generator[tuple[str, dict[str, Any]], Row, T]) -> Generator[tuple[str, dict[str, Any]], Row, T]:  # fmt: skip
    """steps in a savepoint: released once they are through, rolled back to when they or a
    statement of theirs fail (the failure, thrown in by the driver, raised again)."""
    yield "enqueue_savepoint", {}
    try:
        done = yield from steps
    except Exception:
        yield "enqueue_rollback", {}
        yield "enqueue_release", {}
        raise
    yield "enqueue_release", {}
    return done


def _next(steps: Generator[tuple[str, dict[str, Any]], Row, T], row: Row, failed: Exception | None) -> tuple[str, dict[str, Any]]:  # fmt: skip
    """The next statement of steps: given the row the last one returned, or the error it
    raised (thrown in, so the savepoint is rolled back to). StopIteration: steps are done."""
    return steps.send(row) if failed is None else steps.throw(failed)


def _run(conn: psycopg.Connection[Any], steps: Generator[tuple[str, dict[str, Any]], Row, T]) -> T:
    """Drive one enqueue's statements on conn, in a savepoint; what they returned."""
    own = _own_transaction(conn)
    with (
        translated(),
        conn.transaction() if own else contextlib.nullcontext(),
        conn.cursor(row_factory=dict_row) as cur,
    ):
        statements, row, failed = _in_savepoint(steps), None, None
        while True:
            try:
                name, values = _next(statements, row, failed)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                cur.execute(QUERIES[name], values)
                row, failed = (cur.fetchone() if cur.description else None), None
            except Exception as exc:  # noqa: BLE001 (thrown into the statements, raised there)
                failed = exc


async def acreate_run_in(connection: object, run_id: str, workflow: str,
                         input: dict[str, Any], *, max_cost_usd: float | None = None,
                         priority: int = 0, concurrency_key: str | None = None,
                         concurrency_limit: int = 1,
                         traceparent: str | None = None,
                         tenant: str | None = None) -> bool:  # fmt: skip
    """create_run_in on the caller's psycopg AsyncConnection, awaited in its event loop."""
    steps = _enqueue(
        run_id, workflow, input, max_cost_usd, priority, concurrency_key, concurrency_limit,
        traceparent, tenant,
    )  # fmt: skip
    return bool(await _arun(connection, steps))


async def adebounce_in(connection: object, run_id: str, workflow: str, input: dict[str, Any],
                       key: str, debounce: float, max_wait: float | None = None, *,
                       max_cost_usd: float | None = None, priority: int = 0,
                       traceparent: str | None = None,
                       tenant: str | None = None) -> str:  # fmt: skip
    """debounce_in on the caller's psycopg AsyncConnection, awaited in its event loop."""
    steps = _debounce(
        run_id,
        workflow,
        input,
        key,
        debounce,
        max_wait,
        max_cost_usd,
        priority,
        traceparent,
        tenant,
    )
    return str(await _arun(connection, steps))


async def _arun(connection: object, steps: Generator[tuple[str, dict[str, Any]], Row, T]) -> T:
    """_run on the caller's AsyncConnection, in its event loop."""
    if not isinstance(connection, psycopg.AsyncConnection):
        raise _refused(connection)
    conn = connection
    own = _own_transaction(conn)
    with translated():
        async with (
            conn.transaction() if own else contextlib.nullcontext(),
            conn.cursor(row_factory=dict_row) as cur,
        ):
            statements, row, failed = _in_savepoint(steps), None, None
            while True:
                try:
                    name, values = _next(statements, row, failed)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                try:
                    await cur.execute(QUERIES[name], values)
                    row, failed = (await cur.fetchone() if cur.description else None), None
                except Exception as exc:  # noqa: BLE001 (thrown into the statements)
                    failed = exc


@contextlib.contextmanager
def enqueued(db: Database) -> Iterator[Callable[[float], str | None]]:
    """LISTEN for committed transactional enqueues on a connection of db's own: yields
    heard(seconds), the next run id within that time, else None."""
    with db.hearing(CHANNEL) as heard:
        yield heard
