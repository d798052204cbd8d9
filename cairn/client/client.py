"""Client: what a web app uses to start runs, read them and wait for them. Enqueues by
workflow name.

It needs neither the workflows' code nor Celery's worker: it writes the run to the store
(Postgres, or any store of the contract: cairn.testing.MemoryStore in a test) and sends
one message naming the run (cairn.client.sender). Celery is imported on the first
enqueue. AsyncClient (cairn.client.aio) is its face for asyncio.
"""

from __future__ import annotations

import builtins  # `list` in a Client's annotations is its method
import dataclasses
import datetime as dt
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Self

from cairn.client.checks import (
    checked,
    checked_debounce,
    checked_fork,
    checked_replay,
    checked_schedule,
    checked_signal,
    flow,
    known,
    now,
)
from cairn.client.sender import Sender, no_broker
from cairn.core import tracing
from cairn.core.errors import CairnError, InvalidInput, RunEnded, UnknownRun
from cairn.core.inputs import check_input, check_run_id
from cairn.core.records import (
    DECISIONS,
    Approval,
    ApprovalFilter,
    CallRecord,
    Rule,
    Run,
    RunFilter,
    StepRecord,
)
from cairn.core.settings import Settings
from cairn.core.status import CANCEL_REASON, STOPPED, RunStatus
from cairn.store.checkpoints import PgStore
from cairn.store.db import Database
from cairn.store.schedules import Schedule
from cairn.store.transactional import create_run_in, debounce_in
from cairn.workers import health
from cairn.workers import schedules as sched

if TYPE_CHECKING:
    from cairn.core.events import Event
    from cairn.store.contract import CheckpointStore
    from cairn.store.events import RedisEvents
    from cairn.workers.outbox import EventLog


# Runs re-armed a transaction by Client.replay, each batch's messages sent after its commit:
# a crash mid-replay leaves the rest failed (replay again), and a batch committed but not
# sent pending, which the reaper sends as it does any run whose message was lost.
REPLAY_BATCH = 500


class Client:
    """Enqueue, get and list runs.

        with cairn.Client() as client:            # CAIRN_DATABASE_URL, CAIRN_BROKER_URL
            run_id = client.enqueue("invoice", {"customer": "acme", "email": "a@acme.test"})
            print(client.get(run_id).status)

    URLs not given come from the environment (Settings.from_env()).

    What each kind of operation returns: one that creates a run, its id (enqueue, fork);
    one that changes a run, the Run as it stands after (cancel, rewind, resolve, wait);
    one that records something, whether it was new (signal: False for a signal id sent
    before); a read, Runs (get, list, children, forks, replay) or typed records
    (history: StepRecord, calls: CallRecord). An unknown run is UnknownRun, but for get
    (None) and the reads of lists ([]).

    Args:
        store: the runs' store (any of the contract, store/contract.py); default: a
            PgStore on the database URL, with a pool of pool_size connections.
        send: how a run's message is sent, send(run_id, priority); default: Celery's
            producer on the broker URL, for a PgStore. A test on cairn.testing.MemoryStore
            passes cairn.testing.LocalWorker's, which runs the runs in process.
        events: where the runs' live events are read (Client.events); default: Redis at
            the Redis URL. A LocalWorker's `events` in a test.
    """

    def __init__(
        self,
        database_url: str | None = None,
        broker_url: str | None = None,
        *,
        settings: Settings | None = None,
        pool_size: int = 4,
        store: CheckpointStore | None = None,
        send: Callable[[str, int], None] | None = None,
        events: EventLog | None = None,
    ) -> None:
        base = settings or Settings.from_env()
        self.settings = base.with_options(database_url=database_url, broker_url=broker_url)
        s = self.settings
        self._db: Database | None = None  # made here, so closed here
        if store is None:
            self._db = Database(
                s.database_url,
                max_size=pool_size,
                give_up_after=s.client_give_up_after,
                prepare=s.database_prepare,
                listen_url=s.listen_url,  # its waits' one connection
            )
            store = PgStore(self._db)
        self.store: CheckpointStore = store
        # Celery's producer only for runs a fleet reads from Postgres; any other store
        # has no broker unless given one.
        self._sender = Sender(s) if send is None and isinstance(store, PgStore) else None
        self._send = send or (self._sender.send if self._sender else no_broker)
        tracing.setup(self.settings, "cairn-client")  # CAIRN_TRACING: spans for enqueues
        self._event_log = events
        self._redis_log: RedisEvents | None = None  # Redis, on the first events()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close what this Client opened: its pool, its producer, its Redis reader (a
        store or an event log it was given stays open)."""
        if self._db is not None:
            self._db.close()
        if self._sender is not None:
            self._sender.close()
        if self._redis_log is not None:
            self._redis_log.close()

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
        beat's dispatcher; by the reaper after CAIRN_PENDING_AFTER if that one missed
        it); a rollback leaves no run and sends nothing. Needs Postgres
        (docs/guides/enqueue.md).
        debounce_key, debounce, max_wait: the enqueues of this workflow with this key
        collapse into one run, which starts once no enqueue came for `debounce` seconds
        (but at most max_wait seconds after the first; None: no bound) with the latest
        input; each returns that run's id until it starts. Beat's wake pass sends it, as
        it ends a sleep. Takes no run_id nor concurrency_key.

        Raises:
            InvalidInput: a bad input, run id or option (debounce <= 0, max_wait below
                debounce, a debounce without a key); nothing written.
            RunIdConflict: run_id names a run with another workflow or input.
        """
        debounced = checked_debounce(debounce_key, debounce, max_wait, run_id, concurrency_key)
        run_id, data = checked(self.settings, workflow, input, run_id)
        key, limit, prio = flow(workflow, concurrency_key, concurrency_limit, priority)
        with tracing.enqueuing(workflow, run_id, concurrency_key=key, priority=prio) as trace:
            if debounced is not None:  # nothing sent: the wake pass sends it when due
                if connection is not None:
                    self._on_postgres()
                    return debounce_in(
                        connection, run_id, workflow, data, *debounced,
                        max_cost_usd=max_cost_usd, priority=prio, traceparent=trace,
                    )  # fmt: skip
                return self.store.debounce(
                    run_id, workflow, data, *debounced, max_cost_usd=max_cost_usd,
                    priority=prio, traceparent=trace,
                )[0]  # fmt: skip
            if connection is not None:
                # Nothing is sent from here: the caller's commit is not ours to see, and
                # a send before it could start a run the caller then rolls back.
                self._on_postgres()
                create_run_in(
                    connection, run_id, workflow, data, max_cost_usd=max_cost_usd,
                    priority=prio, concurrency_key=key, concurrency_limit=limit,
                    traceparent=trace,
                )  # fmt: skip
                return run_id
            created = self.store.create_run(
                run_id, workflow, data, max_cost_usd=max_cost_usd, priority=prio,
                concurrency_key=key, concurrency_limit=limit, traceparent=trace,
            )  # fmt: skip
            if key is None:
                self.send(run_id, priority=prio)
            elif not self._send_admitted(workflow, key, run_id) and not created:
                run = self.get(run_id)  # enqueued again: its message may be what was lost
                if run is not None and run.status == RunStatus.PENDING:
                    self.send(run_id, priority=run.priority)
        return run_id

    def _on_postgres(self) -> None:
        if not isinstance(self.store, PgStore):
            raise InvalidInput(
                f"enqueue(connection=...) writes the run in your Postgres transaction: it "
                f"needs a Client on Postgres, not {type(self.store).__name__}"
            )

    def _send_admitted(self, workflow: str, key: str, run_id: str | None = None) -> bool:
        """Send the key's runs admitted and not sent yet; whether run_id was one."""
        sent = False
        for admitted, prio in self.store.admitted(workflow, key):
            self.send(admitted, priority=prio)
            sent = sent or admitted == run_id
        return sent

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
    ) -> list[Run]:
        """Runs, newest first, filtered by status, workflow and creation time [since,
        until); pass the last run id of a page as `after` for the next page."""
        which = RunFilter(
            status=status, limit=limit, workflow=workflow, after=after, since=since, until=until
        )
        return self.store.list_runs(which)

    def counts(self) -> dict[RunStatus, int]:
        """How many runs are in each status."""
        return {RunStatus(status): int(row["n"]) for status, row in self.store.counts().items()}

    def cancel(self, run_id: str, reason: str = CANCEL_REASON) -> Run:
        """Stop a run: a pending one at once, a running one at its next step boundary
        (before any further effect or model call); the run as it stands after. Raises
        UnknownRun."""
        self.store.cancel(run_id, reason)
        run = self.get(run_id)
        if run is None:
            raise UnknownRun(f"no run {run_id!r}")
        if run.parent_id is not None and self.store.gathered(run.parent_id):
            self.send(run.parent_id)  # its stop gathered the parent's spawn: wake it
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
                self.send(new)
        return new

    def rewind(self, run_id: str, *, to_seq: int) -> Run:
        """Move a stopped run (done, failed, cancelled, ...) back to the checkpoint it
        saved at seq to_seq, in place, and send it on. The steps it replays get new visit
        numbers, so new idempotency keys: an effect the first pass made is made again
        unless the downstream dedupes on its own key. Raises RunNotStopped for a run that
        is pending, running, waiting or queued (cancel it first), UnknownRun, InvalidInput."""
        at, _ = checked_fork(self.settings, to_seq, None)
        self.store.rewind(run_id, at)
        self.send(run_id)
        run = self.get(run_id)
        assert run is not None
        return run

    def forks(self, run_id: str) -> builtins.list[Run]:
        """The runs forked from run_id (Client.fork), oldest first."""
        return self.store.forks(run_id)

    def replay(
        self,
        workflow: str,
        *,
        since: dt.datetime,
        until: dt.datetime | None = None,
        status: RunStatus | str | tuple[RunStatus | str, ...] = RunStatus.FAILED,
        limit: int | None = None,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> builtins.list[Run]:
        """Replay the workflow's runs that failed since a time: each goes on from its last
        saved step (its cursor), retries counted afresh, as enqueueing it again would do.
        A replayed step keeps its visit, so its effects keep their idempotency keys: a
        send that went out before the failure is deduplicated, not made twice.

        since/until: when the runs stopped, [since, until) (until: the replay's start, by
        the database's clock). status: "failed" and/or "incompatible" (after a deploy
        that brings the step back). dry_run: only which runs (nothing written or sent).
        Returns the runs as they stopped, oldest first; progress(n) after each batch.
        Two replays at once re-arm each run once; a run that fails again during this
        replay waits for the next one."""
        statuses, since, until, limit = checked_replay(status, since, until, limit)
        until = until or self.store.clock()
        if dry_run:
            return self.store.replay(workflow, statuses, since, until, limit, dry_run=True)
        replayed: list[Run] = []
        while len(replayed) < limit:
            batch = self.store.replay(
                workflow, statuses, since, until, min(REPLAY_BATCH, limit - len(replayed))
            )
            if not batch:
                break
            for run in batch:  # after the batch's commit; a queued one's delivery waits
                self.send(run.run_id, priority=run.priority)
            replayed += batch
            if progress is not None:
                progress(len(replayed))
        return replayed

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
            self.send(run_id)  # a waiting run wakes; a busy one finds it at its wait
        return stored

    def steer(self, run_id: str, message: Any) -> int:
        """Send a running agent a message (JSON: a string, or a dict such as {"role":
        "user", "content": ...}): stored durably, and delivered once, in order, to the step
        at its next ctx.messages(). Returns the message's number in the run (1, 2, ...).
        Raises UnknownRun, or RunEnded when the run has ended (done, failed, cancelled)."""
        check_input({"message": message}, self.settings.max_input_bytes)
        found = self.store.steer(run_id, message)
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
        check_input({"result": result}, self.settings.max_input_bytes)
        rearmed, _ = self.store.resolve(run_id, done, result)
        run = self.get(run_id)
        if run is None:
            raise UnknownRun(f"no run {run_id!r}")
        if rearmed:
            self.send(run_id)
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

    def _events(self) -> EventLog:
        if self._event_log is not None:
            return self._event_log
        if self._redis_log is None:
            from cairn.store.events import RedisEvents

            self._redis_log = RedisEvents.from_url(self.settings.redis_url)
        return self._redis_log

    def problems(self) -> builtins.list[str]:
        """One line per service (Postgres, the broker) that does not answer within
        CAIRN_CLIENT_GIVE_UP_AFTER; empty when both do."""
        found = []
        try:
            self.store.ping()
        except CairnError as exc:
            found.append(str(exc))
        if self._sender is not None:  # a send given is the caller's to check
            found += health.broker_problems(self.settings)
        return found

    def add_schedule(
        self,
        name: str,
        workflow: str,
        input: dict[str, Any] | None = None,
        *,
        cron: str | None = None,
        every: int | None = None,
        catch_up: str = "latest",
        replace: bool = False,
    ) -> Schedule:
        """Start `workflow` with `input` on a clock, one run per tick, whose id is
        `sched:<name>:<UTC tick>` (e.g. sched:nightly:20261204T030000Z).

        Args:
            name: 1-100 letters, digits and . _ -.
            cron: a cron expression in UTC ("0 3 * * *"); or every: seconds between ticks
                (at whole multiples of it since the Unix epoch). One of the two.
            catch_up: the ticks missed while no firer ran: "latest" fires the most recent,
                "all" each of them (100 per pass), "skip" none.
            replace: overwrite a schedule of that name (it keeps its paused state, and its
                next tick if the timing is unchanged).

        Returns:
            The schedule stored. Adding the same definition again returns it as it is.

        Raises:
            InvalidInput: a bad name, cron, interval, catch_up or input; nothing written.
            ScheduleConflict: the name holds another definition and replace is False.
        """
        wanted = checked_schedule(self.settings, name, workflow, input, cron, every, catch_up)
        store = self.store.schedule_store()
        stored = store.add(wanted, replace=replace)
        return sched.added(wanted, stored, None if stored else store.get(name))

    def schedules(self) -> builtins.list[Schedule]:
        """Every schedule, by name."""
        return self.store.schedule_store().list_schedules()

    def pause_schedule(self, name: str) -> Schedule:
        """Stop firing the schedule until resumed. Raises UnknownSchedule."""
        return known(name, self.store.schedule_store().pause(name))

    def resume_schedule(self, name: str) -> Schedule:
        """Fire the schedule again from its next tick after now (ticks while it was
        paused are not fired). Resuming an active schedule changes nothing. Raises
        UnknownSchedule."""
        store = self.store.schedule_store()
        current = known(name, store.get(name))
        resumed = store.resume(current, sched.timing(current).after(now()))
        return resumed or known(name, store.get(name))

    def remove_schedule(self, name: str) -> bool:
        """Delete the schedule (its runs stay); False if there was none."""
        return self.store.schedule_store().remove(name)

    # -- approvals -----------------------------------------------------------------------
    def approvals(
        self,
        *,
        workflow: str | None = None,
        name: str | None = None,
        limit: int = 50,
        after: int | None = None,
        oldest_first: bool = False,
    ) -> builtins.list[Approval]:
        """The runs waiting on a person across runs (StepResult.wait with request=, the
        integrations' tool approvals), newest first (or oldest): each Approval says what it
        asks. Filter by workflow and by the wait's event name; `after`: the last approval
        id of the previous page."""
        if not 1 <= limit <= 1000:
            raise InvalidInput(f"limit={limit}: give 1 to 1000")
        which = ApprovalFilter(workflow, name, limit, after, oldest_first)
        return self.store.approval_store().list_approvals(which)

    def approval(self, approval_id: int) -> Approval | None:
        """One approval, with its decision (who, what, when) once decided; None if none."""
        return self.store.approval_store().get(approval_id)

    def decide(
        self,
        approval_id: int,
        decision: str,
        *,
        args: dict[str, Any] | None = None,
        note: str | None = None,
        by: str = "admin",
    ) -> Approval:
        """Decide an approval: "approve", "deny", or "edit" (approve with args, the edited
        arguments). Its run gets the signal it waits on, {"decision", "args", "note",
        "approval_id", "by"}, stored in one transaction with the audit row (by: who
        decided). Returns the approval as decided. A request is decided once: raises
        AlreadyDecided for a second decision, ApprovalGone when its run no longer waits,
        UnknownApproval."""
        if decision not in DECISIONS:
            raise InvalidInput(f"decision {decision!r}: one of {', '.join(DECISIONS)}")
        if (decision == "edit") != (args is not None):
            raise InvalidInput("an edit gives the edited args (a dict); approve and deny none")
        if args is not None and not isinstance(args, dict):
            raise InvalidInput(f"args: a dict of the tool's arguments, not {type(args).__name__}")
        payload = {"decision": decision, "args": args, "note": note,
                   "approval_id": approval_id, "by": by}  # fmt: skip
        check_input(payload, self.settings.max_input_bytes)
        store = self.store.approval_store()
        with tracing.spanning("cairn.decide", approval_id=approval_id) as trace:
            run_id = store.decide(approval_id, decision, payload, by, trace)
        self.send(run_id)  # the run waits on it: wake it
        decided = store.get(approval_id)
        assert decided is not None
        return decided

    def add_rule(self, workflow: str, tool: str, *, by: str = "admin") -> Rule:
        """A standing rule: from now on a request of workflow for tool is approved as its
        run saves the wait (the run does not park; the audit row names the rule). The same
        workflow and tool twice is one rule."""
        for what, value in (("workflow", workflow), ("tool", tool)):
            if not isinstance(value, str) or not 0 < len(value) <= 200:
                raise InvalidInput(f"{what} {value!r}: a name of 1-200 characters")
        return self.store.approval_store().add_rule(workflow, tool, by)[0]

    def rules(self) -> builtins.list[Rule]:
        """Every standing rule, oldest first."""
        return self.store.approval_store().rules()

    def remove_rule(self, rule_id: int) -> bool:
        """Delete a standing rule; False if there was none."""
        return self.store.approval_store().remove_rule(rule_id)
