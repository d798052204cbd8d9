"""A Client's operations on runs: enqueue them, read them, list and count them, cancel,
signal, steer, resolve, fork and rewind them, wait for them and follow their events.
Each takes its tenancy decision first (cairn.client.tenancy: Client is `enforced`)."""

from __future__ import annotations

import builtins  # `list` in a Client's annotations is its method
import dataclasses
import datetime as dt
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from cairn.client.base import ClientBase
from cairn.client.checks import (
    checked,
    checked_budget,
    checked_debounce,
    checked_fork,
    checked_signal,
    flow,
)
from cairn.core import tracing
from cairn.core.errors import InvalidInput, RunEnded, RunIdConflict, UnknownRun
from cairn.core.inputs import check_input, check_run_id, check_tenant
from cairn.core.records import CallRecord, Run, RunFilter, StepRecord
from cairn.core.status import CANCEL_REASON, STOPPED, RunStatus
from cairn.store.transactional import create_run_in, debounce_in

if TYPE_CHECKING:
    from cairn.core.events import Event


class Runs(ClientBase):
    """Client's operations on runs."""

    def enqueue(
        self,
        workflow: str,
        input: dict[str, Any] | None = None,
        *,
        run_id: str | None = None,
        max_cost_usd: float | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        priority: int | None = None,
        connection: object | None = None,
        debounce_key: str | None = None,
        debounce: float | None = None,
        max_wait: float | None = None,
        budget_usd: float | None = None,
        budget_soft: float | None = None,
        budget_tokens: int | None = None,
    ) -> str:
        """Record the run and send it to the workers; returns its run id.

        The same run id with the same workflow and input is the same run: a retried
        enqueue returns it (a failed run is re-armed at its cursor), never starts it over.
        The same id with another workflow or input raises RunIdConflict. When the
        workflow is registered in this process its input is validated here (InvalidInput
        before anything is written); otherwise the worker validates it. max_cost_usd caps
        the run's model cost (default: the workers' CAIRN_MAX_COST_USD).

        concurrency_key: at most concurrency_limit runs of this workflow with this key
        run at a time (from start to stop; a waiting run keeps its slot); the others wait
        as queued, holding no worker, and start as slots free, best priority first.
        priority: higher starts first (-100..100). Both limit and priority default to
        the workflow's (cairn.workflow(..., concurrency_limit=, priority=)) when it is
        registered here, else to 1 and 0.
        connection: your psycopg 3 Connection (AsyncClient: an AsyncConnection too), in
        your open transaction: the run is written in it and sent once it commits (by
        beat's dispatcher; by the reaper after CAIRN_LOST_AFTER if that one missed
        it); a rollback leaves no run and sends nothing. Needs Postgres
        (docs/guides/enqueue.md).
        debounce_key, debounce, max_wait: the enqueues of this workflow with this key
        collapse into one run, which starts once no enqueue came for `debounce` seconds
        (but at most max_wait seconds after the first; None: no bound) with the latest
        input; each returns that run's id until it starts. Beat's wake pass sends it, as
        it ends a sleep. Takes no run_id nor concurrency_key.
        budget_usd: a budget over the run and every run it spawns (and theirs): a model
        call of any of them that could take the tree's journaled cost past it stops that
        run as budget_exceeded first, until raise_budget; budget_tokens: the same in model
        tokens (prompt and output), alone or beside it; budget_soft (0..1): the fraction
        of each whose crossing is a `budget_soft` event and a metric, once
        (docs/guides/budgets.md). Not with connection= or a debounce.

        Raises:
            InvalidInput: a bad input, run id or option (debounce <= 0, max_wait below
                debounce, a debounce without a key); nothing written.
            RunIdConflict: run_id names a run with another workflow or input.
        """
        debounced = self._debounced(
            checked_debounce(debounce_key, debounce, max_wait, run_id, concurrency_key)
        )
        elsewhere = connection is not None or debounced is not None
        checked_budget(budget_usd, budget_tokens, budget_soft, elsewhere)
        run_id, data = checked(self.settings, workflow, input, run_id)
        key, limit, prio = self._tenant_key(
            *flow(workflow, concurrency_key, concurrency_limit, priority)
        )
        tenant = self.tenant
        with tracing.enqueuing(workflow, run_id, concurrency_key=key, priority=prio) as trace:
            if debounced is not None:  # nothing sent: the wake pass sends it when due
                if connection is not None:
                    self._on_postgres()
                    return debounce_in(
                        connection, run_id, workflow, data, *debounced,
                        max_cost_usd=max_cost_usd, priority=prio, traceparent=trace,
                        tenant=tenant,
                    )  # fmt: skip
                return self.store.debounce(
                    run_id, workflow, data, *debounced, max_cost_usd=max_cost_usd,
                    priority=prio, traceparent=trace, tenant=tenant,
                )[0]  # fmt: skip
            if connection is not None:
                # Nothing is sent from here: the caller's commit is not ours to see, and
                # a send before it could start a run the caller then rolls back.
                self._on_postgres()
                create_run_in(
                    connection, run_id, workflow, data, max_cost_usd=max_cost_usd,
                    priority=prio, concurrency_key=key, concurrency_limit=limit,
                    traceparent=trace, tenant=tenant,
                )  # fmt: skip
                return run_id
            created = self.store.create_run(
                run_id, workflow, data, max_cost_usd=max_cost_usd, priority=prio,
                concurrency_key=key, concurrency_limit=limit, traceparent=trace,
                tenant=tenant,
                budget_usd=budget_usd, budget_soft=budget_soft, budget_tokens=budget_tokens,
            )  # fmt: skip
            if key is None:
                self._send(run_id, prio)
            elif not self._send_admitted(workflow, key, run_id) and not created:
                run = self.get(run_id)  # enqueued again: its message may be what was lost
                if run is not None and run.status == RunStatus.PENDING:
                    self._send(run_id, run.priority)
        return run_id

    def send(self, run_id: str, *, priority: int = 0) -> None:
        """Put one message for run_id on the broker (the run must exist), on the queue
        of its priority."""
        self._send(run_id, priority)

    def get(self, run_id: str, *, window: bool = False) -> Run | None:
        """The run's status, cursor, state (its result once done), error and cost; the
        model window too with window=True. None if there is no such run."""
        run = self.store.get(run_id)
        if run is None or not window:
            return run
        row = self.store.load_row(run_id)
        return dataclasses.replace(run, window=tuple(row["window"]) if row else ())

    def list(
        self,
        status: RunStatus | None = None,
        limit: int = 50,
        *,
        workflow: str | None = None,
        after: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        tenant: str | None = None,
    ) -> list[Run]:
        """Runs, newest first, filtered by status, workflow, tenant and creation time
        [since, until); pass the last run id of a page as `after` for the next page. A
        Client with a tenant lists that tenant's runs only."""
        if tenant is not None:
            check_tenant(tenant)
            if self.tenant is not None and tenant != self.tenant:
                return []
        which = RunFilter(
            status=status, limit=limit, workflow=workflow, after=after, since=since,
            until=until, tenant=self.tenant or tenant,
        )  # fmt: skip
        return self.store.list_runs(which)

    def counts(self) -> dict[RunStatus, int]:
        """How many runs are in each status (a Client with a tenant: that tenant's)."""
        found = self.store.counts(self.tenant) if self.tenant else self.store.counts()
        return {RunStatus(status): int(row["n"]) for status, row in found.items()}

    def cancel(self, run_id: str, reason: str = CANCEL_REASON, *, by: str | None = None) -> Run:
        """Stop a run: a pending one at once, a running one at its next step boundary
        (before any further effect or model call).

        Args:
            run_id: the run.
            reason: why, its error once stopped.
            by: who asks, kept with the first cancel's reason (Run.cancelled_by); None:
                "token <id>" for a view of an API token, "tenant <name>" for a tenant's
                Client, else "admin".

        Returns:
            The run as it stands after.

        Raises:
            UnknownRun: no such run (or another tenant's).
        """
        self.store.cancel(run_id, reason, self._by(by))
        run = self.get(run_id)
        if run is None:
            raise UnknownRun(f"no run {run_id!r}")
        if run.parent_id is not None and self.store.gathered(run.parent_id):
            self._send(run.parent_id, 0)  # its stop gathered the parent's spawn: wake it
        if run.concurrency_key is not None:
            self._send_admitted(run.workflow, run.concurrency_key)  # its slot's next run
        return run

    def children(self, run_id: str) -> builtins.list[Run]:
        """The run's child runs (StepResult.spawn), each spawn's in the order its step
        listed them: status, state (the result once done), error. [] for none."""
        return self.store.children(run_id)

    def fork(
        self,
        run_id: str,
        *,
        at_seq: int,
        new_run_id: str | None = None,
        input_patch: dict[str, Any] | None = None,
    ) -> str:
        """Start a new run from the checkpoint run_id saved at seq at_seq (any status: the
        original is not touched), with its input merged with input_patch; returns the new
        run's id. It is a new run: its effects have their own idempotency keys, so the
        steps after at_seq make theirs again. The same new_run_id again returns it.
        Raises UnknownRun, or InvalidInput when no checkpoint was saved at that seq."""
        at, patch = checked_fork(self.settings, at_seq, input_patch)
        new = check_run_id(new_run_id) if new_run_id is not None else uuid.uuid4().hex
        with tracing.spanning(
            "cairn.fork", producer=True, run_id=new, forked_from=run_id, forked_at=at
        ) as trace:
            if self.store.fork(run_id, at, new, patch, trace):
                self._send(new, 0)
            elif (
                self.tenant is not None and self.get(new) is None
            ):  # new_run_id names another tenant's run
                raise RunIdConflict(f"run id {new!r} is taken; use a new run id")
        return new

    def rewind(self, run_id: str, *, to_seq: int) -> Run:
        """Move a stopped run (done, failed, cancelled, ...) back to the checkpoint it
        saved at seq to_seq, in place, and send it on. The steps it replays get new visit
        numbers, so new idempotency keys: an effect the first pass made is made again
        unless the downstream dedupes on its own key. Raises RunNotStopped for a run that
        is pending, running, waiting or queued (cancel it first), UnknownRun, InvalidInput."""
        at, _ = checked_fork(self.settings, to_seq, None)
        self.store.rewind(run_id, at)
        self._send(run_id, 0)
        run = self.get(run_id)
        assert run is not None
        return run

    def forks(self, run_id: str) -> builtins.list[Run]:
        """The runs forked from run_id (Client.fork), oldest first."""
        return self.store.forks(run_id)

    def signal(
        self, run_id: str, event: str, payload: Any = None, *, signal_id: str | None = None
    ) -> bool:
        """Send the run a signal of `event` with a JSON payload. It is stored durably: a
        run waiting for it wakes, a run that waits for it later finds it. The same
        signal_id twice is one signal (returns False the second time). Raises UnknownRun."""
        signal_id = checked_signal(self.settings, event, payload, signal_id)
        with tracing.spanning("cairn.signal", run_id=run_id, event=event) as trace:
            found = self.store.signal(run_id, event, payload, signal_id, trace)
        if found is None:
            raise UnknownRun(f"no run {run_id!r}")
        status, stored = found
        if stored and status not in STOPPED:
            self._send(run_id, 0)  # a waiting run wakes; a busy one finds it at its wait
        return stored

    def steer(self, run_id: str, message: Any, *, interrupt: bool = False) -> int:
        """Send a running agent a message (JSON: a string, or a dict such as {"role":
        "user", "content": ...}): stored durably, and delivered once, in order, to the step
        at its next ctx.messages(). Returns the message's number in the run (1, 2, ...).
        Raises UnknownRun, or RunEnded when the run has ended (done, failed, cancelled).

        interrupt: also cut the run's call in flight, if the step made it with
        interruptible=True (ctx.model, ctx.call): its answer is discarded, the cut
        journaled, and the call raises CallInterrupted, for the step to read this message.
        A call that is not in flight when the message commits is not cut; the message then
        waits, as any, for the next ctx.messages()."""
        check_input({"message": message}, self.settings.max_input_bytes, what="message", envelope=1)
        found = self.store.steer(run_id, message, interrupt)
        if found is None:
            raise UnknownRun(f"no run {run_id!r}")
        status, n = found
        if n is None:
            raise RunEnded(
                f"run {run_id} has ended ({status}): no step would read the message; "
                "enqueue a new run, or fork this one (cairn runs fork)"
            )
        return n

    def resolve(self, run_id: str, *, done: bool, result: Any = None) -> Run:
        """Settle a run stopped as unknown (an at-most-once effect whose outcome was lost):
        done=True records that the effect happened (result: what ctx.once returns on the
        replay), done=False that it did not (the replay runs it). The run goes on at its
        cursor. Resolving again changes nothing. Raises UnknownRun."""
        check_input({"result": result}, self.settings.max_input_bytes, what="result", envelope=1)
        rearmed, _ = self.store.resolve(run_id, done, result)
        run = self.get(run_id)
        if run is None:
            raise UnknownRun(f"no run {run_id!r}")
        if rearmed:
            self._send(run_id, 0)
        return run

    def wait(self, run_id: str, timeout: float | None = 60.0) -> Run:
        """The run once it is done, failed, cancelled (any stopped status) or waiting for a
        signal: woken by Postgres LISTEN/NOTIFY, not by polling. All of a Client's waits
        share one listening connection, opened on the first wait and closed with the
        Client. Raises UnknownRun, or cairn.WaitTimedOut (a TimeoutError) after timeout
        seconds (None: no limit)."""
        return self.store.wait(run_id, timeout)

    def history(self, run_id: str) -> builtins.list[StepRecord]:
        """The run's step timeline, oldest first: one record per step attempt that ended.
        [] for an unknown run."""
        return [StepRecord.from_row(r) for r in self.store.history(run_id)]

    def calls(self, run_id: str, limit: int = 500) -> builtins.list[CallRecord]:
        """The run's journaled calls (ctx.call, ctx.model, an agent's model requests and
        tool calls), oldest first. [] for an unknown run."""
        return [CallRecord.from_row(r) for r in self.store.calls(run_id, limit)]

    def events(
        self, run_id: str, after: str | None = None, *, timeout: float | None = None
    ) -> Iterator[Event]:
        """The run's events after the id `after` (None: from its first), live, until it
        ends: run_ended is the last. Each event has kind, data, id (pass the last one seen
        back as `after` to go on without a gap or a duplicate), and cursor, visit and
        attempt: drop an attempt's events when a `retry` or an `attempt_abandoned` names
        it. A `gap` event means the live stream could not serve everything (trimmed,
        expired, lost with Redis): the run's durable record follows. Raises UnknownRun.
        timeout: stop after that many seconds even if the run goes on."""
        from cairn.client.events import follow

        until = None if timeout is None else time.monotonic() + timeout
        return follow(self.store, self._events(), run_id, after, until=until)

    def events_token(self, run_id: str) -> str:
        """A token that reads this run's events and nothing else, for a browser to pass
        as GET /runs/{id}/events?token= (an EventSource sends no Authorization header).
        Needs CAIRN_API_TOKEN, the server's."""
        from cairn.client.events import read_token

        if not self.settings.api_token:
            raise InvalidInput("events_token needs CAIRN_API_TOKEN: the token cairn serve uses")
        return read_token(self.settings.api_token, run_id)
