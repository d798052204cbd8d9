"""The step loop in process, against real Postgres, Redis and loopback stand-ins."""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from cairn.core import errors
from cairn.core.errors import (
    IncompatibleCheckpoint,
    InvalidInput,
    StaleWrite,
    UnknownRun,
    UnknownWorkflow,
)
from cairn.steps import registry
from cairn.steps.model import cost_of
from cairn.steps.window import compact
from cairn.store import Checkpoint, Database, Leases, PgStore, keys
from cairn.testing.standins import MailServer
from cairn.workers import loop
from cairn.workers.middleware import Chain, Middleware


def _probe_input(tmp_path: Path, **extra: object) -> dict:
    return {"log": str(tmp_path / "steps.log"), **extra}


def test_run_to_done_with_every_kind_of_effect(
    create, deps, store: PgStore, mail: MailServer, sql, tmp_path
) -> None:
    run_id = create("probe", _probe_input(tmp_path), queue=False)
    assert loop.run(run_id, deps) == "done"
    cp = store.load(run_id)
    assert cp is not None and (cp.status, cp.cursor, cp.seq) == ("done", "done", 5)
    assert cp.visits == {"one": 1, "two": 1, "mail": 1, "ledger": 1, "once": 1}
    assert len(cp.window) == 2 and cp.window[1]["content"] == f"hello {run_id}"
    assert cp.cost_usd > 0
    assert mail.stats()["deliveries"] == 1
    assert sql("SELECT idempotency_key FROM invoice_ledger") == [(f"cairn:{run_id}:ledger:0",)]
    assert (tmp_path / "steps.log.effects").read_text() == f"cairn:{run_id}:once:0\n"
    # The ledger records the lease epoch that ran the effect.
    assert sql("SELECT key, epoch FROM effects") == [(f"cairn:{run_id}:once:0", cp.epoch)]
    assert cp.epoch > 0


def test_redelivered_finished_run_does_nothing(
    create, deps, store: PgStore, leases: Leases, mail: MailServer, tmp_path
) -> None:
    run_id = create("probe", _probe_input(tmp_path), queue=False)
    loop.run(run_id, deps)
    before = store.load(run_id)
    lines = (tmp_path / "steps.log").read_text()
    assert loop.run(run_id, deps) == "done"
    assert store.load(run_id) == before
    assert (tmp_path / "steps.log").read_text() == lines
    assert mail.stats()["attempts"] == 1
    assert leases.holder(run_id) is None
    assert not leases.client.exists(keys.epoch(run_id))  # an ended run keeps no counter


def test_an_unknown_run_leaves_no_key_in_redis(deps, leases: Leases) -> None:
    with pytest.raises(UnknownRun):
        loop.run("no-such-run", deps)
    assert leases.client.keys("cairn:*no-such-run") == []


def test_a_held_lease_defers_the_run(create, deps, leases: Leases, tmp_path) -> None:
    run_id = create("probe", _probe_input(tmp_path), queue=False)
    other = leases.acquire(run_id, ttl=5)
    assert other is not None
    with pytest.raises(errors.Deferred):
        loop.run(run_id, deps)
    assert not (tmp_path / "steps.log").exists()
    other.release()
    assert loop.run(run_id, deps) == "done"


def test_a_run_whose_epoch_counter_redis_lost_is_leased_above_its_stored_epoch(
    create, deps, store: PgStore, leases: Leases, sql, tmp_path
) -> None:
    # Redis restarted without persistence: its counter is gone, the stored epoch is not.
    run_id = create("probe", _probe_input(tmp_path), queue=False)
    sql("UPDATE checkpoints SET epoch = 7 WHERE run_id = %s", run_id)
    leases.client.delete(keys.epoch(run_id))
    assert loop.run(run_id, deps) == "done"
    cp = store.load(run_id)
    assert cp is not None and cp.epoch == 8  # the first lease (epoch 1) was fenced out
    assert leases.holder(run_id) is None


def test_each_visit_of_a_looping_step_gets_its_own_key(create, deps, mail: MailServer) -> None:
    run_id = create("loop", {"visits": 3}, queue=False)
    assert loop.run(run_id, deps) == "done"
    refs = sorted(mail.stats()["by_ref"])
    assert refs == [f"cairn:{run_id}:think:{v}" for v in range(3)]


def test_cost_counts_every_token_kind() -> None:
    usage = type(
        "U",
        (),
        {
            "input_tokens": 1_000_000,
            "output_tokens": 1_000_000,
            "cache_creation_input_tokens": 1_000_000,
            "cache_read_input_tokens": 1_000_000,
        },
    )
    assert cost_of("claude-haiku-4-5", usage) == pytest.approx(1.0 + 5.0 + 1.25 + 0.10)
    assert cost_of("some-future-model", usage) > cost_of("claude-haiku-4-5", usage)


def test_compaction_fits_the_budget_and_the_loaded_window_is_what_the_model_saw(
    create, deps, store: PgStore
) -> None:
    window = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "x" * 400} for i in range(40)
    ]
    out = compact(window, budget_tokens=1000, keep_last=4)
    assert out[0]["content"].startswith("[Summary") and out[1:] == window[-3:]
    short = window[:2]
    assert compact(short, budget_tokens=1000) is short  # fits: kept as is, so saves append
    small = dataclasses.replace(deps.settings, window_budget_tokens=300)
    run_id = create("loop", {"visits": 1}, queue=False)
    cp = store.load(run_id)
    assert cp is not None
    big = dataclasses.replace(cp, window=tuple(window))
    nxt = loop._next(big, registry.get("loop"), registry.StepResult(cursor="done"), _Ctx(), small)
    assert nxt.window[0]["content"].startswith("[Summary") and nxt.win_start == big.win_end
    store.save(nxt, big)
    assert store.load(run_id).window == nxt.window  # type: ignore[union-attr]


class _Ctx:
    visit = 0
    cost_usd = 0.0


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("raise", "RuntimeError: the step blew up"),
        ("two_effects", "second effect key"),
        ("huge_window", "CAIRN_MAX_WINDOW_BYTES"),
    ],
)
def test_a_failing_step_fails_the_run_clearly_and_keeps_the_checkpoint(
    create, deps, store: PgStore, mode: str, error: str
) -> None:
    run_id = create("bad", {"mode": mode}, queue=False)
    before = store.load(run_id)
    small = dataclasses.replace(
        deps, settings=dataclasses.replace(deps.settings, max_window_bytes=100_000)
    )
    assert loop.run(run_id, small) == "failed"
    after = store.load(run_id)
    assert after is not None and before is not None
    assert error in (after.error or "")
    assert (after.seq, after.cursor, after.state, after.window) == (
        before.seq,
        before.cursor,
        before.state,
        before.window,
    )
    other = create("bad", {"mode": "fine"}, queue=False)
    assert loop.run(other, small) == "done"  # other runs unaffected


def test_a_loop_that_never_ends_stops_at_max_steps(create, deps, store: PgStore) -> None:
    run_id = create("spin", {}, queue=False)
    assert loop.run(run_id, deps) == "failed"
    cp = store.load(run_id)
    assert cp is not None and cp.seq == 3 and "max_steps=3" in (cp.error or "")


def test_enqueueing_a_failed_run_again_rearms_it(client, deps, store: PgStore, tmp_path) -> None:
    data = {"fixed": str(tmp_path / "fixed")}
    run_id = client.enqueue("flaky", data)
    assert loop.run(run_id, deps) == "failed"
    (tmp_path / "fixed").touch()  # the cause is fixed
    assert loop.run(run_id, deps) == "failed"  # a failed run stays failed until re-armed
    assert client.enqueue("flaky", data, run_id=run_id) == run_id
    assert loop.run(run_id, deps) == "done"


def test_claim_fences_the_old_owner_before_the_new_owners_first_save(
    create, deps, store: PgStore, leases: Leases, tmp_path
) -> None:
    run_id = create("probe", _probe_input(tmp_path), queue=False)
    old = leases.acquire(run_id, ttl=5)
    assert old is not None
    started = store.claim(run_id, old.epoch)  # the old owner started the run...
    assert started is not None
    leases.client.delete(keys.lease(run_id))  # ...and went silent: its lease expired
    seen: list[str] = []

    class OldOwnerSaves(Middleware):
        """Right after the new owner claimed the run, before its first save."""

        def before_step(self, cp: Checkpoint) -> None:
            if seen:
                return
            late = dataclasses.replace(started, seq=1, cursor="two", status="running")
            try:
                store.save(late, started)
                seen.append("applied")
            except StaleWrite:
                seen.append("rejected")

    assert (
        loop.run(run_id, dataclasses.replace(deps, middleware=Chain([OldOwnerSaves()]))) == "done"
    )
    assert seen == ["rejected"]


def test_foreign_version_is_refused_and_recorded(
    create, deps, client, store: PgStore, sql, tmp_path
) -> None:
    run_id = create("probe", _probe_input(tmp_path), queue=False)
    sql("UPDATE checkpoints SET version = 7 WHERE run_id = %s", run_id)
    assert loop.run(run_id, deps) == "incompatible"
    assert loop.run(run_id, deps) == "incompatible"  # never silently retried
    assert not (tmp_path / "steps.log").exists()
    status, error, version, seq = sql("SELECT status, error, version, seq FROM checkpoints")[0]
    assert (status, version, seq) == ("incompatible", 7, 0)
    assert "payload version 7" in error
    assert [r.run_id for r in client.list(status="incompatible")] == [run_id]
    with pytest.raises(IncompatibleCheckpoint):
        store.load(run_id)
    # Code that reads it is deployed (here: the row migrated), and the run enqueued again.
    sql("UPDATE checkpoints SET version = 1 WHERE run_id = %s", run_id)
    client.enqueue("probe", _probe_input(tmp_path), run_id=run_id)
    assert loop.run(run_id, deps) == "done"


def test_unknown_workflow_and_bad_input_are_clear() -> None:
    registry.import_modules(["cairn.testing.demos.invoice"])  # as a worker does: alone, nothing has
    with pytest.raises(UnknownWorkflow, match="CAIRN_WORKFLOWS"):
        registry.get("no-such-flow")
    with pytest.raises(InvalidInput, match="email"):
        registry.get("invoice").validate({"customer": "acme", "email": "nope"})
    with pytest.raises(InvalidInput, match="JSON object"):
        registry.get("invoice").validate(["not", "an", "object"])
    for count in (True, 2.0, 0, 51):  # a bool is an int to Python, and not a count
        with pytest.raises(InvalidInput, match="whole number from 1 to 50"):
            registry.get("invoice").validate({"customer": "a", "email": "a@b", "invoices": count})
    assert registry.get("invoice").validate({"customer": "a", "email": "a@b", "invoices": 1})


def test_run_of_unregistered_workflow_fails_with_a_clear_error(deps, store: PgStore) -> None:
    store.create_run("r-x", "ghost", {}, "start")
    assert loop.run("r-x", deps) == "failed"
    cp = store.load("r-x")
    assert cp is not None and "unknown workflow 'ghost'" in (cp.error or "")


def test_model_429_and_529_are_retried_and_the_run_finishes(
    create, deps, store: PgStore, model, tmp_path
) -> None:
    run_id = create("probe", _probe_input(tmp_path), queue=False)
    model.control(fail_next=2, status=429)
    assert loop.run(run_id, deps) == "done"
    model.control(fail_next=1, status=529)
    again = create("probe", {"log": str(tmp_path / "again.log")}, queue=False)
    assert loop.run(again, deps) == "done"
    assert model.stats()["failures"] == 3 and model.stats()["requests"] == 5
    cp = store.load(run_id)
    assert cp is not None and cp.cost_usd > 0


@pytest.mark.parametrize("before", [0, 1, 5])
@pytest.mark.parametrize("added", [0, 1, 3])
def test_the_carried_window_size_equals_the_real_one(before: int, added: int) -> None:
    from cairn.steps.window import grown_size, json_size

    old = [{"role": "user", "content": f"m{i} ünï"} for i in range(before)]
    new = [
        {"role": "assistant", "content": [{"type": "text", "text": f"r{i}"}]} for i in range(added)
    ]
    assert grown_size(json_size(old), len(old), new) == json_size(old + new)


def _round_trips(
    store: PgStore, leases: Leases, tmp_path: Path, run: Callable[[], str]
) -> tuple[int, int]:
    """(Postgres round trips, Redis commands) of run(): from libpq's own protocol trace
    (one ReadyForQuery per round trip), and by counting what the lease client sends (the
    Redis server's counters are shared with every other client)."""
    from psycopg.pq import Trace

    path = tmp_path / f"pq-{uuid.uuid4().hex[:6]}.trace"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    with store.db.connection() as conn:  # the pool's only connection
        conn.pgconn.trace(fd)
        conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)
    sent = []
    send = leases.client.execute_command
    leases.client.execute_command = lambda *a, **k: sent.append(a[0]) or send(*a, **k)
    try:
        assert run() == "done"
    finally:
        del leases.client.execute_command
    with store.db.connection() as conn:
        conn.pgconn.untrace()  # flushes the trace
    lines = path.read_text().splitlines()
    return sum(line.split("\t")[2:3] == ["ReadyForQuery"] for line in lines), len(sent)


def test_a_no_op_step_is_one_postgres_round_trip_and_no_redis_call(
    deps, leases: Leases, tmp_path
) -> None:
    import bench.flows  # noqa: F401  (registers bench_noop)

    # One pooled connection, so the one traced connection sees all the run's traffic.
    store = PgStore(Database(deps.settings.database_url, max_size=1))
    one = dataclasses.replace(deps, store=store)

    def run(steps: int) -> Callable[[], str]:
        run_id = f"noop-{uuid.uuid4().hex[:8]}"
        store.create_run(run_id, "bench_noop", {"steps": steps})
        return lambda: loop.run(run_id, one)

    try:
        run(6)()  # warm: psycopg prepares a statement on its 5th use, in a round trip of its own
        short = _round_trips(store, leases, tmp_path, run(3))
        long = _round_trips(store, leases, tmp_path, run(13))
    finally:
        store.db.close()
    # Ten more steps cost ten more round trips to Postgres (the guarded save, nothing
    # else) and not one Redis command while the lease's renewal is fresh.
    assert (long[0] - short[0], long[1] - short[1]) == (10, 0), (short, long)
    # A run's fixed cost around its steps: the claim, its first and only read (no load
    # before it), and the lease's acquire and release.
    assert short == (1 + 3, 2), short


def test_a_delivery_takes_one_connection_for_its_claim_and_all_its_saves(
    create, deps, store: PgStore
) -> None:
    run_id = create("loop", {"visits": 3}, queue=False)
    store.load(run_id)  # the pool's first connection made, outside the count
    before = store.db.pool.get_stats()["requests_num"]
    assert loop.run(run_id, deps) == "done"
    assert store.db.pool.get_stats()["requests_num"] - before == 1
    cp = store.load(run_id)
    assert cp is not None and cp.seq == 3
