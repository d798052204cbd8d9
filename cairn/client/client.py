"""Client: what a web app uses to start runs, read them and wait for them. Enqueues by
workflow name.

It needs neither the workflows' code nor Celery's worker: it writes the run to the store
(Postgres, or any store of the contract: cairn.testing.MemoryStore in a test) and sends
one message naming the run (cairn.client.sender). Celery is imported on the first
enqueue. AsyncClient (cairn.client.aio) is its face for asyncio.
"""

from __future__ import annotations

import builtins  # `list` in a Client's annotations is its method
import copy
import dataclasses
import datetime as dt
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Self

from cairn.client.checks import (
    checked,
    checked_budget,
    checked_debounce,
    checked_fork,
    checked_replay,
    checked_schedule,
    checked_signal,
    checked_tenant_budget,
    flow,
    known,
    now,
)
from cairn.client.sender import Sender, no_broker
from cairn.core import tracing
from cairn.core.errors import (
    CairnError,
    InvalidInput,
    RunEnded,
    RunIdConflict,
    UnknownBudget,
    UnknownRun,
)
from cairn.core.inputs import TENANT_KEY, check_input, check_run_id, check_tenant
from cairn.core.records import (
    DECISIONS,
    Approval,
    ApprovalFilter,
    Budget,
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


# Between a tenant and its debounce key in the stored key: a character no key or tenant
# has, so two tenants' keys never collapse into one run.
TENANT_SEP = "\x1f"

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
        tenant: act for this tenant only: its enqueues are the tenant's runs, and its
            reads, lists, signals, cancels and steers see that tenant's runs alone
            (another's is UnknownRun, or absent from a list). None: every run.
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
        tenant: str | None = None,
    ) -> None:
        self.tenant = check_tenant(tenant) if tenant is not None else None
        self._view = False  # a for_tenant() view closes nothing: its origin owns it all
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

    def for_tenant(self, tenant: str) -> Client:
        """This Client acting for one tenant, on the same pool, producer and reader (a
        server's per-request view: closing it closes nothing)."""
        view = copy.copy(self)
        view.tenant, view._view = check_tenant(tenant), True
        return view

    def close(self) -> None:
        """Close what this Client opened: its pool, its producer, its Redis reader (a
        store or an event log it was given stays open)."""
        if self._view:
            return
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
        beat's dispatcher; by the reaper after CAIRN_PENDING_AFTER if that one missed
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
                self.send(run_id, priority=prio)
            elif not self._send_admitted(workflow, key, run_id) and not created:
                run = self.get(run_id)  # enqueued again: its message may be what was lost
                if run is not None and run.status == RunStatus.PENDING:
                    self.send(run_id, priority=run.priority)
        return run_id

    def _debounced(
        self, debounced: tuple[str, float, float | None] | None
    ) -> tuple[str, float, float | None] | None:
        """The debounce options with the key this Client's tenant stores it under."""
        if debounced is None or self.tenant is None:
            return debounced
        key, wait, max_wait = debounced
        return f"{self.tenant}{TENANT_SEP}{key}", wait, max_wait

    def _tenant_key(self, key: str | None, limit: int, prio: int) -> tuple[str | None, int, int]:
        """The flow options with the tenant's concurrency key (CAIRN_TENANT_CONCURRENCY) for
        a run of a tenant that has no key of its own."""
        if key is None and self.tenant is not None and self.settings.tenant_concurrency > 0:
            return f"{TENANT_KEY}{self.tenant}", self.settings.tenant_concurrency, prio
        return key, limit, prio

    def _sees(self, run: Run | None) -> Run | None:
        """The run if this Client may see it (its tenant's, or any without a tenant)."""
        if run is None or self.tenant is None or run.tenant == self.tenant:
            return run
        return None

    def _known(self, run_id: str) -> None:
        """UnknownRun unless the run exists and this Client may act on it: another
        tenant's run is no run (never a refusal that says it exists)."""
        if self.tenant is not None and self.get(run_id) is None:
            raise UnknownRun(f"no run {run_id!r}")

    def _hidden(self, run_id: str) -> bool:
        return self.tenant is not None and self.get(run_id) is None

    def _admin_only(self, what: str) -> None:
        if self.tenant is not None:
            raise InvalidInput(f"{what} acts on every tenant's runs: use a Client with no tenant")

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
        run = self._sees(self.store.get(run_id))
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

    def cancel(self, run_id: str, reason: str = CANCEL_REASON) -> Run:
        """Stop a run: a pending one at once, a running one at its next step boundary
        (before any further effect or model call); the run as it stands after. Raises
        UnknownRun."""
        self._known(run_id)
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
        return [] if self._hidden(run_id) else self.store.children(run_id)

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
        self._known(run_id)
        with tracing.spanning(
            "cairn.fork", producer=True, run_id=new, forked_from=run_id, forked_at=at
        ) as trace:
            if self.store.fork(run_id, at, new, patch, trace):
                self.send(new)
            elif self._hidden(new):  # new_run_id names another tenant's run
                raise RunIdConflict(f"run id {new!r} is taken; use a new run id")
        return new

    def rewind(self, run_id: str, *, to_seq: int) -> Run:
        """Move a stopped run (done, failed, cancelled, ...) back to the checkpoint it
        saved at seq to_seq, in place, and send it on. The steps it replays get new visit
        numbers, so new idempotency keys: an effect the first pass made is made again
        unless the downstream dedupes on its own key. Raises RunNotStopped for a run that
        is pending, running, waiting or queued (cancel it first), UnknownRun, InvalidInput."""
        at, _ = checked_fork(self.settings, to_seq, None)
        self._known(run_id)
        self.store.rewind(run_id, at)
        self.send(run_id)
        run = self.get(run_id)
        assert run is not None
        return run

    def forks(self, run_id: str) -> builtins.list[Run]:
        """The runs forked from run_id (Client.fork), oldest first."""
        return [] if self._hidden(run_id) else self.store.forks(run_id)

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
        self._admin_only("replay")
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
        self._known(run_id)
        with tracing.spanning("cairn.signal", run_id=run_id, event=event) as trace:
            found = self.store.signal(run_id, event, payload, signal_id, trace)
        if found is None:
            raise UnknownRun(f"no run {run_id!r}")
        status, stored = found
        if stored and status not in STOPPED:
            self.send(run_id)  # a waiting run wakes; a busy one finds it at its wait
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
        self._known(run_id)
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
        self._known(run_id)
        rearmed, _ = self.store.resolve(run_id, done, result)
        run = self.get(run_id)
        if run is None:
            raise UnknownRun(f"no run {run_id!r}")
        if rearmed:
            self.send(run_id)
        return run

    def budget(self, run_id: str) -> Budget:
        """The budget run_id was enqueued with (budget_usd=): its limit, what the tree's
        journaled calls cost (spent_usd) and what its calls in flight may cost at worst
        (reserved_usd). Raises UnknownRun, or InvalidInput when the run has no budget."""
        self._known(run_id)
        got = self.store.budget(run_id)
        if got is None:
            raise self._no_budget(run_id)
        return got

    def raise_budget(
        self, run_id: str, *, usd: float | None = None, tokens: int | None = None
    ) -> Budget:
        """Set the limits given (usd, tokens; higher or lower) of the budget run_id was
        enqueued with, and resume the runs of its tree that stopped as budget_exceeded:
        each goes on at the call that stopped it, which is checked again. Raises
        UnknownRun, or InvalidInput when the run has no budget or neither limit is given
        as a number above 0."""
        if usd is None and tokens is None:
            raise InvalidInput("raise_budget: give usd=, tokens= or both")
        checked_budget(usd, tokens, None, False)
        self._known(run_id)
        rearmed = self.store.raise_budget(run_id, usd, tokens)
        if rearmed is None:
            raise self._no_budget(run_id)
        self._send_rearmed(rearmed)
        return self.budget(run_id)

    def _send_rearmed(self, rearmed: Iterable[str]) -> None:
        """Send the runs a budget's change re-armed (a run queued behind its concurrency
        key is left to the key's release)."""
        for rid in rearmed:
            run = self.get(rid)
            if run is not None and run.status == RunStatus.PENDING:
                self.send(rid, priority=run.priority)

    def set_tenant_budget(
        self,
        tenant: str,
        *,
        usd: float | None = None,
        tokens: int | None = None,
        per: str | None = None,
        soft: float | None = None,
    ) -> Budget:
        """Give the tenant a budget per UTC day or month (per: "day" or "month"), or change
        it: the limits given (usd, tokens), per and soft (None: kept; a new budget counts
        per "day" unless told). Every run of the tenant spends against it from its next
        claim, beside its own tree's budget; a model call that would pass it stops its run
        as budget_exceeded first. Each new period starts from nothing spent. The tenant's
        runs stopped over budget go on (each checked again at the call that stopped it):
        given nothing, it changes nothing else (after a new day, say).
        An admin's: a Client with a tenant gets InvalidInput, as does a bad argument;
        a new budget without a limit, UnknownBudget (an InvalidInput)."""
        if self.tenant is not None:
            raise InvalidInput(
                "set_tenant_budget is an admin's: a Client with a tenant cannot set budgets"
            )
        checked_tenant_budget(tenant, usd, tokens, per, soft)
        rearmed = self.store.set_tenant_budget(tenant, usd, tokens, per, soft)
        if rearmed is None:
            raise UnknownBudget(
                f"tenant {tenant!r} has no budget yet: a new one needs a limit "
                "(usd=, tokens=; cairn budgets set --usd N, --tokens N)"
            )
        self._send_rearmed(rearmed)
        return self.tenant_budget(tenant)

    def delete_tenant_budget(self, tenant: str) -> Budget:
        """Delete the tenant's budget: its runs no longer spend against any (those in
        flight from their next model call), and its runs stopped over budget go on (each
        checked again at the call that stopped it, against its own tree's budget if any).

        Args:
            tenant: the tenant whose budget goes.

        Returns:
            The budget as it stood when deleted (this period's spend).

        Raises:
            UnknownBudget (an InvalidInput): the tenant has no budget.
            InvalidInput: a bad tenant name, or a Client with a tenant (an admin's call).
        """
        if self.tenant is not None:
            raise InvalidInput(
                "delete_tenant_budget is an admin's: a Client with a tenant cannot delete budgets"
            )
        check_tenant(tenant)
        got = self.store.delete_tenant_budget(tenant)
        if got is None:
            raise UnknownBudget(f"tenant {tenant!r} has no budget to delete")
        budget, rearmed = got
        self._send_rearmed(rearmed)
        return budget

    def tenant_budget(self, tenant: str) -> Budget:
        """The tenant's budget in this period: its limits, period and period_start, what
        its runs' journaled calls cost since (spent_*) and what their calls in flight may
        cost at worst (reserved_*). A Client with a tenant reads its own only. Raises
        UnknownBudget (an InvalidInput) when the tenant has none."""
        check_tenant(tenant)
        got = self.store.tenant_budget(tenant) if self.tenant in (None, tenant) else None
        if got is None:
            raise UnknownBudget(
                f"tenant {tenant!r} has no budget: cairn budgets set --tenant {tenant} "
                "--usd N --per day gives it one"
            )
        return got

    def _no_budget(self, run_id: str) -> Exception:
        if self.get(run_id) is None:
            return UnknownRun(f"no run {run_id!r}")
        return InvalidInput(
            f"run {run_id!r} has no budget: enqueue(..., budget_usd=...) gives a run one"
        )

    def wait(self, run_id: str, timeout: float | None = 60.0) -> Run:
        """The run once it is done, failed, cancelled (any stopped status) or waiting for a
        signal: woken by Postgres LISTEN/NOTIFY, not by polling. All of a Client's waits
        share one listening connection, opened on the first wait and closed with the
        Client. Raises UnknownRun, or cairn.WaitTimedOut (a TimeoutError) after timeout
        seconds (None: no limit)."""
        self._known(run_id)
        return self.store.wait(run_id, timeout)

    def history(self, run_id: str) -> builtins.list[StepRecord]:
        """The run's step timeline, oldest first: one record per step attempt that ended.
        [] for an unknown run."""
        if self._hidden(run_id):
            return []
        return [StepRecord.from_row(r) for r in self.store.history(run_id)]

    def calls(self, run_id: str, limit: int = 500) -> builtins.list[CallRecord]:
        """The run's journaled calls (ctx.call, ctx.model, an agent's model requests and
        tool calls), oldest first. [] for an unknown run."""
        if self._hidden(run_id):
            return []
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

        self._known(run_id)
        until = None if timeout is None else time.monotonic() + timeout
        return follow(self.store, self._events(), run_id, after, until=until)

    def events_token(self, run_id: str) -> str:
        """A token that reads this run's events and nothing else, for a browser to pass
        as GET /runs/{id}/events?token= (an EventSource sends no Authorization header).
        Needs CAIRN_API_TOKEN, the server's."""
        from cairn.client.events import read_token

        self._known(run_id)
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
        self._admin_only("a schedule")
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
        which = ApprovalFilter(workflow, name, limit, after, oldest_first, self.tenant)
        return self.store.approval_store().list_approvals(which)

    def approval(self, approval_id: int) -> Approval | None:
        """One approval, with its decision (who, what, when) once decided; None if none
        (or one of another tenant's runs)."""
        return self.store.approval_store().get(approval_id, self.tenant)

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
        check_input(payload, self.settings.max_input_bytes, what="decision", envelope=1)
        store = self.store.approval_store()
        with tracing.spanning("cairn.decide", approval_id=approval_id) as trace:
            run_id = store.decide(approval_id, decision, payload, by, trace, self.tenant)
        self.send(run_id)  # the run waits on it: wake it
        decided = store.get(approval_id, self.tenant)
        assert decided is not None
        return decided

    def add_rule(self, workflow: str, tool: str, *, by: str = "admin") -> Rule:
        """A standing rule: from now on a request of workflow for tool is approved as its
        run saves the wait (the run does not park; the audit row names the rule). The same
        workflow and tool twice is one rule. A tenant's Client makes a rule for its
        tenant's runs only; one with no tenant, for every run."""
        for what, value in (("workflow", workflow), ("tool", tool)):
            if not isinstance(value, str) or not 0 < len(value) <= 200:
                raise InvalidInput(f"{what} {value!r}: a name of 1-200 characters")
        return self.store.approval_store().add_rule(workflow, tool, by, self.tenant)[0]

    def rules(self) -> builtins.list[Rule]:
        """Every standing rule (a tenant's Client: its tenant's), oldest first."""
        return self.store.approval_store().rules(self.tenant)

    def remove_rule(self, rule_id: int) -> bool:
        """Delete a standing rule (a tenant's Client: only its own); False if there was
        none."""
        return self.store.approval_store().remove_rule(rule_id, self.tenant)
