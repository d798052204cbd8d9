"""The operators' store (AdminStore, but for forks, rewinds and replays): create a run,
read runs, their history and calls, signal, cancel, wait, resolve unknown effects."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import time
from collections.abc import Iterable
from typing import Any

from cairn.core.errors import RunIdConflict
from cairn.core.inputs import key_scope
from cairn.core.records import START, Budget, Run, RunFilter, budget_scope, tenant_scope
from cairn.core.status import ACTIVE, REARMABLE, TERMINAL, RunStatus
from cairn.store.rows import settled
from cairn.testing.memory.rows import _dump, _loaded, _Row, _Signal
from cairn.testing.memory.tables import _Tables, period_start


class _Admin(_Tables):
    """AdminStore's operations on one run or many, as the Client and the CLI call them."""

    # -- new runs, admitted by their concurrency key ---------------------------------
    def create_run(
        self,
        run_id: str,
        workflow: str,
        input: dict[str, Any],
        cursor: str = START,
        max_cost_usd: float | None = None,
        *,
        priority: int = 0,
        concurrency_key: str | None = None,
        concurrency_limit: int = 1,
        traceparent: str | None = None,
        tenant: str | None = None,
        budget_usd: float | None = None,
        budget_soft: float | None = None,
        budget_tokens: int | None = None,
    ) -> bool:
        """Insert a run at seq 0 (for tenant, if given); False if it existed (a failed one
        is re-armed). With a concurrency key it is admitted if a slot is free, else queued;
        with budget_usd, its tree's budget.

        Raises RunIdConflict if run_id exists with another workflow, input or tenant.
        """
        text = _dump(input)
        with self._lock:
            stamp = self._stamp()
            row = self._rows.get(run_id)
            created = row is None
            if concurrency_key is not None:  # create_keyed_run's upsert of the key
                keyed = key_scope(workflow, concurrency_key)  # a tenant's key spans workflows
                self._keys[(keyed, concurrency_key)] = concurrency_limit
            budgeted = budget_usd is not None or budget_tokens is not None
            scope = budget_scope(run_id) if budgeted else None
            if row is None:  # create_run
                row = self._new_row(
                    run_id, workflow, text, stamp, cursor, max_cost_usd,
                    priority=priority, traceparent=traceparent, concurrency_key=concurrency_key,
                    concurrency_limit=concurrency_limit if concurrency_key is not None else None,
                    tenant=tenant,
                    budgets=[scope] if scope is not None else None,
                )  # fmt: skip
                if concurrency_key is not None:
                    row.status = RunStatus.QUEUED
                    self._enqueue(row)
            if scope is not None:  # create_budget
                self._budgets.setdefault(scope, {
                    "limit_usd": budget_usd, "soft": budget_soft, "spent_usd": 0.0,
                    "reserved_usd": 0.0, "limit_tokens": budget_tokens, "spent_tokens": 0,
                    "reserved_tokens": 0,
                })  # fmt: skip
            if concurrency_key is not None:
                self._admit(key_scope(workflow, concurrency_key), concurrency_key)  # admit
            if created:
                return True
            if row.tenant != tenant:  # never another tenant's run, nor what it holds
                raise RunIdConflict(f"run id {run_id!r} is taken; use a new run id")
            # existing_run: jsonb equality, so key order does not matter
            same_workflow = row.workflow == workflow
            same_input = json.loads(row.input) == json.loads(text)
            if not (same_workflow and same_input):
                what = "workflow" if not same_workflow else "input"
                raise RunIdConflict(
                    f"run id {run_id!r} already names a {row.workflow!r} run with another "
                    f"{what}; use a new run id, or the same workflow and input to resume it"
                )
            if row.status in REARMABLE:  # rearm_failed
                row.status, row.error, row.attempts, row.deliveries = RunStatus.PENDING, None, 0, 0
                row.retry_at, row.updated_at = None, stamp
                self._rearmed(row)
            return False

    def debounce(
        self,
        run_id: str,
        workflow: str,
        input: dict[str, Any],
        key: str,
        debounce: float,
        max_wait: float | None = None,
        *,
        max_cost_usd: float | None = None,
        priority: int = 0,
        traceparent: str | None = None,
        tenant: str | None = None,
    ) -> tuple[str, bool]:
        """The (workflow, key)'s run not started yet, made or given this input and a later
        start (see the SQL's debounce): (its run id, created)."""
        text = _dump(input)
        with self._lock:
            now, stamp = self._now(), self._stamp()
            start = now + dt.timedelta(seconds=debounce)
            row = next(
                (
                    r
                    for r in self._rows.values()
                    if r.debounce == (workflow, key)
                    and r.status == RunStatus.WAITING
                    and r.seq == 0
                ),
                None,
            )
            if row is None:
                row = self._new_row(
                    run_id, workflow, text, stamp, max_cost_usd=max_cost_usd,
                    priority=priority, traceparent=traceparent, status=RunStatus.WAITING,
                    wait_until=start, debounce=(workflow, key), tenant=tenant,
                )  # fmt: skip
                return run_id, True
            if max_wait is not None:
                start = min(start, row.created_at + dt.timedelta(seconds=max_wait))
            row.input, row.max_cost_usd, row.priority = text, max_cost_usd, priority
            row.wait_until, row.updated_at = start, stamp
            return row.run_id, False

    def admitted(self, workflow: str, key: str) -> list[tuple[str, int]]:
        """The key's runs admitted and not sent yet, each (run id, priority), marked sent."""
        workflow = key_scope(workflow, key)
        with self._lock:
            out = []
            for run_id, slot in self._slots.items():
                if slot[:2] == [workflow, key] and not slot[2]:
                    slot[2] = True
                    out.append((run_id, self._rows[run_id].priority))
            return out

    # -- one run: read it, signal it, cancel it --------------------------------------
    def get(self, run_id: str) -> Run | None:
        """The run without its window."""
        with self._lock:
            row = self._rows.get(run_id)
            return self._run(row) if row is not None else None

    def load_row(self, run_id: str) -> dict[str, Any] | None:
        """The run's checkpoint as `load` selects it, unparsed (forked_from with it)."""
        with self._lock:
            row = self._rows.get(run_id)
            return (
                {**self._columns(row, self._now()), "forked_from": row.forked_from} if row else None
            )

    def signal(
        self, run_id: str, event: str, payload: Any, signal_id: str, traceparent: str | None = None
    ) -> tuple[RunStatus, bool] | None:
        """Store a signal (the same id twice is one signal): (the run's status, whether it
        was new), or None: no such run."""
        text = _dump(payload)
        with self._lock:
            stamp = self._stamp()  # signals are taken oldest first
            row = self._rows.get(run_id)
            if row is None:
                return None
            stored = signal_id not in row.signals
            if stored:
                row.signals[signal_id] = _Signal(
                    event=event, payload=text, created_at=stamp, traceparent=traceparent
                )
            return row.status, stored

    def steer(
        self, run_id: str, message: Any, interrupt: bool = False
    ) -> tuple[RunStatus, int | None] | None:
        """Store a steer message as the run's next: (the run's status, its number, None
        when the run has ended), or None: no such run. interrupt: then fire the run's
        calls in flight."""
        text = _dump(message)
        with self._lock:
            row = self._rows.get(run_id)
            if row is None:
                return None
            if row.status in TERMINAL:
                return row.status, None
            row.steers.append(text)
            found = row.status, len(row.steers)
        if interrupt:
            self._cuts.fire(run_id)  # after the message is in, as Postgres's NOTIFY at commit
        return found

    def cancel(self, run_id: str, reason: str, by: str | None = None) -> RunStatus | None:
        """Ask the run to stop: one no worker holds (pending, waiting) at once, a running
        one at its next step boundary. Its status now, or None: no such run, or ended."""
        with self._lock:
            stamp = self._stamp()
            row = self._rows.get(run_id)
            if row is None or row.status not in ACTIVE:
                return None
            if row.cancel_reason is None:
                row.cancel_reason, row.cancelled_by = reason, by
            if row.status != RunStatus.RUNNING:
                row.status, row.error = RunStatus.CANCELLED, reason
                row.updated_at = stamp
                self._stopped(row)
            row.updated_at = stamp
            return row.status

    def children(self, run_id: str, seq: int | None = None, limit: int = 10_000) -> list[Run]:
        """The run's children (of the spawn saved at seq, or all), in their spawn's order."""
        with self._lock:
            kids = [
                r
                for r in self._rows.values()
                if r.parent_id == run_id and (seq is None or r.parent_seq == seq)
            ]
            kids.sort(key=lambda r: (r.parent_seq or 0, r.created_at, r.run_id))
            return [Run(**self._listed(r), state=json.loads(r.state)) for r in kids[:limit]]

    def gathered(self, run_id: str) -> bool:
        """Whether the run waits for a spawn that has gathered: its signal is unconsumed."""
        with self._lock:
            row = self._rows.get(run_id)
            return (
                row is not None
                and row.status == RunStatus.WAITING
                and row.wait_event is not None
                and self._pending(row) is not None
            )

    def history(self, run_id: str) -> list[dict[str, Any]]:
        """The run's step attempts, oldest first."""
        with self._lock:
            row = self._rows.get(run_id)
            return [dict(h) for h, _ in row.history] if row else []

    def calls(self, run_id: str, limit: int = 500) -> list[dict[str, Any]]:
        """The run's journaled calls, oldest first (calls in SQL)."""
        with self._lock:
            row = self._rows.get(run_id)
            found = [
                {"cursor": cursor, "visit": visit, **dataclasses.asdict(_loaded(call))}
                for (cursor, visit, _), (call, _) in (row.journal.items() if row else ())
            ]
        return found[:limit]

    # -- the clock, and waiting for a run to settle ----------------------------------
    def clock(self) -> dt.datetime:
        """The clock's time now, and after every write so far (as clock_timestamp() is
        after every commit): a clock a test holds still moves writes a microsecond on."""
        with self._lock:
            return self._stamp()

    def ping(self) -> None:
        """Always answers: nothing to reach."""

    def wait(self, run_id: str, timeout: float | None = None, poll: float = 2.0) -> Run:
        """The run once it is stopped or waiting (cairn.status.SETTLED), woken by any
        change to the store (its lock's release) and looking again every poll seconds.
        Raises UnknownRun, or WaitTimedOut after timeout seconds (real ones, not the
        clock's; None: no limit)."""
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        cond = self._lock.cond
        with cond:  # the bare condition: a waiter's looks wake no other waiter
            while True:
                row = self._rows.get(run_id)
                run = self._run(row) if row is not None else None
                left = settled(run_id, run, timeout, deadline)
                if left is None:
                    assert run is not None
                    return run
                cond.wait(min(poll, left))

    async def wait_async(self, run_id: str, timeout: float | None = None, poll: float = 2.0) -> Run:
        """wait() in a worker thread."""
        return await asyncio.to_thread(self.wait, run_id, timeout, poll)

    def live_cursors(self) -> list[dict[str, Any]]:
        """Where runs that may still go on stand (live_cursors in the SQL): {workflow,
        cursor, runs}, a waiting run's timeout cursor too."""
        live = ACTIVE | REARMABLE | {RunStatus.UNKNOWN}
        counted: dict[tuple[str, str], int] = {}
        with self._lock:
            for r in self._rows.values():
                if r.status not in live:
                    continue
                for cursor in (r.cursor, r.wait_timeout_cursor):
                    if cursor is not None:
                        counted[(r.workflow, cursor)] = counted.get((r.workflow, cursor), 0) + 1
        return [{"workflow": w, "cursor": c, "runs": n} for (w, c), n in sorted(counted.items())]

    # -- effects left unknown --------------------------------------------------------
    def open_intents(self, run_id: str) -> list[dict[str, Any]]:
        """The run's effects with an intent and no mark: {key, epoch, created_at}, oldest
        first."""
        with self._lock:
            found = [
                (v[4], k, v[2]) for k, v in self._effects.items() if v[0] == run_id and not v[3]
            ]
        return [{"key": k, "epoch": e, "created_at": t} for t, k, e in sorted(found)]

    def resolve(self, run_id: str, done: bool, result: Any = None) -> tuple[bool, list[str]]:
        """Settle the run's unknown effects and re-arm it if it stopped as unknown."""
        text = _dump(result)
        with self._lock:
            keys = [k for k, v in sorted(self._effects.items()) if v[0] == run_id and not v[3]]
            for k in keys:
                if done:
                    run, _, epoch, _, made = self._effects[k]
                    self._effects[k] = (run, text, epoch, True, made)
                else:
                    del self._effects[k]
            row = self._rows.get(run_id)
            rearmed = row is not None and row.status == RunStatus.UNKNOWN
            if row is not None and rearmed:
                row.status, row.error, row.attempts, row.deliveries = RunStatus.PENDING, None, 0, 0
                row.retry_at, row.updated_at = None, self._stamp()
                self._rearmed(row)
            return rearmed, keys

    # -- queries for the CLI and the pages -------------------------------------------
    def list_runs(self, which: RunFilter | None = None) -> list[Run]:
        """Runs newest first, created in [since, until); after: the last run id of the
        previous page (an unknown one ends the list, as the SQL's keyset does)."""
        w = which or RunFilter()
        with self._lock:
            rows: Iterable[_Row] = self._rows.values()
            if w.after is not None:
                mark = self._rows.get(w.after)
                if mark is None:
                    return []
                at = (mark.created_at, w.after)
                rows = [r for r in rows if (r.created_at, r.run_id) < at]
            found = [
                r
                for r in rows
                if (w.status is None or r.status == w.status)
                and (w.workflow is None or r.workflow == w.workflow)
                and (w.tenant is None or r.tenant == w.tenant)
                and (w.since is None or r.created_at >= w.since)
                and (w.until is None or r.created_at < w.until)
            ]
            found.sort(key=lambda r: (r.created_at, r.run_id), reverse=True)
            return [Run(**self._listed(r)) for r in found[: w.limit]]

    def counts(self, tenant: str | None = None) -> dict[str, dict[str, Any]]:
        """Runs per status ({status: {"n": ...}}), the statuses that have runs (a tenant's
        only, with one)."""
        with self._lock:
            totals: dict[str, int] = {}
            for row in self._rows.values():
                if tenant is not None and row.tenant != tenant:
                    continue
                totals[str(row.status)] = totals.get(str(row.status), 0) + 1
        return {s: {"status": s, "n": n, "unfolded": 0} for s, n in totals.items()}

    # -- budgets -----------------------------------------------------------------------
    def budget(self, run_id: str) -> Budget | None:
        with self._lock:
            got = self._budgets.get(budget_scope(run_id))
            return _budget(budget_scope(run_id), got) if got is not None else None

    def raise_budget(
        self, run_id: str, usd: float | None = None, tokens: int | None = None
    ) -> list[str] | None:
        scope = budget_scope(run_id)
        with self._lock:
            if scope not in self._budgets:
                return None
            if usd is not None:
                self._budgets[scope]["limit_usd"] = usd
            if tokens is not None:
                self._budgets[scope]["limit_tokens"] = tokens
            return self._rearm_over_budget(lambda row: scope in (row.budgets or ()))

    def tenant_budget(self, tenant: str) -> Budget | None:
        scope = tenant_scope(tenant)
        with self._lock:
            self._roll([scope])
            got = self._budgets.get(scope)
            return _budget(scope, got) if got is not None else None

    def set_tenant_budget(
        self,
        tenant: str,
        usd: float | None = None,
        tokens: int | None = None,
        per: str | None = None,
        soft: float | None = None,
    ) -> list[str] | None:
        scope = tenant_scope(tenant)
        with self._lock:
            b = self._budgets.get(scope)
            if b is None:  # set_tenant_budget's insert
                if usd is None and tokens is None:
                    return None
                period = per or "day"
                self._budgets[scope] = {
                    "limit_usd": usd, "soft": soft, "spent_usd": 0.0, "reserved_usd": 0.0,
                    "limit_tokens": tokens, "spent_tokens": 0, "reserved_tokens": 0,
                    "period": period, "period_start": period_start(period, self._now()),
                }  # fmt: skip
            else:  # its update: what is given, the period's start afresh if it changed
                if usd is not None:
                    b["limit_usd"] = usd
                if tokens is not None:
                    b["limit_tokens"] = tokens
                if soft is not None:
                    b["soft"] = soft
                if per is not None and per != b["period"]:
                    b["period"], b["period_start"] = per, period_start(per, self._now())
            return self._rearm_over_budget(lambda row: row.tenant == tenant)

    def delete_tenant_budget(self, tenant: str) -> tuple[Budget, list[str]] | None:
        scope = tenant_scope(tenant)
        with self._lock:
            self._roll([scope])  # as it stands in this period
            b = self._budgets.pop(scope, None)
            if b is None:
                return None
            for hold in [h for h in self._holds if h[4] == scope]:  # ON DELETE CASCADE
                del self._holds[hold]
            return _budget(scope, b), self._rearm_over_budget(lambda row: row.tenant == tenant)


def _budget(scope: str, figures: dict[str, Any]) -> Budget:
    return Budget(scope=scope, **figures)
