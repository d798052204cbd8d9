"""AsyncClient: Client's face for asyncio. Each of its methods runs Client's in a worker
thread (asyncio.to_thread, as DBOS's enqueue_async does), made from Client's own
(`_threaded`), so the two cannot drift; only wait (a task awaiting news from the Client's
one listening connection, store/waits.py) and events (asyncio Redis reads) are asyncio's
own, as they hold no thread while they wait, and enqueue on the caller's AsyncConnection,
whose transaction is its event loop's. tests/unit/test_client_parity.py checks the two
faces method by method. A method run in a thread takes Client's tenancy decision there;
AsyncClient's own take theirs from the same table (cairn.client.tenancy.enforced_async).
"""

from __future__ import annotations

import asyncio
import builtins  # `list` in a Client's annotations is its method
import copy
import functools
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Self, TypeVar

from cairn.client.checks import checked, checked_budget, checked_debounce, flow
from cairn.client.client import Client
from cairn.client.tenancy import enforced_async
from cairn.core import tracing
from cairn.core.records import Run
from cairn.core.settings import Settings
from cairn.store.transactional import acreate_run_in, adebounce_in, is_async

if TYPE_CHECKING:
    from cairn.client.events import AsyncEventLog
    from cairn.core.events import Event
    from cairn.core.records import StreamInfo
    from cairn.store.contract import AdminStore, CheckpointStore
    from cairn.store.events import AsyncRedisEvents
    from cairn.workers.outbox import EventLog


P = ParamSpec("P")
R = TypeVar("R")


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
    # Client's method takes its tenancy decision in the thread: enforced_async leaves it.
    threaded.__dict__["client_method"] = method
    return threaded


_enqueue_threaded = _threaded(Client.enqueue)


@enforced_async
class AsyncClient:
    """Client for asyncio apps (FastAPI, aiohttp): every method of Client, awaited, with
    the same parameters, over a Client of its own (`sync`). A call runs in a worker thread,
    so the event loop never blocks on Postgres or the broker; wait awaits its run's
    notification, heard on the Client's one listening connection, and events reads Redis
    with asyncio, holding no thread while they wait.

        async with cairn.AsyncClient() as client:
            run_id = await client.enqueue("invoice", {"customer": "acme", "email": "a@acme.test"})
            run = await client.wait(run_id, timeout=30)

    Its arguments are Client's (store=, send=, events=, tenant= too); pool_size is the
    Client's pool, shared by the calls in flight.
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
        tenant: str | None = None,
    ) -> None:
        self.sync = Client(
            database_url,
            broker_url,
            settings=settings,
            pool_size=pool_size,
            store=store,
            send=send,
            events=events,
            tenant=tenant,
        )
        self.settings, self.store = self.sync.settings, self.sync.store
        self._event_log: AsyncEventLog | None = None
        self._redis_log: AsyncRedisEvents | None = None

    @property
    def tenant(self) -> str | None:
        """The tenant this client acts for (None: every run)."""
        return self.sync.tenant

    def for_tenant(self, tenant: str | None, *, token_id: str | None = None) -> AsyncClient:
        """Client.for_tenant: this client acting for one tenant (None: every tenant), and
        naming token_id in its audit rows, on the same pool, producer and readers (closing
        it closes nothing)."""
        view = copy.copy(self)
        view.sync = self.sync.for_tenant(tenant, token_id=token_id)
        view._redis_log = None  # the origin's to close
        view._event_log = self._events()
        return view

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Client.close, and the asyncio Redis reader's connections."""
        if self.sync._view:
            return
        await asyncio.to_thread(self.sync.close)
        if self._redis_log is not None:
            await self._redis_log.close()

    async def enqueue(
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
        """Client.enqueue for asyncio, in a worker thread; with connection= your psycopg
        AsyncConnection, the run is written in its open transaction by this event loop
        (a sync Connection goes to Client.enqueue in the thread), and sent once it
        commits, as there (docs/guides/enqueue.md)."""
        if not is_async(connection):
            return await _enqueue_threaded(
                self, workflow, input, run_id=run_id, max_cost_usd=max_cost_usd,
                concurrency_key=concurrency_key, concurrency_limit=concurrency_limit,
                priority=priority, connection=connection, debounce_key=debounce_key,
                debounce=debounce, max_wait=max_wait, budget_usd=budget_usd,
                budget_soft=budget_soft, budget_tokens=budget_tokens,
            )  # fmt: skip
        # The checks, the flow defaults and the span are Client's; only the statements are
        # awaited here, on the caller's connection, in the caller's event loop.
        debounced = self.sync._debounced(
            checked_debounce(debounce_key, debounce, max_wait, run_id, concurrency_key)
        )
        checked_budget(budget_usd, budget_tokens, budget_soft, True)
        run_id, data = checked(self.settings, workflow, input, run_id)
        key, limit, prio = self.sync._tenant_key(
            *flow(workflow, concurrency_key, concurrency_limit, priority)
        )
        self.sync._on_postgres()
        with tracing.enqueuing(workflow, run_id, concurrency_key=key, priority=prio) as trace:
            if debounced is not None:
                return await adebounce_in(
                    connection, run_id, workflow, data, *debounced, max_cost_usd=max_cost_usd,
                    priority=prio, traceparent=trace, tenant=self.tenant,
                )  # fmt: skip
            await acreate_run_in(
                connection, run_id, workflow, data, max_cost_usd=max_cost_usd, priority=prio,
                concurrency_key=key, concurrency_limit=limit, traceparent=trace,
                tenant=self.tenant,
            )  # fmt: skip
        return run_id

    send = _threaded(Client.send)
    get = _threaded(Client.get)
    list = _threaded(Client.list)
    counts = _threaded(Client.counts)
    cancel = _threaded(Client.cancel)
    budget = _threaded(Client.budget)
    raise_budget = _threaded(Client.raise_budget)
    set_tenant_budget = _threaded(Client.set_tenant_budget)
    tenant_budget = _threaded(Client.tenant_budget)
    delete_tenant_budget = _threaded(Client.delete_tenant_budget)
    children = _threaded(Client.children)
    fork = _threaded(Client.fork)
    rewind = _threaded(Client.rewind)
    forks = _threaded(Client.forks)
    replay = _threaded(Client.replay)
    signal = _threaded(Client.signal)
    steer = _threaded(Client.steer)
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
    approvals = _threaded(Client.approvals)
    approval = _threaded(Client.approval)
    decide = _threaded(Client.decide)
    add_rule = _threaded(Client.add_rule)
    rules = _threaded(Client.rules)
    remove_rule = _threaded(Client.remove_rule)

    async def wait(self, run_id: str, timeout: float | None = 60.0) -> Run:
        """Client.wait for asyncio: the run once stopped or waiting for a signal, woken by
        LISTEN/NOTIFY on the one connection all the client's waits share (no thread and no
        connection held per wait). Raises UnknownRun, or cairn.WaitTimedOut after timeout
        seconds (None: no limit)."""
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

                self._event_log = self._redis_log = AsyncRedisEvents(self.settings.redis)
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
