"""Sealing by enumeration (CAIRN_PAYLOAD_KEYS): runs go through every feature that stores
what a user or a model gave (input, state, window, journaled results and errors, ctx.once,
signals, steers, approvals and their notes, a fork's patch, a cancel's reason, a step's
error, a retry's, schedules, debounce, children, sessions, an enqueue in the caller's
transaction), each time with one marker string; then every json, jsonb and text column of
every table is searched for the marker in clear. None may hold it, but the columns declared
here as not payloads; and the columns that hold sealed values are exactly store/sealed.py's
PAYLOADS, which `cairn db rotate-key` walks. A new column is either one or the other."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import cairn
from cairn.client import Client
from cairn.core import sealing
from cairn.core.errors import RetryLater
from cairn.core.sealing import SEALED, KeyRing, new_key
from cairn.core.settings import Settings
from cairn.steps import Context, StepResult, workflow
from cairn.steps.registry import Child, Retry
from cairn.store import Leases, PgStore
from cairn.store.schedules import ScheduleStore
from cairn.store.sealed import PAYLOADS
from cairn.store.sessions import SessionStore
from cairn.workers import loop
from cairn.workers.schedules import Firer
from tests.unit.test_payloads import JSON

MARK = "zq-marker-5e1f"
KEYS = f"k1:{new_key()}"

# The columns that are not payloads: names, ids, routes, times, what cairn's SQL reads.
# (text and json columns alike: a column missing from both lists fails the schema test.)
NOT_PAYLOADS = {
    # what a run is and where it stands (cairn's own words, or names from code)
    "runs.run_id", "runs.workflow", "runs.parent_id", "runs.concurrency_key",
    "runs.traceparent", "runs.forked_from", "runs.tenant", "runs.budgets",
    "checkpoints.run_id", "checkpoints.cursor", "checkpoints.visits", "checkpoints.status",
    "checkpoints.wait_event", "checkpoints.wait_timeout_cursor",
    "checkpoints.debounce_workflow", "checkpoints.debounce_key",
    "checkpoints.started_version",
    "window_messages.run_id", "effects.key", "effects.run_id",
    "signals.run_id", "signals.signal_id", "signals.event", "signals.traceparent",
    "step_history.run_id", "step_history.cursor", "step_history.outcome",
    "step_history.worker", "step_history.effect_key", "step_history.next_cursor",
    "step_history.visits", "step_history.code_version",
    "journal.run_id", "journal.cursor", "journal.name",
    "run_counts.status", "run_count_deltas.status",
    "gathers.parent_id", "concurrency_keys.workflow", "concurrency_keys.key",
    "slots.run_id", "slots.workflow", "slots.key",
    "queued.run_id", "queued.workflow", "queued.key",
    "schedules.name", "schedules.workflow", "schedules.cron", "schedules.catch_up",
    "agent_session_items.session_id", "agent_session_items.run_id",
    "steer_messages.run_id",
    "api_tokens.id", "api_tokens.name", "api_tokens.tenant", "page_sessions.token_id",
    "budgets.scope", "budgets.period", "budget_holds.scope", "budget_holds.run_id",
    "budget_holds.cursor",
    "approvals.run_id", "approvals.event", "approvals.workflow", "approvals.tool",
    "approvals.tenant",
    "approval_decisions.run_id", "approval_decisions.workflow", "approval_decisions.tool",
    "approval_decisions.decision", "approval_decisions.decided_by",
    "approval_rules.workflow", "approval_rules.tool", "approval_rules.created_by",
    "approval_rules.tenant",
    # LangGraph's saver: its serializer's bytes (give it EncryptedSerializer) and the
    # metadata its list() filters on in SQL
    "graph_checkpoints.thread_id", "graph_checkpoints.ns", "graph_checkpoints.checkpoint_id",
    "graph_checkpoints.parent_id", "graph_checkpoints.type", "graph_checkpoints.versions",
    "graph_checkpoints.metadata", "graph_checkpoints.run_id",
    "graph_blobs.thread_id", "graph_blobs.ns", "graph_blobs.channel", "graph_blobs.version",
    "graph_blobs.type", "graph_blobs.base_version",
    "graph_writes.thread_id", "graph_writes.ns", "graph_writes.checkpoint_id",
    "graph_writes.task_id", "graph_writes.channel", "graph_writes.type",
    "graph_writes.task_path",
    # the demo's ledger (a user's table, written through ctx.db), and the migrations'
    "invoice_ledger.idempotency_key", "invoice_ledger.run_id", "invoice_ledger.customer",
    "cairn_migrations.name",
}  # fmt: skip

every = workflow("every_payload")
leaf = workflow("every_payload_leaf")
flaky = workflow("every_payload_flaky")


def _broken() -> None:
    raise ValueError(f"lookup refused {MARK}")


@every.step()
def ask(ctx: Context) -> StepResult:
    heard = ctx.messages()
    said = ctx.call("lookup", lambda: {"found": MARK})
    with contextlib.suppress(ValueError):
        ctx.call("broken", _broken)  # a permanent error, journaled
    kept = ctx.once(lambda key: {"sent": MARK})
    ctx.emit("progress", {"note": MARK})
    from cairn.store import sessions

    sessions.add(ctx.db, "chat-1", [{"role": "user", "content": MARK}], ctx.run_id)
    return StepResult.wait(
        "go",
        cursor="fan",
        state={"secret": MARK, "heard": heard, "said": said, "kept": kept},
        window=[{"role": "user", "content": MARK}],
        request={"tool": "open_vault", "args": {"code": MARK}},
    )


@every.step()
def fan(ctx: Context) -> StepResult:
    return StepResult.spawn(
        [Child("every_payload_leaf", {"note": MARK})], cursor="end", state={"got": ctx.signal}
    )


@every.step()
def end(ctx: Context) -> StepResult:
    return StepResult(cursor=cairn.DONE)


@leaf.step()
def only(ctx: Context) -> StepResult:
    return StepResult(cursor=cairn.DONE, state={"leaf": ctx.input["note"]})


@flaky.step(retry=Retry(attempts=2, backoff=0.0, on=(RuntimeError,)))
def fails(ctx: Context) -> StepResult:
    raise RuntimeError(f"the model said {MARK}")


@pytest.fixture
def keys() -> Iterator[None]:
    sealing.use(KeyRing(KEYS))
    yield
    sealing.use(None)


def _columns(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    """Every json, jsonb, text and text[] column of every table (partitions: their
    parent's), as (table, column)."""
    rows = conn.execute(
        """SELECT c.table_name, c.column_name
             FROM information_schema.columns c
             JOIN pg_class k ON k.relname = c.table_name AND NOT k.relispartition
            WHERE c.table_schema = 'public' AND k.relkind IN ('r', 'p')
              AND (c.data_type IN ('json', 'jsonb', 'text', 'character varying')
                   OR c.udt_name IN ('_text', '_jsonb'))
            ORDER BY 1, 2"""
    ).fetchall()
    return [(t, c) for t, c in rows]


def _scan(url: str, what: str) -> dict[str, int]:
    """Per table.column: the rows whose text holds `what`."""
    found = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for table, column in _columns(conn):
            query = f'SELECT count(*) FROM "{table}" WHERE strpos("{column}"::text, %s) > 0'
            row = conn.execute(query, (what,)).fetchone()
            if row and row[0]:
                found[f"{table}.{column}"] = int(row[0])
    return found


def _every_feature(settings: Settings, store: PgStore, leases: Leases) -> str:
    """Runs through every feature that stores a payload; the main run's id."""
    deps = loop.Deps(settings=settings, store=store, leases=leases, model=None)
    client = Client(settings=settings, store=store, send=lambda run_id, priority=0: None)
    run_id = client.enqueue("every_payload", {"secret": MARK})
    client.steer(run_id, {"note": MARK})
    client.signal(run_id, "unheard", {"note": MARK})  # stored, never consumed
    assert loop.run(run_id, deps) == cairn.RunStatus.WAITING
    [asked] = client.approvals()
    client.decide(asked.approval_id, "edit", args={"code": MARK}, note=MARK)
    assert loop.run(run_id, deps) == cairn.RunStatus.WAITING  # spawned: waits for its child
    for child in store.children(run_id):
        assert loop.run(child.run_id, deps) == cairn.RunStatus.DONE
    assert loop.run(run_id, deps) == cairn.RunStatus.DONE
    # A fork with a patch, a cancel with a reason, a step's error and its retry's.
    fork = client.fork(run_id, at_seq=1, input_patch={"patched": MARK})
    client.cancel(fork, reason=f"stopped by {MARK}")
    failing = client.enqueue("every_payload_flaky", {})
    with contextlib.suppress(RetryLater):
        loop.run(failing, deps)
    assert loop.run(failing, deps) == cairn.RunStatus.FAILED
    # Debounce, a schedule and its tick, an enqueue in the caller's transaction, sessions.
    client.enqueue("every_payload_leaf", {"note": MARK}, debounce_key="k", debounce=60)
    client.add_schedule("nightly", "every_payload_leaf", {"note": MARK}, every=3600)
    schedules = ScheduleStore(store.db)
    Firer(store=schedules, send=lambda _: None).fire(dt.datetime.now(dt.UTC) + dt.timedelta(1))
    with psycopg.connect(settings.database_url) as conn:
        client.enqueue("every_payload_leaf", {"note": MARK}, connection=conn)
    SessionStore(store.db).add("chat-2", [{"content": MARK}])
    return run_id


def test_no_payload_is_left_in_clear_in_any_column(
    keys: None, settings: Settings, store: PgStore, leases: Leases, db_url: str
) -> None:
    run_id = _every_feature(settings, store, leases)
    clear = _scan(db_url, MARK)
    assert sorted(set(clear) - NOT_PAYLOADS) == []
    # The columns holding sealed values are PAYLOADS, which rotate-key walks: no more.
    sealed = _scan(db_url, '"cairn.sealed": "v1.k1.')
    assert sorted(sealed) == sorted(f"{t}.{c}" for t, c, _ in PAYLOADS)
    # ...and every payload reads back opened (a fork's patch merged after opening).
    client = Client(settings=settings, store=store, send=lambda run_id, priority=0: None)
    fork = client.forks(run_id)[0]
    got = store.load(fork.run_id)
    assert got is not None and got.input == {"secret": MARK, "patched": MARK}
    assert fork.error == f"stopped by {MARK}"


def test_every_column_is_a_payload_or_declared_not_one(db_url: str) -> None:
    """A new json or text column fails here until it is listed: a payload (PAYLOADS, which
    rotate-key walks, written as store.payloads.Payload) or declared not one."""
    with psycopg.connect(db_url) as conn:
        columns = {f"{t}.{c}" for t, c in _columns(conn)}
    payloads = {f"{t}.{c}" for t, c, _ in PAYLOADS}
    assert sorted(columns - payloads - NOT_PAYLOADS) == []
    assert sorted((payloads | NOT_PAYLOADS) - columns) == []  # nothing listed that is gone
    assert payloads & NOT_PAYLOADS == set()


@hsettings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=JSON, keyed=st.booleans())
def test_a_value_shaped_like_the_envelope_round_trips_through_postgres(
    store: PgStore, value: Any, keyed: bool
) -> None:
    """A user's input holding "cairn.sealed" members (forged tokens among them) is stored
    and read back exactly, with keys or without: never opened as if cairn sealed it."""
    sealing.use(KeyRing(KEYS if keyed else None))
    try:
        run_id = f"r-{uuid.uuid4().hex[:12]}"
        assert store.create_run(run_id, "every_payload_leaf", {"v": value})
        got = store.load(run_id)
        assert got is not None and got.input == {"v": value}
        assert store.create_run(run_id, "every_payload_leaf", {"v": value}) is False  # same
    finally:
        sealing.use(None)


own = workflow("every_payload_own_table")
FORGED = {"a": {SEALED: "v1.k1.AAAA"}, "b": [{SEALED: ["x"]}], SEALED: [1]}


@own.step()
def keep(ctx: Context) -> StepResult:
    """A value of the user's own, in a table of the user's own, through ctx.db: read back
    as written, never taken for one cairn sealed or escaped."""
    ctx.db.execute("CREATE TEMP TABLE mine (v jsonb) ON COMMIT DROP")
    ctx.db.execute("INSERT INTO mine VALUES (%s::jsonb)", (json.dumps(FORGED),))
    row = ctx.db.execute("SELECT v FROM mine").fetchone()
    got = row["v"] if isinstance(row, dict) else row[0]
    return StepResult(cursor=cairn.DONE, state={"same": got == FORGED, "got": got})


@pytest.mark.parametrize("keyed", [False, True], ids=["no-keys", "keys"])
def test_a_steps_own_table_reads_back_as_written_through_ctx_db(
    settings: Settings, store: PgStore, leases: Leases, keyed: bool
) -> None:
    sealing.use(KeyRing(KEYS if keyed else None))
    try:
        deps = loop.Deps(settings=settings, store=store, leases=leases, model=None)
        run_id = f"own-{uuid.uuid4().hex[:8]}"
        assert store.create_run(run_id, "every_payload_own_table", {})
        assert loop.run(run_id, deps) == cairn.RunStatus.DONE
        got = store.load(run_id)
        assert got is not None and got.state == {"same": True, "got": FORGED}
    finally:
        sealing.use(None)
