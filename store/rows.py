"""What the Postgres store and its in-memory twin share: the parameters each operation
sends (create, fork, replay, list), and what they read back (a checkpoint from its row,
a fork's or a rewind's answer, a run settled for a waiter), checked the same way."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from typing import Any

from cairn.core import sealing
from cairn.core.errors import (
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    InvalidInput,
    RunIdConflict,
    RunNotStopped,
    UnknownRun,
    WaitTimedOut,
)
from cairn.core.inputs import key_scope
from cairn.core.records import (
    CHECKPOINT_VERSION,
    START,
    Attempt,
    Checkpoint,
    Message,
    Run,
    RunFilter,
    Spawned,
    Wait,
    budget_scope,
)
from cairn.core.status import SETTLED, RunStatus
from cairn.store.payloads import Clear, Payload, each, text
from cairn.store.sql import QUERIES

# Status counts: a reader folds the deltas itself past FOLD_AT rows (summing 10,000 takes
# about 2 ms); a fold moves at most FOLD_BATCH rows per transaction.
FOLD_AT = 10_000
FOLD_BATCH = 50_000
# Runs one wake pass moves out of waiting in one transaction; a pass calls it again
# while a batch comes back full, so a backlog of due runs drains within the pass.
WAKE_BATCH = 1000


def appended(previous: Checkpoint, cp: Checkpoint) -> tuple[int, list[Message]]:
    """What a save must write of the window: (first index, new messages).

    A window that extends the previous one writes only its new tail; any other (compacted,
    rewritten) is written whole as a fresh range after the old one. Either way the bytes
    written track what changed, not the run's length.
    """
    old, new = previous.window, cp.window
    if cp.win_start == previous.win_start:
        return previous.win_end, list(new[len(old) :])
    return cp.win_start, list(new)


def settled(run_id: str, run: Run | None, timeout: float | None, deadline: float) -> float | None:
    """For wait: None once the run is settled (stopped or waiting), else the seconds left
    to wait. Raises UnknownRun, or WaitTimedOut past the deadline."""
    if run is None:
        raise UnknownRun(f"no run {run_id!r}")
    if run.status in SETTLED:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise WaitTimedOut(
            f"run {run_id} is still {run.status} at {run.cursor!r} after {timeout:g}s; "
            "wait again, or look it up with get"
        )
    return left


def list_query(which: RunFilter) -> tuple[str, dict[str, Any]]:
    """The named query and parameters of a page of runs."""
    if which.status:
        name = "list_runs_by_status"
    else:
        name = "list_runs" if which.tenant is None else "list_runs_of_tenant"
    return name, dataclasses.asdict(which)


def conflict(run_id: str, row: dict[str, Any], input: dict[str, Any]) -> None:
    """RunIdConflict unless the existing run (existing_run's row) has this workflow, input
    and tenant: the same run id is the same run, or a mistake."""
    if not row["same_tenant"]:  # never another tenant's run, nor what it holds
        raise RunIdConflict(f"run id {run_id!r} is taken; use a new run id")
    # Read as text (the caller's own connection has no loader of ours): loaded here, once.
    same_input = sealing.open_text(row["input_text"]) == input
    if not (row["same_workflow"] and same_input):
        what = "workflow" if not row["same_workflow"] else "input"
        raise RunIdConflict(
            f"run id {run_id!r} already names a {row['workflow']!r} run with another "
            f"{what}; use a new run id, or the same workflow and input to resume it"
        )


def fork_params(
    origin: str, at: int, run_id: str, input: dict[str, Any] | None, traceparent: str | None
) -> dict[str, Any]:
    """The fork's parameters; input: the origin's, opened and patched (None: unpatched,
    the stored value is copied as it is). A patch is never merged in SQL: the stored
    input is sealed, and `||` on a sealed value breaks it."""
    return {
        "origin": origin,
        "at": at,
        "run_id": run_id,
        "input": None if input is None else Payload(input),
        "traceparent": traceparent,
        "version": CHECKPOINT_VERSION,
    }


def forked(row: dict[str, Any] | None, origin: str, at: int) -> bool:
    """The fork query's answer: whether it made the run; or why it could not."""
    assert row is not None
    if not row["origin_found"]:
        raise UnknownRun(f"no run {origin!r}")
    if not row["found"]:
        raise InvalidInput(_no_snapshot(origin, at))
    return row["run_id"] is not None


REPLAYABLE = (RunStatus.FAILED, RunStatus.INCOMPATIBLE)


def replay_params(
    workflow: str,
    statuses: tuple[RunStatus, ...],
    since: dt.datetime,
    until: dt.datetime,
    limit: int,
) -> dict[str, Any]:
    bad = [s for s in statuses if s not in REPLAYABLE]
    if bad or not statuses:
        raise InvalidInput(
            f"replay re-arms failed or incompatible runs, not {', '.join(bad) or 'none'}"
        )
    return {
        "workflow": workflow,
        "statuses": [str(s) for s in statuses],
        "since": since,
        "until": until,
        "limit": limit,
    }


def rewound(row: dict[str, Any] | None, run_id: str, at: int) -> int:
    """The rewind query's answer: the run's new seq; or why it could not."""
    assert row is not None
    if row["status"] is None:
        raise UnknownRun(f"no run {run_id!r}")
    if not RunStatus(row["status"]).stopped:
        raise RunNotStopped(
            f"run {run_id} is {row['status']}: rewind moves a stopped run; cancel it "
            "first (it stops at its next step boundary), or fork it instead"
        )
    if not row["found"] or row["seq"] is None:
        raise InvalidInput(_no_snapshot(run_id, at))
    return int(row["seq"])


def _no_snapshot(run_id: str, at: int) -> str:
    return (
        f"run {run_id} saved no checkpoint at seq {at}: pick a seq from its history "
        "(`cairn history`), 1 up to its current seq (steps saved before cairn kept them "
        "cannot be forked)"
    )


def create_params(
    run_id: str,
    workflow: str,
    input: dict[str, Any],
    cursor: str,
    max_cost_usd: float | None,
    priority: int,
    concurrency_key: str | None,
    concurrency_limit: int,
    traceparent: str | None = None,
    tenant: str | None = None,
    budget_usd: float | None = None,
    budget_soft: float | None = None,
    budget_tokens: int | None = None,
) -> dict[str, Any]:
    """create_run's and create_keyed_run's parameters (and create_budget's)."""
    budgeted = budget_usd is not None or budget_tokens is not None
    scope = budget_scope(run_id) if budgeted else None
    return {
        "budgets": [scope] if scope is not None else None,
        "budget_scope": scope,
        "budget_usd": budget_usd,
        "budget_tokens": budget_tokens,
        "budget_soft": budget_soft,
        "run_id": run_id,
        "workflow": workflow,
        "input": Payload(input),
        "cursor": cursor,
        "state": Payload({}),
        "version": CHECKPOINT_VERSION,
        "max_cost_usd": max_cost_usd,
        "priority": priority,
        "key": concurrency_key,
        "scope": key_scope(workflow, concurrency_key),
        "limit": concurrency_limit,
        "traceparent": traceparent,
        "tenant": tenant,
    }


def debounce_params(
    run_id: str,
    workflow: str,
    input: dict[str, Any],
    key: str,
    debounce: float,
    max_wait: float | None,
    max_cost_usd: float | None,
    priority: int,
    traceparent: str | None,
    tenant: str | None = None,
) -> dict[str, Any]:
    """The debounce query's parameters."""
    params = create_params(
        run_id, workflow, input, START, max_cost_usd, priority, key, 1, traceparent, tenant
    )
    return {**params, "debounce": debounce, "max_wait": max_wait}


def _checkpoint(row: dict[str, Any]) -> Checkpoint:
    if row["version"] != CHECKPOINT_VERSION:
        raise IncompatibleCheckpoint(row["run_id"], row["version"], CHECKPOINT_VERSION)
    for field, kind in (("state", dict), ("visits", dict), ("window", list), ("input", dict)):
        if not isinstance(row[field], kind):
            raise CorruptCheckpoint(
                f"run {row['run_id']}: stored {field} is {type(row[field]).__name__}, "
                f"expected {kind.__name__}; refusing to resume"
            )
    if len(row["window"]) != row["win_end"] - row["win_start"]:
        raise CorruptCheckpoint(
            f"run {row['run_id']}: window rows {row['win_start']}..{row['win_end']} incomplete"
        )
    fields = {
        f.name: row[f.name]
        for f in dataclasses.fields(Checkpoint)
        # a row exported before tenants has none (cairn runs export)
        if f.name not in ("window", "window_bytes") and (f.name != "tenant" or "tenant" in row)
    }
    fields["status"] = RunStatus(row["status"])
    return Checkpoint(window=tuple(row["window"]), **fields)


def save_params(
    cp: Checkpoint,
    previous: Checkpoint,
    attempt: Attempt | None,
    wait: Wait | None,
    spawn: Spawned | None,
) -> tuple[str, dict[str, Any]]:
    """The save's statement (the plainest that does the step's writes: no window or signal
    CTEs for most steps, the spawn's for a spawn) and its parameters."""
    first_idx, messages = appended(previous, cp)
    attempt = attempt or Attempt(started=time.time())
    params = {
        "run_id": cp.run_id,
        "seq": cp.seq,
        "cursor": cp.cursor,
        "state": Payload(cp.state),
        "visits": Clear(cp.visits),
        "win_start": cp.win_start,
        "win_end": cp.win_end,
        "cost_usd": cp.cost_usd,
        "version": cp.version,
        "status": cp.status,
        "error": text(cp.error),
        "epoch": cp.epoch,
        "resumes": cp.resumes,
        "step": previous.cursor,
        "visit": previous.visits.get(previous.cursor, 0),
        "started": attempt.started,
        "worker": attempt.worker,
        "step_cost": cp.cost_usd - previous.cost_usd,
        "effect_key": attempt.effect_key,
        "code_version": attempt.code_version,
        "consumed": attempt.signal_id,
        "wait_event": wait.event if wait else None,
        "wait_timeout": wait.timeout if wait else None,
        "wait_timeout_cursor": wait.on_timeout if wait else None,
        "flow_version": cp.flow_version,
        # The history row keeps the state only when the step changed it (a fork reads
        # back to the last that did): bytes per step stay flat in the run's length.
        "state_changed": cp.state != previous.state or previous.seq == 0,
    }
    query = QUERIES["save_plain"]
    if messages or attempt.signal_id is not None or spawn is not None:
        query = QUERIES["save"]
        params["first_idx"] = first_idx
        params["messages"] = each(messages)
    if wait is not None and wait.request is not None:
        query = QUERIES["save_approval"]  # a step waits, or spawns: never both
        params["first_idx"] = first_idx
        params["messages"] = each(messages)
        params["workflow"], params["tool"] = cp.workflow, wait.request.get("tool")
        params["request"] = Payload(dict(wait.request))
    if spawn is not None:
        query = QUERIES["save_spawn"]
        params["kid_ids"] = [r for r, _, _ in spawn.children]
        params["kid_workflows"] = [w for _, w, _ in spawn.children]
        params["kid_inputs"] = each(i for _, _, i in spawn.children)
        params["need"], params["depth"] = spawn.need, spawn.depth
        params["traceparent"] = spawn.traceparent
    return query, params
