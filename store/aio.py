"""The store for asyncio apps (AsyncClient): psycopg's async pool and the same named
queries as PgStore, for what an enqueuer reads and writes. Workers stay synchronous."""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

from cairn.core.errors import StoreUnavailable
from cairn.core.records import START, Run
from cairn.core.status import RunStatus
from cairn.store.checkpoints import (
    conflict,
    create_params,
    fork_params,
    forked,
    list_query,
    replay_params,
    rewound,
    settled,
)
from cairn.store.db import channel, translated
from cairn.store.sql import QUERIES

T = TypeVar("T")


class AsyncDatabase:
    """An async pool plus named-query helpers, retried like Database (bounded)."""

    def __init__(
        self, url: str, *, max_size: int = 4, give_up_after: float = 30.0, prepare: bool = True
    ) -> None:
        self.url, self.give_up_after, self.prepare = url, give_up_after, prepare
        options: dict[str, Any] = {"autocommit": True, "row_factory": dict_row}
        if not prepare:
            options["prepare_threshold"] = None
        # Any: its rows are dict_row's, which the class's default type does not say
        self.pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]]
        self.pool = psycopg_pool.AsyncConnectionPool(
            url,
            min_size=1,
            max_size=max_size,
            kwargs={**options, "connect_timeout": 5},
            open=False,
            timeout=max(1.0, min(10.0, give_up_after) - 2.0),
        )
        self._opened = False

    async def open(self) -> AsyncDatabase:
        if not self._opened:
            with translated():
                await self.pool.open(wait=False)
            self._opened = True
        return self

    async def close(self) -> None:
        await self.pool.close()
        self._opened = False

    async def retry(self, fn: Callable[[], Awaitable[T]]) -> T:
        started = time.monotonic()
        try:
            return await fn()
        except StoreUnavailable:
            left = self.give_up_after - (time.monotonic() - started)
            if left <= 0:
                raise
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(StoreUnavailable),
                wait=wait_random_exponential(multiplier=0.2, max=3.0),
                stop=stop_after_delay(left),
                reraise=True,
            ):
                with attempt:
                    return await fn()
            raise AssertionError("unreachable: reraise=True")  # pragma: no cover

    async def _run(self, name: str, params: dict[str, Any] | None, many: bool) -> Any:
        await self.open()

        async def attempt() -> Any:
            with translated(self.url):
                async with self.pool.connection() as conn:
                    cur = await conn.execute(QUERIES[name], params or {})
                    return await (cur.fetchall() if many else cur.fetchone())

        return await self.retry(attempt)

    async def one(self, name: str, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        return await self._run(name, params, many=False)  # type: ignore[no-any-return]

    async def all(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return await self._run(name, params, many=True)  # type: ignore[no-any-return]

    async def each(
        self, names: Sequence[str], params: dict[str, Any]
    ) -> list[dict[str, Any] | None]:
        """Database.each: the named queries in one transaction, each one's first row."""
        await self.open()

        async def attempt() -> list[dict[str, Any] | None]:
            with translated(self.url):
                async with self.pool.connection() as conn, conn.transaction():
                    return [
                        await (await conn.execute(QUERIES[name], params)).fetchone()
                        for name in names
                    ]

        return await self.retry(attempt)

    @contextlib.asynccontextmanager
    async def listening(self, name: str) -> AsyncIterator[Callable[[float], Awaitable[bool]]]:
        """Database.listening for asyncio: LISTEN on its own connection; heard(seconds)."""
        options: dict[str, Any] = {"autocommit": True, "connect_timeout": 5}
        if not self.prepare:
            options["prepare_threshold"] = None
        with translated(self.url):
            conn = await psycopg.AsyncConnection.connect(self.url, **options)
        try:
            with translated(self.url):
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(name)))

            async def heard(seconds: float) -> bool:
                with translated(self.url):
                    async for _ in conn.notifies(timeout=seconds, stop_after=1):
                        return True
                return False

            yield heard
        finally:
            await conn.close()


class AsyncPgStore:
    """The runs as an enqueuer sees them: PgStore's client half, awaited."""

    def __init__(self, db: AsyncDatabase) -> None:
        self.db = db

    async def create_run(
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
    ) -> bool:
        """PgStore.create_run: insert at seq 0 (admitted or queued with a concurrency
        key); False if it existed (a failed one re-armed)."""
        params = create_params(
            run_id, workflow, input, cursor, max_cost_usd, priority, concurrency_key,
            concurrency_limit, traceparent,
        )  # fmt: skip
        if concurrency_key is None:
            created = await self.db.one("create_run", params) is not None
        else:
            created = (await self.db.each(("create_keyed_run", "admit"), params))[0] is not None
        if created:
            return True
        row = await self.db.one("existing_run", params)
        if row is None:  # swept between the two statements: create it afresh
            return await self.create_run(
                run_id, workflow, input, cursor, max_cost_usd, priority=priority,
                concurrency_key=concurrency_key, concurrency_limit=concurrency_limit,
                traceparent=traceparent,
            )  # fmt: skip
        conflict(run_id, row)
        await self.db.one("rearm_failed", {"run_id": run_id})
        return False

    async def fork(
        self,
        origin: str,
        at: int,
        run_id: str,
        patch: dict[str, Any] | None = None,
        traceparent: str | None = None,
    ) -> bool:
        """PgStore.fork, awaited."""
        row = await self.db.one("fork", fork_params(origin, at, run_id, patch, traceparent))
        return forked(row, origin, at)

    async def rewind(self, run_id: str, at: int) -> int:
        """PgStore.rewind, awaited."""
        return rewound(await self.db.one("rewind", {"origin": run_id, "at": at}), run_id, at)

    async def clock(self) -> dt.datetime:
        """PgStore.clock: the database's time now."""
        row = await self.db.one("clock")
        assert row is not None
        now: dt.datetime = row["now"]
        return now

    async def replay(
        self,
        workflow: str,
        statuses: tuple[RunStatus, ...],
        since: dt.datetime,
        until: dt.datetime,
        limit: int,
        *,
        dry_run: bool = False,
    ) -> list[Run]:
        """PgStore.replay, awaited."""
        params = replay_params(workflow, statuses, since, until, limit)
        rows = await self.db.all("replayable" if dry_run else "replay", params)
        return [Run.from_row(r) for r in rows]

    async def forks(self, run_id: str) -> list[Run]:
        return [Run.from_row(r) for r in await self.db.all("forks", {"run_id": run_id})]

    async def admitted(self, workflow: str, key: str) -> list[tuple[str, int]]:
        """PgStore.admitted: the key's admitted runs not sent yet, marked sent."""
        rows = await self.db.all("admitted", {"workflow": workflow, "key": key})
        return [(r["run_id"], r["priority"]) for r in rows]

    async def get(self, run_id: str) -> Run | None:
        row = await self.db.one("get_run", {"run_id": run_id})
        return Run.from_row(row) if row else None

    async def children(self, run_id: str, seq: int | None = None, limit: int = 10_000) -> list[Run]:
        rows = await self.db.all("children", {"run_id": run_id, "seq": seq, "limit": limit})
        return [Run.from_row(r) for r in rows]

    async def gathered(self, run_id: str) -> bool:
        row = await self.db.one("gathered", {"run_id": run_id})
        return bool(row and row["ready"])

    async def load_row(self, run_id: str) -> dict[str, Any] | None:
        return await self.db.one("load", {"run_id": run_id})

    async def list_runs(
        self,
        status: RunStatus | None = None,
        limit: int = 50,
        *,
        workflow: str | None = None,
        after: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
    ) -> list[Run]:
        query, params = list_query(status, limit, workflow, after, since, until)
        return [Run.from_row(r) for r in await self.db.all(query, params)]

    async def counts(self) -> dict[str, dict[str, Any]]:
        return {row["status"]: row for row in await self.db.all("count_by_status")}

    async def cancel(self, run_id: str, reason: str) -> RunStatus | None:
        row = await self.db.one("cancel", {"run_id": run_id, "reason": reason})
        return RunStatus(row["status"]) if row else None

    async def signal(
        self, run_id: str, event: str, payload: Any, signal_id: str, traceparent: str | None = None
    ) -> tuple[RunStatus, bool] | None:
        row = await self.db.one(
            "signal",
            {
                "run_id": run_id,
                "event": event,
                "payload": Jsonb(payload),
                "signal_id": signal_id,
                "traceparent": traceparent,
            },
        )
        return (RunStatus(row["status"]), row["stored"]) if row else None

    async def resolve(self, run_id: str, done: bool, result: Any = None) -> tuple[bool, list[str]]:
        """PgStore.resolve, awaited."""
        row = await self.db.one(
            "resolve_intents", {"run_id": run_id, "done": done, "result": Jsonb(result)}
        )
        assert row is not None
        return bool(row["rearmed"]), list(row["keys"])

    async def history(self, run_id: str) -> list[dict[str, Any]]:
        return await self.db.all("history", {"run_id": run_id})

    async def calls(self, run_id: str, limit: int = 500) -> list[dict[str, Any]]:
        return await self.db.all("calls", {"run_id": run_id, "limit": limit})

    async def wait(self, run_id: str, timeout: float | None = None, poll: float = 2.0) -> Run:
        """PgStore.wait, awaited: the run once settled, woken by its notification."""
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        async with self.db.listening(channel(run_id)) as heard:
            while True:
                run = await self.get(run_id)
                left = settled(run_id, run, timeout, deadline)
                if left is None:
                    return run  # type: ignore[return-value]
                await heard(min(poll, left))
