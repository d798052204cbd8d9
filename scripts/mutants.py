"""The mutation gauntlet: break one safety-critical line at a time, run the tests that
must notice, and fail unless every mutant is killed.

    .venv/bin/python scripts/mutants.py              # all mutants, in this checkout
    .venv/bin/python scripts/mutants.py M4 M8        # some of them
    .venv/bin/python scripts/mutants.py --lanes 2    # in two copies side by side (CI)

Each mutant is applied in place and reverted in a `finally`, so it refuses to start on
uncommitted changes to the files it mutates. A mutant's `old` text must occur exactly
once: when the code moves on, the gauntlet fails loudly instead of testing nothing.

With --lanes N the mutants run in N copies of the checkout under .cairn/mutants/, each in
the installed layout (store/, steps/ and workers/ inside cairn/, so `import cairn` from
the copy's root finds the copy's code and never the editable install's), each pytest on
its own share of the servers (CAIRN_TEST_SLOT 1..N). The checkout itself is never
mutated then, so other tests may run beside the gauntlet (scripts/test runs the
PgBouncer pass so).
"""

from __future__ import annotations

import dataclasses
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Mutant:
    id: str
    what: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


SENTINEL = "tests/outages/test_redis_sentinel.py"
REDIS_URL = "tests/unit/test_redis_url.py"
ZOMBIE = "tests/fleet/test_crash.py::test_zombie_after_sigstop_writes_nothing_and_sends_nothing"
SAME_SEQ = "tests/fleet/test_crash.py::test_zombie_at_the_same_seq_commits_no_ctx_db_write"
CLAIM = "tests/integration/test_loop.py::test_claim_fences_the_old_owner_before_the_new_owners_first_save"
COUNTER_LOST = "tests/integration/test_loop.py::test_a_run_whose_epoch_counter_redis_lost_is_leased_above_its_stored_epoch"
COUNTER_ENDS = "tests/integration/test_lease.py::test_the_epoch_counter_expires_and_goes_with_the_lease_of_an_ended_run"
PARALLEL = "tests/integration/test_parallel.py"
JOURNAL_REPLAY = "tests/contract/test_journal.py::test_a_replay_after_a_crash_makes_no_call_twice"
MULTI_HOST = (
    "tests/integration/test_inputs.py::"
    "test_an_unreachable_multi_host_dsn_names_every_host_with_its_port"
)
J = "tests/contract/test_journal.py"
POOL = "tests/integration/test_store.py"
LOST = "tests/integration/test_lost_commit.py"
LG = "tests/integration/test_langgraph.py"
PAUSED_CHARGE = "tests/fleet/test_crash.py::test_a_worker_paused_inside_an_at_most_once_effect_never_makes_it_twice"
OWN_WRITES = "test_the_steps_own_writes_commit_with_the_save_and_roll_back_with_a_rejection"
FENCES = "tests/integration/test_fences.py"
SEAMS = "tests/fleet/test_seams.py"
SEALING = "tests/integration/test_sealing.py"
COLUMNS = "tests/integration/test_sealed_columns.py"
NO_CLEAR = f"{COLUMNS}::test_no_payload_is_left_in_clear_in_any_column"
KEY_MISSING = "tests/integration/test_key_missing.py"
KEY_DEPLOY = "tests/fleet/test_key_deploy.py::test_a_key_deployed_in_either_order_finishes_every_run_in_flight"
STORE = "tests/contract/test_store_contract.py"
PAI = "tests/integration/test_pydantic_ai.py"
OA = "tests/integration/test_openai_agents.py"
CUT = "test_an_interrupting_message_cuts_the_request_in_flight_and_it_is_made_again_with_it"
PINNED = "tests/integration/test_pinned.py::test_a_pinned_runs_resume_goes_to_its_versions_queue_and_another_version_reroutes_it"
LG_ZOMBIE = (
    "test_a_zombie_paused_inside_a_langgraph_put_neither_forks_the_thread_nor_runs_a_node_twice"
)
PROVIDERS = "tests/integration/test_providers.py"
WAITS = "tests/integration/test_wait_many.py"
DEBOUNCE = "tests/contract/test_store_contract.py"
DEBOUNCE_FLEET = "tests/fleet/test_debounce.py"
BUDGETS = "tests/integration/test_budgets.py"
APPROVALS = "tests/contract/test_approvals.py"
RATE = "tests/integration/test_ratelimit.py"
WEB_STREAM = "tests/fleet/test_web_stream.py"
TENANT_APPROVALS = "test_a_tenant_sees_and_decides_its_own_approvals_only_and_its_rules_are_its_own"
TENANCY = "tests/contract/test_tenancy.py"
TENANTS_API = "tests/integration/test_tenants_api.py"
TX_STATES = "tests/integration/test_transactional_states.py"
DEPLOY_WAITS = "tests/integration/test_deploy_check_waits.py"
FENCED_TRIES = "tests/integration/test_fenced_tries.py"
BACK_OFF = "test_a_lease_lost_in_a_retrys_back_off_lets_no_further_request_out"
FENCED_FLEET = "tests/fleet/test_fenced_tries.py::test_a_worker_paused_in_a_wait_between_tries_sends_nothing_once_resumed"
WEB_SESSIONS = "tests/integration/test_web_sessions.py"
ATTACKS = "tests/fleet/test_web_attacks.py"
LOGIN_CSRF = "test_a_login_posted_by_another_origin_does_not_log_the_admin_in_as_the_attacker"
LOGOUT = "test_a_session_is_random_kept_as_its_hash_and_ended_by_logout"

MUTANTS = [
    Mutant(
        "M1",
        "save without the epoch guard",
        "store/sql/queries.sql",
        "WHERE c.seq < EXCLUDED.seq AND c.epoch <= EXCLUDED.epoch",
        "WHERE c.seq < EXCLUDED.seq",
        (CLAIM,),
    ),
    Mutant(
        "M2",
        "save without the seq guard",
        "store/sql/queries.sql",
        "WHERE c.seq < EXCLUDED.seq AND c.epoch <= EXCLUDED.epoch",
        "WHERE c.epoch <= EXCLUDED.epoch",
        ("tests/integration/test_store.py::test_older_writer_is_rejected_and_row_not_rewound",),
    ),
    Mutant(
        "M3",
        "claim does not raise the stored epoch",
        "store/sql/queries.sql",
        "       SET epoch = %(epoch)s, retry_at = NULL, updated_at = now(),",
        "       SET epoch = epoch, retry_at = NULL, updated_at = now(),",
        (CLAIM,),
    ),
    Mutant(
        "M4",
        "the worker skips claim",
        "workers/loop.py",
        "claimed = store.claim(run_id, lease.epoch, version, registry.pinned())",
        "claimed = store.load(run_id)",
        (CLAIM,),
    ),
    Mutant(
        "M5",
        "a rejected save commits the step's ctx.db writes",
        "store/checkpoints.py",
        "row = opened(conn).execute(query, params).fetchone()\n                if row is not None:\n"
        "                    conn.commit()\n                else:\n                    conn.rollback()",
        "row = opened(conn).execute(query, params).fetchone()\n                if row is not None:\n"
        "                    conn.commit()\n                else:\n                    conn.commit()",
        (f"tests/integration/test_store.py::{OWN_WRITES}",),
    ),
    Mutant(
        "M6",
        "no lease check before a keyed effect",
        "steps/context.py",
        "        self.ensure_owner()  # a worker that lost the run, or a cancelled run, must not reach it",
        "        pass",
        (f"{ZOMBIE}[prefork-mail]", f"{ZOMBIE}[threads-mail]"),
    ),
    Mutant(
        "M7",
        "no lease check before a journaled call (ctx.call, ctx.model): a worker that lost "
        "its run while paused before a call runs its tool (the model request alone is "
        "still fenced at the transport, M112)",
        "steps/context.py",
        "        self._lease.ensure()\n        self._check_cancel(CANCEL_FRESH)",
        "        self._check_cancel(CANCEL_FRESH)",
        (f"{FENCED_TRIES}::test_a_lease_lost_before_a_journaled_call_stops_it_before_it_starts",),
    ),
    Mutant(
        "M8",
        "no lease check before the save",
        "workers/loop.py",
        "        lease.ensure()  # last chance to stop before a write that would be fenced anyway",
        "        pass",
        (SAME_SEQ,),
    ),
    Mutant(
        "M9",
        "the lease check trusts the cached renewal forever",
        "store/lease.py",
        "        if age < self.ttl / 2 and not fresh:\n            return",
        "        if True:\n            return",
        ("tests/integration/test_lease.py::test_ensure_asks_redis_once_the_last_renewal_is_old",),
    ),
    Mutant(
        "M10",
        "enqueueing a failed run again does not re-arm it",
        "store/checkpoints.py",
        '        self.db.one("rearm_failed", {"run_id": run_id})',
        "        pass",
        ("tests/integration/test_loop.py::test_enqueueing_a_failed_run_again_rearms_it",),
    ),
    Mutant(
        "M11",
        "the effect key counts attempts, not visits",
        "steps/context.py",
        'base = frame.key if frame else f"cairn:{self.run_id}:{self.cursor}:{self.visit}"',
        'base = frame.key if frame else f"cairn:{self.run_id}:{self.cursor}:{id(self)}"',
        ("tests/fleet/test_crash.py::test_email_step_killed_after_sending_delivers_once",),
    ),
    Mutant(
        "M12",
        "the ledger is not consulted (ctx.once repeats its effect)",
        "steps/context.py",
        "        done, result = self._store.was_done(key)",
        "        done, result = False, None",
        (
            "tests/fleet/test_crash.py::test_ledger_keeps_an_effect_without_idempotency_from_repeating",
        ),
    ),
    Mutant(
        "M16",
        "the reaper re-enqueues a run whose retry is scheduled",
        "store/sql/queries.sql",
        "       END\n       AND (c.retry_at IS NULL\n"
        "            OR c.retry_at < now() - make_interval(secs => %(running_after)s)) AS stale",
        "       END AS stale",
        (
            "tests/contract/test_store_contract.py::test_a_run_with_a_retry_scheduled_is_left_alone_until_it_is_overdue",
            "tests/fleet/test_lifecycle.py::test_a_failing_run_is_delivered_a_bounded_number_of_times",
        ),
    ),
    Mutant(
        "M17",
        "an effect is not checked against a cancel",
        "steps/context.py",
        "        self._cancelled(self._store.cancel_reason(self.run_id), asked)",
        "        self._cancelled(None, asked)",
        (
            "tests/fleet/test_lifecycle.py::test_cancel_a_running_run_stops_it_before_its_next_effect",
        ),
    ),
    Mutant(
        "M18",
        "the budget is not checked before a model call",
        "steps/context.py",
        "        if spent + worst > self._cap:",
        "        if False:",
        (
            "tests/integration/test_lifecycle.py::test_a_run_stops_before_the_model_call_that_would_pass_its_budget",
        ),
    ),
    Mutant(
        "M19",
        "a save does not tell a new wait that its signal came first",
        "store/sql/queries.sql",
        "              AND s.consumed_seq IS NULL AND s.signal_id IS DISTINCT FROM %(consumed)s",
        "              AND false",
        (
            "tests/integration/test_lifecycle.py::test_a_signal_sent_before_the_run_waits_is_not_lost",
        ),
    ),
    Mutant(
        "M20",
        "ctx.once trusts the cached renewal right before its effect",
        "store/lease.py",
        "        if age < self.ttl / 2 and not fresh:",
        "        if age < self.ttl / 2:",
        (
            "tests/integration/test_lease.py::test_a_fresh_check_asks_redis_even_right_after_a_renewal",
        ),
    ),
    Mutant(
        "M21",
        "a step that appended messages saves them with save_plain (they are lost)",
        "store/rows.py",
        "    if messages or attempt.signal_id is not None or spawn is not None:",
        "    if attempt.signal_id is not None or spawn is not None:",
        (
            "tests/integration/test_store.py::test_plain_and_full_saves_interleave_and_record_every_step",
        ),
    ),
    Mutant(
        "M13",
        "the lease epoch ignores the stored floor",
        "store/lua/acquire.lua",
        "if epoch <= floor then",
        "if false then",
        ("tests/integration/test_lease.py::test_epoch_grows_and_respects_the_stored_floor",),
    ),
    Mutant(
        "M14",
        "release deletes a successor's lease",
        "store/lua/release.lua",
        "if redis.call('GET', KEYS[1]) == ARGV[1] then",
        "if true then",
        ("tests/integration/test_lease.py::test_release_never_deletes_a_successors_lease",),
    ),
    Mutant(
        "M22",
        "a run whose epoch counter is gone is leased again without the stored floor",
        "workers/loop.py",
        "                lease = _acquire(run_id, cp.epoch, deps)",
        "                lease = _acquire(run_id, 0, deps)",
        (COUNTER_LOST,),
    ),
    Mutant(
        "M23",
        "an ended run's release deletes the epoch counter without holding the lease",
        "store/lua/release.lua",
        "if redis.call('GET', KEYS[1]) == ARGV[1] then\n  redis.call('ZREM', KEYS[2], ARGV[2])",
        "if KEYS[3] then redis.call('DEL', KEYS[3]) end\n"
        "if redis.call('GET', KEYS[1]) == ARGV[1] then\n  redis.call('ZREM', KEYS[2], ARGV[2])",
        (COUNTER_ENDS,),
    ),
    Mutant(
        "M24",
        "a journal record is not fenced (a worker that lost the run still records)",
        "store/sql/queries.sql",
        "     WHERE c.run_id = %(run_id)s AND c.seq = %(seq)s AND c.epoch <= %(epoch)s\n"
        "       FOR SHARE OF c\n    ON CONFLICT (run_id, cursor, visit, pos, run_created)",
        "     WHERE c.run_id = %(run_id)s\n       FOR SHARE OF c\n"
        "    ON CONFLICT (run_id, cursor, visit, pos, run_created)",
        ("tests/contract/test_journal.py::test_a_worker_that_lost_the_run_records_nothing[pg]",),
    ),
    Mutant(
        "M25",
        "the journal is ignored on replay (calls are made again)",
        "steps/journal.py",
        "            v.records = {c.pos: c for c in self._store.journal(",
        "            v.records = {} if True else {c.pos: c for c in self._store.journal(",
        (
            f"{JOURNAL_REPLAY}[memory-journal-agent-5]",
            f"{JOURNAL_REPLAY}[pg-journal-agent-async-5]",
        ),
    ),
    Mutant(
        "M26",
        "a journal record retried after a lost reply reads as fenced",
        "store/sql/queries.sql",
        " WHERE j.epoch = EXCLUDED.epoch AND j.name = EXCLUDED.name",
        " WHERE false",
        (
            "tests/contract/test_store_contract.py::test_a_journal_record_is_fenced_like_a_save[pg]",
            f"{LOST}::test_a_journal_record_whose_commit_reply_was_lost_is_still_recorded",
        ),
    ),
    Mutant(
        "M27",
        "an at-most-once effect's open intent is not checked (the replay runs it again)",
        "steps/context.py",
        '        return key, False, _UNKNOWN if state == "open" else None',
        "        return key, False, None",
        (f"{J}::test_an_effect_whose_outcome_was_lost_is_never_run_again[memory]", PAUSED_CHARGE),
    ),
    Mutant(
        "M28",
        "an intent is not fenced (a worker that lost the run still charges)",
        "store/sql/queries.sql",
        " WHERE c.run_id = %(run_id)s AND c.seq = %(seq)s AND c.epoch <= %(epoch)s\n"
        "   FOR SHARE OF c\nON CONFLICT (key)",
        " WHERE c.run_id = %(run_id)s\n   FOR SHARE OF c\nON CONFLICT (key)",
        (f"{J}::test_a_worker_that_lost_the_run_writes_no_intent_and_makes_no_charge[pg]",),
    ),
    Mutant(
        "M29",
        "an intent retried after a lost reply reads as another worker's (outcome unknown)",
        "store/sql/queries.sql",
        " WHERE e.epoch = EXCLUDED.epoch AND NOT e.done",
        " WHERE false",
        (
            "tests/contract/test_store_contract.py::test_an_intent_is_fenced_and_found_open_until_its_mark[pg]",
            f"{LOST}::test_an_intent_whose_commit_reply_was_lost_is_still_this_writers",
        ),
    ),
    Mutant(
        "M30",
        "a save retried after a lost commit reply is taken for a stale write",
        "store/checkpoints.py",
        "        if tries > 1:",
        "        if False:",
        (f"{LOST}::test_a_save_whose_commit_reply_was_lost_is_still_saved",),
    ),
    Mutant(
        "M31",
        "a ctx.db write inside a journaled call commits apart from the call's record",
        "store/checkpoints.py",
        "        conn = tx.open if tx is not None else None\n        params[",
        "        conn = None\n        params[",
        (f"{J}::test_ctx_db_in_a_call_commits_with_the_calls_record",),
    ),
    Mutant(
        "M32",
        "a LangGraph checkpoint put inside a run is not fenced by the run's epoch",
        "store/sql/queries.sql",
        "  FROM checkpoints WHERE run_id = %(run_id)s AND epoch = %(epoch)s FOR SHARE;",
        "  FROM checkpoints WHERE run_id = %(run_id)s FOR SHARE;",
        (f"{LG}::test_a_worker_that_lost_the_run_cannot_write_the_threads_next_checkpoint",),
    ),
    Mutant(
        "M33",
        "a LangGraph checkpoint put inside a run may fork its thread",
        "store/sql/queries.sql",
        "       IS NOT DISTINCT FROM %(parent_id)s::text",
        "       IS NOT NULL OR true",
        (f"{LG}::test_inside_a_run_a_put_must_extend_the_thread_outside_a_fork_is_fine",),
    ),
    Mutant(
        "M34",
        "a LangGraph node's journaled calls share the step's journal places",
        "cairn/contrib/langgraph.py",
        '        return ctx.scope(_UNSAFE.sub("_", name)[:100])',
        "        return contextlib.nullcontext()",
        (f"{LG}::test_a_node_resumed_from_the_checkpoint_finds_its_own_journal_records",),
    ),
    Mutant(
        "M35",
        "a worker that lost the run still writes its events",
        "store/lua/emit.lua",
        "  if stale or (flag == 'f' and held ~= ARGV[1]) or (flag == 'g' and held and held ~= ARGV[1]) then",
        "  if stale then",
        ("tests/integration/test_events.py::test_a_worker_that_lost_the_run_writes_no_event",),
    ),
    Mutant(
        "M36",
        "a worker that takes a run over does not mark the cut attempt abandoned",
        "workers/announce.py",
        "        if tail.newest is not None and not told and tail.newest_kind not in ENDS_ATTEMPT:",
        "        if False:",
        (
            "tests/integration/test_events.py::test_an_attempt_cut_short_is_marked_abandoned_by_the_next",
        ),
    ),
    Mutant(
        "M15",
        "renewal extends another owner's lease",
        "store/lua/renew.lua",
        "if held == ARGV[1] then",
        "if held then",
        ("tests/integration/test_lease.py::test_heartbeat_keeps_it_and_loss_is_detected",),
    ),
    Mutant(
        "M37",
        "a stopped run with a concurrency key does not send the key's next run",
        "workers/loop.py",
        "            flow_control.send_admitted(cp, deps)\n",
        "\n",
        (
            "tests/unit/test_concurrency.py::test_a_keys_runs_are_sent_one_at_a_time_each_once_as_slots_free",
        ),
    ),
    Mutant(
        "M38",
        "a worker claims a run queued for its concurrency key (over the key's limit)",
        "store/sql/queries.sql",
        "                          'unknown', 'queued')",
        "                          'unknown')",
        (
            "tests/contract/test_store_contract.py::test_a_concurrency_key_admits_up_to_its_limit_and_queues_the_rest",
        ),
    ),
    Mutant(
        "M39",
        "a rewound run replays its steps under their old visit numbers (old idempotency keys)",
        "store/sql/queries.sql",
        "visits = visits.v, win_start = snap.win_start",
        "visits = snap.visits, win_start = snap.win_start",
        (
            "tests/integration/test_fork.py::test_a_failed_run_rewound_to_step_2_finishes_with_new_visit_numbers",
        ),
    ),
    Mutant(
        "M40",
        "a journal record's fence is a plain read (a record checked before a claim commits after it)",
        "store/sql/queries.sql",
        "       FOR SHARE OF c\n    ON CONFLICT (run_id, cursor, visit, pos, run_created)",
        "    ON CONFLICT (run_id, cursor, visit, pos, run_created)",
        (
            f"{FENCES}::test_a_claim_waits_for_a_fenced_write_in_flight_which_lands_before_it[record_call]",
        ),
    ),
    Mutant(
        "M41",
        "an intent's fence is a plain read",
        "store/sql/queries.sql",
        "   FOR SHARE OF c\nON CONFLICT (key)",
        "ON CONFLICT (key)",
        (
            f"{FENCES}::test_a_claim_waits_for_a_fenced_write_in_flight_which_lands_before_it[record_intent]",
        ),
    ),
    Mutant(
        "M42",
        "a done mark is not fenced (a zombie's late mark overwrites what an operator resolves)",
        "store/sql/queries.sql",
        "     WHERE c.run_id = %(run_id)s AND c.seq = %(seq)s AND c.epoch <= %(epoch)s\n"
        "       FOR SHARE\n), marked AS",
        "     WHERE c.run_id = %(run_id)s\n       FOR SHARE\n), marked AS",
        (
            "tests/contract/test_store_contract.py::test_a_done_mark_is_fenced_like_every_write_of_a_step[pg]",
            PAUSED_CHARGE,
        ),
    ),
    Mutant(
        "M43",
        "a LangGraph put's fence is a plain read (a paused put commits after the claim: a fork)",
        "store/sql/queries.sql",
        "  FROM checkpoints WHERE run_id = %(run_id)s AND epoch = %(epoch)s FOR SHARE;",
        "  FROM checkpoints WHERE run_id = %(run_id)s AND epoch = %(epoch)s;",
        (
            f"{SEAMS}::{LG_ZOMBIE}[lg_mail-before_its_hold]",
            f"{FENCES}::test_a_claim_waits_for_a_fenced_write_in_flight_which_lands_before_it[graph_put]",
        ),
    ),
    Mutant(
        "M44",
        "a fenced transaction may sit idle without end (a paused zombie holds the claim forever)",
        "store/sql/queries.sql",
        "SELECT set_config('idle_in_transaction_session_timeout', %(hold)s, true)\n  FROM",
        "SELECT set_config('application_name', %(hold)s, true)\n  FROM",
        (
            f"{FENCES}::test_a_fenced_transaction_left_idle_is_ended_after_hold_and_the_claim_goes_on[graph_fence]",
            f"{SEAMS}::{LG_ZOMBIE}[lg_mail_list-after_its_hold]",
        ),
    ),
    Mutant(
        "M45",
        "a worker that takes a run over calls a committed step abandoned",
        "workers/announce.py",
        '            if h["outcome"] == "saved":',
        "            if False:",
        (
            "tests/integration/test_events.py::test_a_step_saved_just_before_its_worker_died_is_told_late_never_abandoned",
            f"{SEAMS}::test_a_worker_killed_between_a_steps_commit_and_its_events_leaves_a_truthful_stream[two]",
        ),
    ),
    Mutant(
        "M46",
        "an older writer's events are added after a newer epoch took the stream over",
        "store/lua/emit.lua",
        "local stale = writer < newest",
        "local stale = false",
        (
            "tests/contract/test_events_contract.py::test_a_worker_that_takes_the_stream_over_fences_every_older_writer[redis]",
        ),
    ),
    Mutant(
        "M47",
        "a stream started again mid-run serves a reader from the start as if whole",
        "cairn/client/events.py",
        "    if after is None and not info.origin:",
        "    if False:",
        (
            "tests/integration/test_events.py::test_a_stream_started_again_mid_run_gives_a_reader_from_the_start_a_gap_and_ids",
        ),
    ),
    Mutant(
        "M50",
        "a cancel is an Exception: a step's `except Exception` swallows it and goes on",
        "cairn/core/errors.py",
        "class Cancelled(StepStopped):",
        "class Cancelled(CairnError):",
        (
            "tests/unit/test_loop_memory.py::test_a_cancel_is_not_swallowed_by_a_steps_except_exception",
        ),
    ),
    Mutant(
        "M51",
        "a lost lease is an Exception: a zombie's `except Exception` goes on making calls",
        "cairn/core/errors.py",
        "class Superseded(StepStopped):",
        "class Superseded(Interrupted):",
        (
            "tests/unit/test_loop_memory.py::test_a_lost_lease_is_not_swallowed_by_a_steps_except_exception",
        ),
    ),
    Mutant(
        "M49",
        "the reaper ignores a delivery that never let go of its run (a done run's stream untold)",
        "workers/reaper.py",
        "            sent += self._offer(page, {})\n",
        "            sent += self._offer([], {})\n",
        (
            "tests/unit/test_reaper.py::test_a_delivery_that_never_let_go_of_its_run_is_sent_again_whatever_its_status",
            f"{SEAMS}::test_a_worker_killed_between_a_steps_commit_and_its_events_leaves_a_truthful_stream[three-whole-worker]",
        ),
    ),
    Mutant(
        "M48",
        "a reader resuming inside the durable record gets it again from its start",
        "cairn/client/events.py",
        "            return Opening(pos, skip=int(told))",
        "            return Opening(pos, skip=0)",
        (
            "tests/integration/test_events.py::test_a_stream_started_again_mid_run_gives_a_reader_from_the_start_a_gap_and_ids",
        ),
    ),
    Mutant(
        "M52",
        "an OpenAI 429 is permanent: the run fails where an Anthropic one is retried",
        "steps/providers/openai.py",
        'return exc.code != "insufficient_quota"  # a spent quota waits for a person',
        "return False",
        (
            f"{PROVIDERS}::test_429_and_5xx_are_retried_until_answered[create-429-chat]",
            f"{PROVIDERS}::test_429_and_5xx_are_retried_until_answered[stream-429-responses]",
        ),
    ),
    Mutant(
        "M53",
        "the rate limiter's key leaves the provider out: two providers' models share a bucket",
        "store/ratelimit.py",
        'return f"{keys.PREFIX}:ratelimit:{provider}:{bucket}:{who}"',
        'return f"{keys.PREFIX}:ratelimit:{bucket}:{who}"',
        (f"{PROVIDERS}::test_a_limit_is_per_provider_model_and_key",),
    ),
    Mutant(
        "M54",
        "OpenAI's cached prompt tokens priced at the full input price",
        "steps/prices.py",
        "cache_write=input, cache_write_1h=input, cache_read=cached",
        "cache_write=input, cache_write_1h=input, cache_read=input",
        (
            f"{PROVIDERS}::test_cached_and_reasoning_tokens_are_priced_as_each_provider_bills_them[chat]",
        ),
    ),
    Mutant(
        "M55",
        "OpenAI's x-ratelimit-* headers unread: the fleet backs off only after a 429 of its own",
        "steps/providers/openai.py",
        'h = "x-ratelimit-"',
        'h = "x-unread-"',
        (f"{PROVIDERS}::test_the_providers_limit_headers_back_the_whole_fleet_off[chat]",),
    ),
    Mutant(
        "M56",
        "Anthropic's rate-limit error event mid-stream is permanent (OpenAI's is retried)",
        "steps/providers/anthropic.py",
        '{"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}',
        '{"overloaded_error", "api_error", "timeout_error"}',
        (
            f"{PROVIDERS}::test_an_error_reported_after_a_stream_began_is_retried_alike[429-anthropic]",
        ),
    ),
    Mutant(
        "M57",
        "a retry-after past give_up_after is slept out: the worker held for the minute",
        "steps/model.py",
        "stop=stop_before_delay(self.give_up_after),",
        'stop=__import__("tenacity").stop_after_delay(self.give_up_after),',
        (f"{PROVIDERS}::test_a_retry_after_is_honoured_and_bounded[chat]",),
    ),
    Mutant(
        "M58",
        "a wake sent twice: the wake pass without its guard (no row lock, no status re-check)",
        "store/sql/queries.sql",
        "                  FOR UPDATE SKIP LOCKED))\n       AND c.status = 'waiting'",
        "                  ))",
        ("tests/contract/test_store_contract.py::test_two_wakers_at_once_wake_a_run_once[pg]",),
    ),
    Mutant(
        "M59",
        "an Agents SDK session's items commit before the step's save: a killed turn leaves them",
        "store/sessions.py",
        '        conn.execute(QUERIES["agent_session_add"], params)',
        '        conn.execute(QUERIES["agent_session_add"], params)\n        conn.commit()',
        (
            "tests/integration/test_openai_agents.py::test_a_turn_killed_or_fenced_before_its_save_leaves_no_item",
        ),
    ),
    Mutant(
        "M60",
        "gathered calls take their journal places in completion order, not at call start",
        "steps/journal.py",
        "        pos, n, recorded = self._begin(name, max_cost)\n        if recorded is not None:\n            return self._replay(recorded)  # type: ignore[no-any-return]\n        token = self._enter(name, pos, n)\n\n        async def made(_: Cut | None = None) -> Any:\n            result = fn(*args, **kwargs)\n            return (await result) if inspect.isawaitable(result) else result\n",
        "        early = fn(*args, **kwargs)\n        early = (await early) if inspect.isawaitable(early) else early\n        pos, n, recorded = self._begin(name, max_cost)\n        if recorded is not None:\n            return self._replay(recorded)  # type: ignore[no-any-return]\n        token = self._enter(name, pos, n)\n\n        async def made(_: Cut | None = None) -> Any:\n            return early\n",
        (f"{PARALLEL}::test_gathered_calls_take_their_places_in_program_order_and_replay_so",),
    ),
    Mutant(
        "M61",
        "ctx.parallel's calls take their journal places in completion order",
        "steps/journal.py",
        "        def made(i: int) -> Any:\n            name, fn, args = todo[i]\n            pos, n, _ = begun[i]\n            token = self._enter(name, pos, n)\n            try:\n                result = fn(*args)\n",
        "        finished = iter(sorted(begun[i][:2] for i in fresh))  # k-th to end: k-th place\n\n        def made(i: int) -> Any:\n            name, fn, args = todo[i]\n            early = fn(*args)\n            pos, n = next(finished)\n            token = self._enter(name, pos, n)\n            try:\n                result = early\n",
        (f"{PARALLEL}::test_places_are_taken_in_program_order_whatever_order_the_calls_finish",),
    ),
    Mutant(
        "M62",
        "a transactional enqueue sends its run before the caller commits",
        "cairn/client/runs.py",
        "                )  # fmt: skip\n                return run_id\n",
        "                )  # fmt: skip\n                self.send(run_id, priority=prio)\n                return run_id\n",
        (
            "tests/integration/test_transactional_enqueue.py::test_a_rolled_back_enqueue_leaves_no_run_and_sends_nothing",
        ),
    ),
    Mutant(
        "M80",
        "a journaled call's record ignores the cancel its statement read",
        "steps/journal.py",
        "        self._cancelled(recorded.cancel_reason, asked)",
        "        self._cancel_read = asked",
        (f"{J}::test_an_async_step_is_stopped_by_cancel_and_budget_as_a_sync_one",),
    ),
    Mutant(
        "M81",
        "the check before a journaled call stands on a read of any age",
        "steps/context.py",
        "        if read is not None and time.monotonic() - read < fresh:",
        "        if read is not None and fresh > 0:",
        (f"{J}::test_a_cancel_older_than_the_last_read_stops_the_next_call_before_it_starts",),
    ),
    Mutant(
        "M82",
        "a record that commits a call's own ctx.db writes does not wait for the disk",
        "store/checkpoints.py",
        '        params["commit"] = "off" if conn is None else None',
        '        params["commit"] = "off"',
        (
            "tests/integration/test_store.py::test_a_record_alone_commits_without_waiting_for_the_disk_and_one_with_writes_waits",
        ),
    ),
    Mutant(
        "M83",
        "`cairn deploy check` takes a reordered call for a good one",
        "workers/deploycheck.py",
        "        return went(ctx._calls - 1, problem=str(exc))",
        "        return went(ctx._calls - 1)",
        (
            "tests/integration/test_deploy_check.py::test_the_check_names_each_run_new_code_would_break",
        ),
    ),
    Mutant(
        "M84",
        "`cairn deploy check` makes the calls its record lacks",
        "workers/deploycheck.py",
        '        raise _Beyond("a new call")  # the record holds no call at this place',
        "        super()._ensure_before_call()",
        (
            "tests/integration/test_deploy_check.py::test_the_check_names_each_run_new_code_would_break",
        ),
    ),
    Mutant(
        "M85",
        "a step renamed by a deploy mid-visit goes on under its new name (new keys)",
        "workers/loop.py",
        "        begun_as = renamed_from(claimed.cursor, cp.cursor, flow)",
        "        begun_as = None",
        (
            "tests/integration/test_deploy_check.py::test_a_step_renamed_while_a_run_is_inside_it_goes_on_with_nothing_made_twice",
        ),
    ),
    Mutant(
        "M70",
        "the waits' listening connection, back after a drop, does not read the waited runs again",
        "store/waits.py",
        "            self._fresh = [w for ws in self._waiters.values() for w in ws]\n",
        "            pass\n",
        (f"{WAITS}::test_waiters_wake_for_runs_that_stopped_while_their_connection_was_down",),
    ),
    Mutant(
        "M71",
        "a notification that comes while the waits' listener sleeps wakes nobody (waits poll)",
        "store/waits.py",
        "                self._heard.add(n.relname.decode())\n",
        "                pass\n",
        ("tests/integration/test_wait.py::test_wait_is_woken_by_the_status_change_not_by_polling",),
    ),
    Mutant(
        "M86",
        "a run found cancelled stops before its stream is told what its dead worker saved",
        "workers/loop.py",
        "            stream.take_over(claimed, store)\n        if _idle_wake(cp, deps):\n"
        "            return RunStatus.WAITING\n",
        "            pass\n        if _idle_wake(cp, deps):\n            return RunStatus.WAITING\n"
        "        stream.take_over(claimed, store)\n",
        (
            "tests/fleet/test_seams.py::test_a_run_cancelled_after_its_worker_died_between_a_commit_and_its_events_tells_both",
        ),
    ),
    Mutant(
        "M63",
        "a debounce that starts two runs: the key is not stored, so no enqueue meets another",
        "store/sql/queries.sql",
        "now() + make_interval(secs => %(debounce)s), %(workflow)s, %(key)s)",
        "now() + make_interval(secs => %(debounce)s), %(workflow)s, NULL)",
        (f"{DEBOUNCE}::test_two_debounced_enqueues_racing_make_one_run", DEBOUNCE_FLEET),
    ),
    Mutant(
        "M64",
        "a stream of debounced enqueues puts the start off for ever (max_wait ignored)",
        "store/sql/queries.sql",
        "c.created_at + make_interval(secs => %(max_wait)s)),",
        "NULL),",
        (
            f"{DEBOUNCE}::test_debounced_enqueues_collapse_into_one_run_that_wakes_once_with_the_latest_input",
        ),
    ),
    Mutant(
        "M87",
        "a replayed ctx.messages() reads the messages not yet delivered instead of those its "
        "journal record names: the messages it got are lost, the next ones come early",
        "steps/journal.py",
        "            return [m for _, m in self._store.steers(self.run_id, numbers)]",
        "            return [m for _, m in self._store.steers_pending(self.run_id)]",
        ("tests/contract/test_steering.py", "tests/fleet/test_steering.py"),
    ),
    Mutant(
        "M88",
        "a steer message delivered again: the last one a read got counts as undelivered",
        "store/sql/queries.sql",
        " WHERE run_id = %(run_id)s AND n > (",
        " WHERE run_id = %(run_id)s AND n >= (",
        ("tests/contract/test_steering.py",),
    ),
    Mutant(
        "M89",
        "a payload column written in clear with CAIRN_PAYLOAD_KEYS set",
        "cairn/core/sealing.py",
        "        return _JSON.encode(keys.seal(value))",
        "        return _JSON.encode(value)",
        (f"{SEALING}::test_every_payload_is_sealed_in_both_servers_and_opens_for_the_reader",),
    ),
    Mutant(
        "M90",
        "event data written to Redis in clear with CAIRN_PAYLOAD_KEYS set",
        "cairn/core/events.py",
        '"data": sealing.dump(data) if data is not None else None,',
        '"data": data,',
        (f"{SEALING}::test_every_payload_is_sealed_in_both_servers_and_opens_for_the_reader",),
    ),
    Mutant(
        "M91",
        "a worker claims a run pinned to another code version, and goes on with it there",
        "store/sql/queries.sql",
        "AND (NOT pinned OR started_version = %(code_version)s::text)",
        "AND (true OR started_version = %(code_version)s::text)",
        (PINNED,),
    ),
    Mutant(
        "M92",
        "a pinned run's resume (a wake, a retry, the reaper's) sent to the shared queue, not "
        "to its version's: it waits for a misroute, or for ever once only its version drains",
        "workers/app.py",
        "        if version is None:\n            return broker.RESUME\n",
        "        if True:\n            return broker.RESUME\n",
        (PINNED,),
    ),
    Mutant(
        "M93",
        "a tenant's Client reads another tenant's run (get without the tenant check)",
        "cairn/client/tenancy.py",
        """    "get": Decision(Who.OWN, "another tenant's run is none", answer=True),""",
        """    "get": Decision(Who.OWN, "another tenant's run is none"),""",
        ("tests/integration/test_tenants_api.py::test_every_route_hides_another_tenants_run",),
    ),
    Mutant(
        "M94",
        "a tenant's list of runs without its tenant filter",
        "store/sql/queries.sql",
        " WHERE r.tenant = %(tenant)s\n   AND (%(workflow)s::text IS NULL",
        " WHERE %(tenant)s::text IS NOT NULL\n   AND (%(workflow)s::text IS NULL",
        (
            "tests/contract/test_tenants.py::test_a_run_keeps_its_tenant_and_lists_and_counts_are_the_tenants",
        ),
    ),
    Mutant(
        "M99",
        "a call cut by a steer message is not journaled: the replay makes it again",
        "steps/journal.py",
        "        if isinstance(exc, CallInterrupted):  # a cut is kept: a replay is cut at its place\n"
        "            return True",
        "        if isinstance(exc, CallInterrupted):  # a cut is kept: a replay is cut at its place\n"
        "            return False",
        (
            "tests/contract/test_steering.py::test_a_replay_meets_the_cut_without_calling_again",
            "tests/fleet/test_steering.py",
        ),
    ),
    Mutant(
        "M100",
        "a steer message with interrupt=True stored without its NOTIFY: no call is cut",
        "store/checkpoints.py",
        'names = ("steer_lock", "steer_insert") + (("steer_notify",) if interrupt else ())',
        'names = ("steer_lock", "steer_insert")',
        ("tests/contract/test_steering.py",),
    ),
    Mutant(
        "M101",
        "a pydantic-ai agent reads its steer messages outside the journal: a replay takes "
        "them in again, and the next read too",
        "cairn/contrib/pydantic_ai.py",
        "        for message in await asyncio.to_thread(step.messages):",
        "        for message in [m for _, m in step._store.steers_pending(step.run_id)]:",
        (f"{PAI}::test_a_steer_message_reaches_the_agent_s_next_request_once_across_a_kill",),
    ),
    Mutant(
        "M102",
        "a tenant's approvals inbox lists every tenant's approvals",
        "store/sql/queries.sql",
        "   AND (%(tenant)s::text IS NULL OR a.tenant = %(tenant)s)\n\n-- name: approvals_newest",
        "\n-- name: approvals_newest",
        (f"{APPROVALS}::{TENANT_APPROVALS}",),
    ),
    Mutant(
        "M103",
        "a tenant's budget never rolls: a new UTC day (or month) keeps the last one's spend, "
        "so the tenant's runs stay stopped over a budget that should have started again",
        "store/sql/queries.sql",
        "   SET spent_usd = 0, spent_tokens = 0, period_start = {{period_now}}",
        "   SET period_start = {{period_now}}",
        (f"{J}::test_a_tenants_budget_starts_again_each_day",),
    ),
    Mutant(
        "M107",
        "the wake pass re-arms a run stopped over its tenant's budget in the day that stopped "
        "it: each pass sends it again, and each claim stops it again, all day",
        "store/sql/queries.sql",
        "       AND c.updated_at < coalesce(n.period_start, b.period_start)\n",
        "",
        (f"{J}::test_a_tenants_runs_stopped_over_its_budget_go_on_by_themselves_in_the_new_day",),
    ),
    Mutant(
        "M108",
        "a pool of one connection is held by a delivery's thread: its async steps' and "
        "parallel calls' records, made on other threads, wait for the pool's timeout",
        "store/db.py",
        'if getattr(self._held, "slot", None) is not None or self.pool.max_size < 2:',
        'if getattr(self._held, "slot", None) is not None:',
        (f"{POOL}::test_a_pool_of_one_holds_nothing_so_other_threads_are_not_kept_waiting",),
    ),
    Mutant(
        "M110",
        "a tenant's budget deleted without the re-arm: the runs it stopped as "
        "budget_exceeded stay stopped, though no limit stands over them any more",
        "store/checkpoints.py",
        'got = self._rearmed("delete_tenant_budget", "rearm_tenant_budget", params)',
        'got = self._rearmed("delete_tenant_budget", "budget_of", params)',
        (
            f"{J}::test_a_tenants_budget_deleted_limits_nothing_and_its_stopped_runs_go_on",
            f"{BUDGETS}::test_a_tenants_budget_deleted_over_http_lets_its_stopped_runs_go_on",
        ),
    ),
    Mutant(
        "M97",
        "a journal record written again by its own writer (a retry whose first try committed) "
        "adds the call's cost to its budgets again: spend counted twice for one record",
        "store/sql/queries.sql",
        "    SELECT run_id FROM recorded WHERE NOT EXISTS (SELECT 1 FROM before)",
        "    SELECT run_id FROM recorded",
        (f"{J}::test_a_record_written_again_by_its_writer_adds_its_cost_once",),
    ),
    Mutant(
        "M98",
        "a budget check without the lock on the budget's row: runs of a tree checking at once "
        "each see the room the others are taking, and pass the limit together",
        "store/sql/queries.sql",
        "    SELECT scope FROM budgets WHERE scope = ANY(%(budgets)s) ORDER BY scope FOR UPDATE",
        "    SELECT scope FROM budgets WHERE scope = ANY(%(budgets)s) ORDER BY scope",
        (f"{BUDGETS}::test_runs_of_a_tree_checking_at_once_never_pass_its_limit",),
    ),
    Mutant(
        "M95",
        "a decision without the pending guard: a second (or racing) decision is sent too",
        "store/sql/queries.sql",
        "     WHERE a.approval_id = %(approval_id)s AND a.pending",
        "     WHERE a.approval_id = %(approval_id)s",
        (APPROVALS,),
    ),
    Mutant(
        "M96",
        "a run leaving its wait (timed out, cancelled) does not close its request: it stays "
        "listed, and a decision is sent to a run that no longer waits on it",
        "store/sql/migrations/0022_approvals.sql",
        "    FOR EACH ROW WHEN (OLD.status = 'waiting' AND (NEW.status <> 'waiting' OR NEW.seq <> OLD.seq))",
        "    FOR EACH ROW WHEN (false)",
        (APPROVALS,),
    ),
    Mutant(
        "M104",
        "a budget hold without the epoch fence: a zombie whose lease lapsed after its check "
        "holds room against its tree's budget that no record of it will settle",
        "store/sql/queries.sql",
        "     WHERE c.run_id = %(run_id)s AND c.seq = %(seq)s\n       AND c.epoch <= %(epoch)s\n",
        "     WHERE c.run_id = %(run_id)s AND c.seq = %(seq)s\n",
        (f"{STORE}::test_a_stale_epochs_reserve_holds_nothing_and_is_fenced",),
    ),
    Mutant(
        "M105",
        "an Agents SDK agent reads its steer messages outside the journal: a replay takes "
        "them in again, later ones too, and a message is sent to the model twice",
        "cairn/contrib/openai_agents/_steer.py",
        "        return [_user_item(m) for m in await asyncio.to_thread(step.messages)]",
        "        pending = await asyncio.to_thread(step._store.steers_pending, step.run_id)\n"
        "        return [_user_item(m) for _, m in pending]",
        (
            f"{OA}::test_a_steer_message_reaches_the_agent_s_next_request_once_across_a_kill",
            f"{OA}::{CUT}",
        ),
    ),
    Mutant(
        "M109",
        "an Agents SDK run on a session keeps its steer messages out of the session: the "
        "turn's requests see them, the next turn's do not",
        "cairn/contrib/openai_agents/_steer.py",
        "            await self._session.add_items(items)  # type: ignore[arg-type]\n",
        "            pass\n",
        (
            f"{OA}::test_a_steered_turn_writes_its_messages_to_the_session_once_at_their_place",
            f"{OA}::test_a_steered_turn_that_waits_for_approval_keeps_its_messages_in_place_in_the_session",
        ),
    ),
    Mutant(
        "M111",
        "an Agents SDK request cut by a steer message on a session is made again with the "
        "messages, but they are not written to the session: the next turn never sees them",
        "cairn/contrib/openai_agents/_steer.py",
        "        await self._keep(items)\n",
        "        self.taken.extend([self._at, item] for item in items)\n",
        (f"{OA}::test_a_cut_request_s_messages_are_in_the_session_once_at_their_place",),
    ),
    Mutant(
        "M106",
        "a pydantic-ai request cut by a steer message is made again without the message: it "
        "is in the agent's history, but the model answers the old request",
        "cairn/contrib/pydantic_ai.py",
        "            _cut_in.setdefault(step, {}).setdefault(_request_step(ctx), []).append(taken)\n",
        "",
        (f"{PAI}::{CUT}",),
    ),
    Mutant(
        "M124",
        "an enqueue on the caller's sync connection runs in a transaction block of its own "
        "again: as the first statement of an idle connection it commits the caller's "
        "transaction, and the caller's rollback leaves a run beat sends",
        "store/transactional.py",
        "\n        conn.transaction() if own else contextlib.nullcontext(),\n",
        "\n        conn.transaction(),\n",
        (
            f"{TX_STATES}::test_a_sync_connection_in_each_state_commits_the_run_with_the_caller_or_never",
        ),
    ),
    Mutant(
        "M125",
        "the async twin: an enqueue on the caller's AsyncConnection commits the caller's "
        "transaction when it is its first statement",
        "store/transactional.py",
        "\n            conn.transaction() if own else contextlib.nullcontext(),\n",
        "\n            conn.transaction(),\n",
        (
            f"{TX_STATES}::test_an_async_connection_in_each_state_commits_the_run_with_the_caller_or_never",
        ),
    ),
    Mutant(
        "M126",
        "`cairn deploy check` passes a run with no journal (waiting or pending at a step's "
        "start) without replaying it: a field the new code reads and the run lacks is a "
        "KeyError after its signal, not a finding",
        "workers/deploycheck.py",
        "    replay = _replay(store, flow, at, fn, going.cursor, unsent)\n",
        "    if not store.journal(at.run_id, at.cursor, at.visits.get(at.cursor, 0)):\n"
        '        return found(True, "", going.cursor)\n'
        "    replay = _replay(store, flow, at, fn, going.cursor, unsent)\n",
        (
            f"{DEPLOY_WAITS}::test_the_check_replays_runs_with_no_journal_and_names_those_new_code_breaks",
        ),
    ),
    Mutant(
        "M127",
        "`cairn deploy check` does not hold a run waiting for a signal to the step that made "
        "it wait: a renamed signal, which never wakes the run, passes",
        "workers/deploycheck.py",
        "        found = _waits_as_before(store, flow, cp) or found\n",
        "        pass\n",
        (
            f"{DEPLOY_WAITS}::test_the_check_replays_runs_with_no_journal_and_names_those_new_code_breaks",
        ),
    ),
    Mutant(
        "M112",
        "cairn's transport sends a model request without checking the lease: a retry after "
        "a back-off, a 429's retry-after or a wait for the rate limit goes out for a run "
        "another worker has taken over (only the first try is checked, before the call)",
        "steps/providers/transport.py",
        "            fence()\n            response = self._pool().handle_request(request)",
        "            response = self._pool().handle_request(request)",
        (
            f"{FENCED_TRIES}::test_a_lease_lost_in_any_wait_between_tries_lets_no_further_request_out",
            f"{FENCED_TRIES}::{BACK_OFF}",
            f"{FENCED_FLEET}[503-prefork]",
        ),
    ),
    Mutant(
        "M113",
        "a pydantic-ai agent's own SDK client is not given the lease check: its SDK's retry "
        "after a back-off goes out for a run another worker has taken over",
        "cairn/contrib/pydantic_ai.py",
        '            fence_requests(getattr(_unwrapped(request_context.model), "client", None))\n',
        "",
        (f"{FENCED_TRIES}::{BACK_OFF}[pydantic_ai]",),
    ),
    Mutant(
        "M132",
        "the pages' login believes a post from another origin of the same site (Sec-Fetch-Site "
        "ignored): a page on another port plants the form's nonce and logs the browser in as "
        "its tenant",
        "cairn/web/cookies.py",
        'return None if site == "same-origin" else f"a {site} request"',
        "return None",
        (
            f"{WEB_SESSIONS}::test_login_takes_only_this_servers_own_form",
            f"{ATTACKS}::{LOGIN_CSRF}",
        ),
    ),
    Mutant(
        "M133",
        "no Content-Security-Policy on the answers: a script let into a page runs, and any "
        "page frames cairn's",
        "cairn/web/headers.py",
        'headers["content-security-policy"] = policy',
        'del headers["content-security-policy"]',
        (
            f"{WEB_SESSIONS}::test_every_answer_carries_the_headers_a_crash_too",
            f"{ATTACKS}::test_the_pages_run_under_a_policy_that_refuses_inline_script_and_break_none_of_it",
        ),
    ),
    Mutant(
        "M134",
        "logout without the page's check: another origin's form ends the admin's session",
        "cairn/web/routers/pages.py",
        'if cookies.elsewhere(request) or not auth.checks("logout", session, _one(form, "check")):',
        "if cookies.elsewhere(request):",
        (f"{WEB_SESSIONS}::{LOGOUT}",),
    ),
    Mutant(
        "M135",
        "logout by GET too: a link or an image of the pages' host reaches it",
        "cairn/web/routers/pages.py",
        '@router.post("/logout")',
        '@router.api_route("/logout", methods=["GET", "POST"])',
        (f"{WEB_SESSIONS}::{LOGOUT}",),
    ),
    Mutant(
        "M136",
        "the guard lets a body nested past the bound through to the parser: it recurses, "
        "and the answer is a 500",
        "cairn/web/auth.py",
        "            if too_deep(body):",
        "            if False:",
        (
            "tests/integration/test_web_bounds.py::test_a_decisions_args_and_a_forks_patch_are_bounded_too",
            f"{ATTACKS}::test_json_nested_too_deep_is_a_422_and_stores_nothing",
        ),
    ),
    Mutant(
        "M137",
        "check_input's depth bound ten times looser: the Client stores a value nested "
        "hundreds deep, which every read of it then fails to serialize",
        "cairn/core/inputs.py",
        "_walk(data, what, MAX_DEPTH + envelope)",
        "_walk(data, what, 10 * MAX_DEPTH + envelope)",
        (
            "tests/unit/test_input_bounds.py::test_check_input_refuses_a_value_too_deep_at_any_depth",
            "tests/integration/test_web_bounds.py::test_the_client_and_the_async_client_refuse_a_value_too_deep_before_writing",
        ),
    ),
    Mutant(
        "M138",
        "a logout leaves the session's row: a copy of the cookie still opens the pages",
        "store/sql/queries.sql",
        "DELETE FROM page_sessions WHERE hash = %(hash)s RETURNING token_id;",
        "SELECT token_id FROM page_sessions WHERE hash = %(hash)s;",
        (
            f"{WEB_SESSIONS}::{LOGOUT}",
            f"{ATTACKS}::test_a_session_cookie_copied_before_a_logout_opens_nothing_after_it",
        ),
    ),
    Mutant(
        "M139",
        "a run id put into the runs page's link unencoded: x/../../logout links above its page",
        "cairn/web/templates/_runs_live.html",
        '<a href="/ui/runs/{{ r.run_id | segment }}">',
        '<a href="/ui/runs/{{ r.run_id }}">',
        (
            f"{WEB_SESSIONS}::test_a_run_id_holding_slashes_is_encoded_in_every_link_and_its_page_opens",
            f"{ATTACKS}::test_a_run_id_holding_dot_dot_is_encoded_in_its_link_and_opens_its_own_page",
        ),
    ),
    Mutant(
        "M115",
        "a cancel's reason (a user's words) stored in clear with CAIRN_PAYLOAD_KEYS set",
        "store/checkpoints.py",
        '{"run_id": run_id, "reason": text(reason), "by": text(by)}',
        '{"run_id": run_id, "reason": Clear(reason), "by": text(by)}',
        (NO_CLEAR,),
    ),
    Mutant(
        "M116",
        'a user\'s value shaped like the envelope ({"cairn.sealed": ...}) stored as it is, '
        "and opened on the way back as if cairn had sealed it",
        "cairn/core/sealing.py",
        "    return text if MARK.decode() not in text else _CLEAR.encode(_escaped(value))",
        "    return text",
        (
            "tests/unit/test_payloads.py::test_any_value_comes_back_exactly_and_a_user_envelope_is_never_opened",
            f"{COLUMNS}::test_a_value_shaped_like_the_envelope_round_trips_through_postgres",
        ),
    ),
    Mutant(
        "M117",
        "a payload key a worker lacks, met inside a step, fails the run instead of handing "
        "it back to a worker that has the key",
        "cairn/core/sealing.py",
        "class KeyMissing(PayloadKeyError, Interrupted):",
        "class KeyMissing(PayloadKeyError):",
        (KEY_MISSING, f"{KEY_DEPLOY}[api-first]"),
    ),
    Mutant(
        "M118",
        "a fork's patched input stored unsealed (the patch merged beside the sealing path)",
        "store/rows.py",
        '"input": None if input is None else Payload(input),',
        '"input": None if input is None else Clear(input),',
        (NO_CLEAR,),
    ),
    Mutant(
        "M119",
        "a run handed back for a key its worker lacks counts the delivery toward poison: "
        "a key deploy that hands it around fails it as poison",
        "workers/loop.py",
        "            deps.store.unclaim(run_id, lease.epoch, KEY_HOLD)  # not the run's fault",
        "            pass",
        (
            f"{KEY_MISSING}::test_a_key_missing_hands_the_run_back_and_never_fails_or_poisons_it[in-a-step]",
        ),
    ),
    Mutant(
        "M128",
        "the reaper without its limit: one pass lists every run a worker took in one page "
        "(30,000 after an outage: seconds a pass, and ticks queued behind it)",
        "workers/reaper.py",
        "self.settings.lease_ttl / 2, after=self._after, limit=self.batch",
        "self.settings.lease_ttl / 2, after=self._after, limit=10**9",
        (
            "tests/unit/test_reaper.py::test_a_pass_walks_a_page_at_a_time_stops_at_its_deadline_and_the_next_goes_on",
        ),
    ),
    Mutant(
        "M129",
        "the reaper sends again a never-taken run whose message is still queued (a backlog "
        "after an outage sent twice over)",
        "workers/reaper.py",
        "        lost = min(waiting - held, self.batch)",
        "        lost = min(waiting, self.batch)",
        (
            "tests/unit/test_reaper.py::test_never_taken_runs_wait_while_the_broker_holds_a_message_for_each",
        ),
    ),
    Mutant(
        "M130",
        "the reaper back on a worker's pool (beat sends its tick to the control queue): "
        "with every pool process on a long run, a partitioned run waits for one to end",
        "workers/app.py",
        '        control.Periodic("reaper", s.reaper_interval, lambda: reap(runtime, reaper)),',
        '        control.Periodic("reaper", s.reaper_interval, lambda: runtime.app.send_task(broker.REAP_TASK)),',
        (
            "tests/fleet/test_takeover.py::test_a_partitioned_run_is_taken_over_within_a_ttl_and_2s_with_every_pool_process_busy",
        ),
    ),
    Mutant(
        "M131",
        "a run sent and not taken is sent again every window: a backlog of resumes longer "
        "than the window gets a duplicate each window",
        "store/lua/offer.lua",
        "      local wait = math.floor(math.min(first * 2 ^ sends, cap))",
        "      local wait = first",
        (
            "tests/contract/test_store_contract.py::test_a_run_offered_waits_while_its_message_is_out_each_wait_twice_the_last[redis]",
        ),
    ),
    Mutant(
        "M120",
        "remove_schedule without its tenancy decision: a tenant's Client removes the "
        "admin's schedule (as it did before issue 51)",
        "cairn/client/tenancy.py",
        '    "remove_schedule": _SCHEDULES,\n',
        '    "remove_schedule": Decision(Who.ANY, "any client"),\n',
        (f"{TENANCY}::test_a_tenants_client_reaches_nothing_of_another_tenants_nor_of_the_admins",),
    ),
    Mutant(
        "M121",
        "an approval decided with no name given is recorded as decided by the admin, "
        "whoever's token or tenant's Client decided it",
        "cairn/client/base.py",
        '        if self.token_id is not None:\n            return f"token {self.token_id}"\n',
        '        if True:\n            return "admin"\n',
        (f"{TENANCY}::test_a_decision_names_the_token_and_tenant_that_made_it",),
    ),
    Mutant(
        "M122",
        "an approval's audit row leaves out the token and the tenant that decided it",
        "store/sql/queries.sql",
        "           %(token_id)s, %(tenant)s\n      FROM chosen",
        "           NULL, NULL\n      FROM chosen",
        (f"{TENANTS_API}::test_an_approvals_audit_row_names_the_token_and_tenant_that_decided",),
    ),
    Mutant(
        "M123",
        "the routes take no tenancy decision of their own: a tenant's token reads the "
        "fleet's metrics",
        "cairn/web/api.py",
        "        dependencies=[Depends(tenancy.decided)],  # every route's, before it runs\n",
        "",
        (f"{TENANTS_API}::test_every_route_hides_another_tenants_run",),
    ),
    Mutant(
        "M140",
        "a model call booked with the rate limiter before the SDK's own work on its request: "
        "a slow first call reaches the provider late on its slot, on top of the next ones",
        "steps/model.py",
        "            with gated(book):\n                answer = send(attempt)\n",
        "            book()\n            answer = send(attempt)\n",
        (f"{RATE}::test_a_request_late_on_its_slot_is_booked_where_it_goes_out_not_before",),
    ),
    Mutant(
        "M141",
        "the run page listens for a named `message` event besides onmessage (the listener of "
        "that same name): each journaled answer is shown twice in the live log",
        "cairn/web/static/cairn.js",
        'const KINDS = ["step_started", "token", "model_restart", "call", "step_saved",',
        'const KINDS = ["step_started", "token", "model_restart", "message", "call", "step_saved",',
        (f"{WEB_STREAM}::test_the_run_page_streams_the_answer_and_marks_the_killed_attempt_cut",),
    ),
    Mutant(
        "M142",
        "a Sentinel URL's master asked for once, at start, and connected to plainly: after a "
        "promotion cairn's client keeps knocking on the dead master",
        "store/redisconn.py",
        "        pool_class = _BlockingSentinelPool if blocking else redis.sentinel.SentinelConnectionPool\n",
        "        host, port = sentinel.discover_master(address.master)\n"
        "        pw = f':{address.password}@' if address.password else ''\n"
        "        return client(f'redis://{pw}{host}:{port}/{address.db}', blocking=blocking, **kwargs)\n"
        "        pool_class = _BlockingSentinelPool if blocking else redis.sentinel.SentinelConnectionPool\n",
        (f"{SENTINEL}::test_leases_and_streams_keep_working_through_a_promotion",),
    ),
    Mutant(
        "M143",
        "the broker not given CAIRN_REDIS_SENTINEL_MASTER: kombu's Sentinel transport has no "
        "master to ask for",
        "workers/broker.py",
        '        options["master_name"] = settings.redis_sentinel_master\n',
        "        pass\n",
        (f"{REDIS_URL}::test_a_sentinel_url_names_its_sentinels_master_password_and_database",),
    ),
    Mutant(
        "M146",
        "an unreachable multi-host DSN (a primary and its standby) named as libpq's lists, "
        "hosts then ports, not each host with its port",
        "store/db.py",
        '    at = ",".join(f"{h}:{p}" for h, p in zip(hosts, ports, strict=False))\n',
        "    at = f\"{where.get('host', 'localhost')}:{where.get('port', 5432)}\"\n",
        (MULTI_HOST,),
    ),
]


def _run(m: Mutant, root: Path = ROOT, env: dict[str, str] | None = None) -> tuple[str, float, str]:
    path = root / m.file
    original = path.read_text()
    if original.count(m.old) != 1:
        return "stale", 0.0, f"{m.old!r} occurs {original.count(m.old)} times in {m.file}"
    started = time.monotonic()
    try:
        path.write_text(original.replace(m.old, m.new))
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *m.tests],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        path.write_text(original)
    elapsed = time.monotonic() - started
    tail = (proc.stdout.strip().splitlines() or [""])[-1]
    # pytest exit 1: tests ran and failed (killed). 0: survived. Anything else (a
    # collection error, an interrupted run) proves nothing, so it fails the gauntlet.
    verdict = {0: "SURVIVED", 1: "killed"}.get(proc.returncode, f"error (pytest {proc.returncode})")
    return verdict, elapsed, tail


def _lane(k: int) -> Path:
    """A copy of the checkout's files (tracked and new, as they are now) in the installed
    layout: cairn/store, cairn/steps and cairn/workers are folders of the copy's cairn/,
    with links in their repo places so a mutant's path and the tests' paths still work."""
    lane = ROOT / ".cairn" / "mutants" / f"lane-{k}"
    shutil.rmtree(lane, ignore_errors=True)
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    moved = {
        folder: package.replace(".", "/")
        for package, folder in pyproject["tool"]["setuptools"]["package-dir"].items()
        if package != "cairn"
    }
    for name in filter(None, listed):
        source = ROOT / name
        if not source.is_file():  # deleted in the work tree, not yet in git
            continue
        top, _, rest = name.partition("/")
        target = lane / (f"{moved[top]}/{rest}" if top in moved and rest else name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    for folder, package in moved.items():
        (lane / folder).symlink_to(lane / package, target_is_directory=True)
    for shared in (".venv", ".cairn"):  # the interpreter, the services' state and logs
        (lane / shared).symlink_to(ROOT / shared, target_is_directory=True)
    return lane


def _in_lanes(chosen: list[Mutant], lanes: int) -> list[tuple[Mutant, str, float, str]]:
    """Each lane takes the next mutant off one queue, so a slow one holds up only its lane."""
    todo: queue.Queue[Mutant] = queue.Queue()
    for m in chosen:
        todo.put(m)
    results: list[tuple[Mutant, str, float, str]] = []
    lock = threading.Lock()

    def work(k: int) -> None:
        root = _lane(k)
        env = {**os.environ, "CAIRN_TEST_SLOT": str(k), "PYTHONPATH": str(root)}
        env.pop("CAIRN_TEST_HALF", None)
        while True:
            try:
                m = todo.get_nowait()
            except queue.Empty:
                return
            verdict, elapsed, tail = _run(m, root, env)
            with lock:
                results.append((m, verdict, elapsed, tail))
                _report(m, verdict, elapsed, tail)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, lanes + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _report(m: Mutant, verdict: str, elapsed: float, tail: str) -> None:
    killer = ", ".join(t.split("::")[-1] for t in m.tests)
    print(f"  {m.id:<4} {verdict:<9} {elapsed:5.1f}s  {m.what}  <- {killer}", flush=True)
    if verdict != "killed":
        print(f"       {tail}", flush=True)


def main(argv: list[str]) -> int:
    lanes = 0
    if argv[:1] == ["--lanes"]:
        lanes, argv = int(argv[1]), argv[2:]
    chosen = [m for m in MUTANTS if not argv or m.id in argv]
    files = sorted({m.file for m in chosen})
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if dirty and not lanes:
        print(f"mutants: uncommitted changes in the files to mutate:\n{dirty}", file=sys.stderr)
        return 2
    print(f"mutation gauntlet: {len(chosen)} mutants", flush=True)
    if lanes:
        results = _in_lanes(chosen, lanes)
    else:
        results = []
        for m in chosen:
            verdict, elapsed, tail = _run(m)
            results.append((m, verdict, elapsed, tail))
            _report(m, verdict, elapsed, tail)
    # A lane that broke off leaves its mutants unrun: they count as not killed.
    failed = len(chosen) - sum(verdict == "killed" for _, verdict, _, _ in results)
    print(f"{len(chosen) - failed} killed, {failed} not killed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
