"""Client and AsyncClient: what a web app uses to start runs, read them and wait for
them. Enqueues by workflow name.

They need neither the workflows' code nor Celery's worker: they write the run to the
store (Postgres, or any store of the contract: cairn.testing.MemoryStore in a test) and
send one message naming the run. Celery is imported on the first enqueue.

One implementation: AsyncClient is Client's face for asyncio. Each of its methods runs
Client's in a worker thread (asyncio.to_thread, as DBOS's enqueue_async does), made from
Client's own (`_threaded`), so the two cannot drift; only wait (LISTEN/NOTIFY on an async
connection) and events (asyncio Redis reads) are asyncio's own, as they hold no thread
while they wait. tests/test_client_parity.py checks the two faces method by method.
"""

from __future__ import annotations

import asyncio
import builtins  # `list` in a Client's annotations is its method
import dataclasses
import datetime as dt
import functools
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, Concatenate, NoReturn, ParamSpec, Self, TypeVar

from cairn.core import tracing
from cairn.core.errors import CairnError, InvalidInput, StoreUnavailable, UnknownRun
from cairn.core.inputs import check_event, check_flow, check_input, check_run_id
from cairn.core.records import CallRecord, Run, RunFilter, StepRecord
from cairn.core.settings import Settings
from cairn.core.status import CANCEL_REASON, STOPPED, RunStatus
from cairn.steps import registry
from cairn.store.checkpoints import PgStore
from cairn.store.db import Database
from cairn.store.schedules import Schedule
from cairn.workers import broker, health
from cairn.workers import schedules as sched

if TYPE_CHECKING:
    from celery import Celery

    from cairn.client.events import AsyncEventLog
    from cairn.core.events import Event
    from cairn.core.records import StreamInfo
    from cairn.store.contract import AdminStore, CheckpointStore
    from cairn.store.events import AsyncRedisEvents, RedisEvents
    from cairn.workers.outbox import EventLog

P = ParamSpec("P")
R = TypeVar("R")

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
            )
            store = PgStore(self._db)
        self.store: CheckpointStore = store
        # Celery's producer only for runs a fleet reads from Postgres; any other store
        # has no broker unless given one.
        self._sender = _Sender(s) if send is None and isinstance(store, PgStore) else None
        self._send = send or (self._sender.send if self._sender else _no_broker)
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
        """
        run_id, data = _checked(self.settings, workflow, input, run_id)
        key, limit, prio = _flow(workflow, concurrency_key, concurrency_limit, priority)
        with tracing.enqueuing(workflow, run_id, concurrency_key=key, priority=prio) as trace:
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
        at, patch = _checked_fork(self.settings, at_seq, input_patch)
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
        at, _ = _checked_fork(self.settings, to_seq, None)
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
        statuses, since, until, limit = _checked_replay(status, since, until, limit)
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
        signal_id = _checked_signal(self.settings, event, payload, signal_id)
        with tracing.spanning("cairn.signal", run_id=run_id, event=event) as trace:
            found = self.store.signal(run_id, event, payload, signal_id, trace)
        if found is None:
            raise UnknownRun(f"no run {run_id!r}")
        status, stored = found
        if stored and status not in STOPPED:
            self.send(run_id)  # a waiting run wakes; a busy one finds it at its wait
        return stored

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
        signal: woken by Postgres LISTEN/NOTIFY, not by polling. Raises UnknownRun, or
        cairn.WaitTimedOut (a TimeoutError) after timeout seconds (None: no limit)."""
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
        wanted = _checked_schedule(self.settings, name, workflow, input, cron, every, catch_up)
        store = self.store.schedule_store()
        stored = store.add(wanted, replace=replace)
        return sched.added(wanted, stored, None if stored else store.get(name))

    def schedules(self) -> builtins.list[Schedule]:
        """Every schedule, by name."""
        return self.store.schedule_store().list_schedules()

    def pause_schedule(self, name: str) -> Schedule:
        """Stop firing the schedule until resumed. Raises UnknownSchedule."""
        return _known(name, self.store.schedule_store().pause(name))

    def resume_schedule(self, name: str) -> Schedule:
        """Fire the schedule again from its next tick after now (ticks while it was
        paused are not fired). Resuming an active schedule changes nothing. Raises
        UnknownSchedule."""
        store = self.store.schedule_store()
        current = _known(name, store.get(name))
        resumed = store.resume(current, sched.timing(current).after(_now()))
        return resumed or _known(name, store.get(name))

    def remove_schedule(self, name: str) -> bool:
        """Delete the schedule (its runs stay); False if there was none."""
        return self.store.schedule_store().remove(name)


def _threaded(
    method: Callable[Concatenate[Client, P], R],
) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, R]]:
    """AsyncClient's face of a Client method: its parameters, docstring and behaviour,
    the call made in a worker thread so the event loop never blocks on the store or the
    broker (contextvars go along: a caller's trace context reaches the enqueue's span)."""

    async def threaded(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(method, self.sync, *args, **kwargs)

    # inspect.signature follows __wrapped__: the parameters are Client's, written once.
    functools.update_wrapper(threaded, method, assigned=("__module__", "__name__", "__doc__"))
    threaded.__qualname__ = f"AsyncClient.{method.__name__}"
    return threaded


class AsyncClient:
    """Client for asyncio apps (FastAPI, aiohttp): every method of Client, awaited, with
    the same parameters, over a Client of its own (`sync`). A call runs in a worker thread,
    so the event loop never blocks on Postgres or the broker; wait listens for its run's
    notification on an async connection and events reads Redis with asyncio, holding no
    thread while they wait.

        async with cairn.AsyncClient() as client:
            run_id = await client.enqueue("invoice", {"customer": "acme", "email": "a@acme.test"})
            run = await client.wait(run_id, timeout=30)

    Its arguments are Client's (store=, send=, events= too); pool_size is the Client's
    pool, shared by the calls in flight.
    """

    def __init__(
        self,
        database_url: str | None = None,
        broker_url: str | None = None,
        *,
        settings: Settings | None = None,
        pool_size: int = 10,
        store: CheckpointStore | None = None,
        send: Callable[[str, int], None] | None = None,
        events: EventLog | None = None,
    ) -> None:
        self.sync = Client(
            database_url,
            broker_url,
            settings=settings,
            pool_size=pool_size,
            store=store,
            send=send,
            events=events,
        )
        self.settings, self.store = self.sync.settings, self.sync.store
        self._event_log: AsyncEventLog | None = None
        self._redis_log: AsyncRedisEvents | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Client.close, and the asyncio Redis reader's connections."""
        await asyncio.to_thread(self.sync.close)
        if self._redis_log is not None:
            await self._redis_log.close()

    enqueue = _threaded(Client.enqueue)
    send = _threaded(Client.send)
    get = _threaded(Client.get)
    list = _threaded(Client.list)
    counts = _threaded(Client.counts)
    cancel = _threaded(Client.cancel)
    children = _threaded(Client.children)
    fork = _threaded(Client.fork)
    rewind = _threaded(Client.rewind)
    forks = _threaded(Client.forks)
    replay = _threaded(Client.replay)
    signal = _threaded(Client.signal)
    resolve = _threaded(Client.resolve)
    history = _threaded(Client.history)
    calls = _threaded(Client.calls)
    events_token = _threaded(Client.events_token)
    problems = _threaded(Client.problems)
    add_schedule = _threaded(Client.add_schedule)
    schedules = _threaded(Client.schedules)
    pause_schedule = _threaded(Client.pause_schedule)
    resume_schedule = _threaded(Client.resume_schedule)
    remove_schedule = _threaded(Client.remove_schedule)

    async def wait(self, run_id: str, timeout: float | None = 60.0) -> Run:
        """Client.wait for asyncio: the run once stopped or waiting for a signal, woken by
        LISTEN/NOTIFY on an async connection (no thread held while it waits). Raises
        UnknownRun, or cairn.WaitTimedOut after timeout seconds (None: no limit)."""
        return await self.store.wait_async(run_id, timeout)

    async def events(
        self, run_id: str, after: str | None = None, *, timeout: float | None = None
    ) -> AsyncIterator[Event]:
        """Client.events for asyncio: `async for event in client.events(run_id)`, read
        from Redis with asyncio; timeout: stop after that many seconds even if the run
        goes on."""
        from cairn.client.events import afollow

        until = None if timeout is None else time.monotonic() + timeout
        async for event in afollow(
            _Durable(self.store), self._events(), run_id, after, until=until
        ):
            if event.kind != "keepalive":
                yield event

    def _events(self) -> AsyncEventLog:
        if self._event_log is None:
            given = self.sync._event_log
            if given is not None:
                self._event_log = _InThreads(given)
            else:
                from cairn.store.events import AsyncRedisEvents

                self._event_log = self._redis_log = AsyncRedisEvents(self.settings.redis_url)
        return self._event_log


class _Durable:
    """The store's record of a run, read from asyncio (a reader after a gap): each read
    in a worker thread."""

    def __init__(self, store: AdminStore) -> None:
        self.store = store

    async def get(self, run_id: str) -> Run | None:
        return await asyncio.to_thread(self.store.get, run_id)

    async def history(self, run_id: str) -> builtins.list[dict[str, Any]]:
        return await asyncio.to_thread(self.store.history, run_id)

    async def calls(self, run_id: str, limit: int = 500) -> builtins.list[dict[str, Any]]:
        return await asyncio.to_thread(self.store.calls, run_id, limit)


class _InThreads:
    """An event log given to the Client (a LocalWorker's MemoryEvents), read from asyncio:
    each read in a worker thread."""

    def __init__(self, log: EventLog) -> None:
        self.log = log

    async def read_many(
        self, after: dict[str, str], count: int = 500, block: float | None = None
    ) -> dict[str, builtins.list[tuple[str, str]]]:
        return {
            run_id: await asyncio.to_thread(self.log.read, run_id, at, count, block)
            for run_id, at in after.items()
        }

    async def info(self, run_id: str) -> StreamInfo | None:
        return await asyncio.to_thread(self.log.info, run_id)


def _no_broker(run_id: str, priority: int = 0) -> NoReturn:
    raise CairnError(
        f"run {run_id} is recorded but this Client has no broker to send it to: its store "
        "is not a PgStore; pass send= (in a test, cairn.testing.LocalWorker's send)"
    )


class _Sender:
    """The broker's producer, made on the first send (Celery imports then)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._producer: Celery | None = None
        # AsyncClient sends from several threads at once: celery's lazy module does not
        # survive being imported by two of them together ("cannot import name 'Celery'").
        self._lock = threading.Lock()

    @property
    def producer(self) -> Celery:
        """Celery's app, made on first use (the Client never hands it out)."""
        with self._lock:
            if self._producer is None:
                from celery import Celery

                app = Celery("cairn-client")
                app.conf.update(broker.conf(self.settings))
                self._producer = app
            return self._producer

    def send(self, run_id: str, priority: int = 0) -> None:
        try:
            self.producer.send_task(
                broker.RUN_TASK, args=[run_id], queue=broker.queue_for(priority)
            )
        except Exception as exc:
            from kombu.exceptions import OperationalError

            if not isinstance(exc, OperationalError):
                raise
            raise StoreUnavailable(
                f"run {run_id} is recorded but the broker is unreachable ({exc}); enqueue "
                "the same run id again once it is back, or the reaper will after "
                "CAIRN_PENDING_AFTER"
            ) from exc

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()


def _checked(
    settings: Settings, workflow: str, input: dict[str, Any] | None, run_id: str | None
) -> tuple[str, dict[str, Any]]:
    """The run id (a new one if None) and the input, checked before anything is written."""
    data = check_input({} if input is None else input, settings.max_input_bytes)
    run_id = uuid.uuid4().hex if run_id is None else check_run_id(run_id)
    if not isinstance(workflow, str) or not workflow:
        raise InvalidInput("workflow must be a workflow's name")
    flow = registry.find(workflow)
    if flow is not None:
        data = flow.validate(data)
    return run_id, data


def _flow(workflow: str, key: Any, limit: Any, priority: Any) -> tuple[str | None, int, int]:
    """Enqueue's flow options checked, the workflow's defaults filling what is None."""
    flow = registry.find(workflow)
    return check_flow(
        key,
        limit if limit is not None else flow.concurrency_limit if flow else 1,
        priority if priority is not None else flow.priority if flow else 0,
    )


def _checked_fork(
    settings: Settings, at: Any, patch: dict[str, Any] | None
) -> tuple[int, dict[str, Any]]:
    if isinstance(at, bool) or not isinstance(at, int) or at < 1:
        raise InvalidInput(f"the seq to fork or rewind at must be a whole number >= 1, not {at!r}")
    return at, check_input({} if patch is None else patch, settings.max_input_bytes)


def _checked_replay(
    status: RunStatus | str | tuple[RunStatus | str, ...],
    since: dt.datetime,
    until: dt.datetime | None,
    limit: int | None,
) -> tuple[tuple[RunStatus, ...], dt.datetime, dt.datetime | None, int]:
    try:
        statuses = tuple(RunStatus(s) for s in ((status,) if isinstance(status, str) else status))
    except ValueError as exc:
        raise InvalidInput(f"replay: {exc}") from None
    for name, when in (("since", since), ("until", until)):
        if when is not None and (not isinstance(when, dt.datetime) or when.tzinfo is None):
            raise InvalidInput(f"replay: {name} must be a datetime with a time zone, not {when!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidInput(f"replay: limit must be a whole number >= 1, not {limit!r}")
    return statuses, since, until, limit if limit is not None else 2**62


def _checked_signal(settings: Settings, event: str, payload: Any, signal_id: str | None) -> str:
    check_event(event)
    check_input({"payload": payload}, settings.max_input_bytes)
    if signal_id is not None:
        check_run_id(signal_id)  # same rules: it travels as a key and a header too
    return signal_id or uuid.uuid4().hex


def _checked_schedule(
    settings: Settings,
    name: str,
    workflow: str,
    input: dict[str, Any] | None,
    cron: str | None,
    every: int | None,
    catch_up: str,
) -> Schedule:
    return sched.checked(
        name,
        workflow,
        input,
        cron=cron,
        every=every,
        catch_up=catch_up,
        max_input_bytes=settings.max_input_bytes,
        now=_now(),
    )


def _known(name: str, schedule: Schedule | None) -> Schedule:
    if schedule is None:
        raise sched.UnknownSchedule(f"no schedule {name!r}")
    return schedule


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
