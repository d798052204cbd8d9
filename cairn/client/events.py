"""Reading run events (Client.events, AsyncClient.events, GET /runs/{id}/events): the
stream from a position, live, until the run ends. Where the stream cannot give what was
asked (trimmed past a slow reader, expired, lost with Redis), the reader gets a `gap`
event and then the run's durable record, rebuilt from Postgres (its journaled model
messages and calls, its steps, how it ended), and goes on live from the stream's end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from cairn.core.errors import StoreUnavailable, UnknownRun
from cairn.core.events import BEFORE_ALL, Event, entry_key, message_data
from cairn.core.records import StreamInfo
from cairn.core.status import STOPPED, RunStatus
from cairn.workers.outbox import EventLog

if TYPE_CHECKING:
    from cairn.core.records import Run


def read_token(api_token: str, run_id: str) -> str:
    """A token that reads one run's events and nothing else (GET /runs/{id}/events?token=):
    for a browser that shows one run (an EventSource sends no headers), handed out by the
    app that owns the run. Derived from the API token: every server agrees, none stores it."""
    key = api_token.encode()
    return hmac.new(key, b"cairn run events " + run_id.encode(), hashlib.sha256).hexdigest()


# -- reading ------------------------------------------------------------------------------

# An event the stream did not give has an id of its own after the stream position it
# stands at: "<position>~<k>" is the k-th event told from Postgres there (the `gap` is 0,
# the durable record's events 1, 2, ...), "<position>~end" the run's end told from
# Postgres. Given back as `after` (or Last-Event-ID), it resumes there: the record from
# its k-th event, or nothing more after the end.
_TOLD = "~"
_END = "end"
EVENT_ID = re.compile(r"0|\d{1,20}-\d{1,20}(?:~(?:\d{1,9}|end))?")


def position(after: str | None) -> tuple[str | None, int | str | None]:
    """An event id given back as `after`: (the stream position, None or how many events
    were told from Postgres there, or "end"). None, "0" and "0-0" are the run's start."""
    if after is None or after in ("0", BEFORE_ALL):
        return None, None
    pos, _, told = after.partition(_TOLD)
    if not told:
        return pos, None
    return (None if pos == BEFORE_ALL else pos), (told if told == _END else int(told))


def ended(run: Run, at: str = BEFORE_ALL) -> Event:
    """How the run ended, told from Postgres at stream position `at`."""
    return Event(
        f"{at}{_TOLD}{_END}",
        "run_ended",
        {"status": str(run.status), "error": run.error, "cost_usd": run.cost_usd},
        run.cursor,
        durable=True,
    )


def durable(
    run: Run, history: list[dict[str, Any]], calls: list[dict[str, Any]], anchor: str
) -> list[Event]:
    """The run's durable record as events told at stream position anchor, ids
    "<anchor>~1", "~2"...: journaled model messages and calls, step outcomes, and how it
    ended."""
    timed: list[tuple[float, int, Event]] = []
    for c in calls:
        at = c["created_at"].timestamp()
        where = {"cursor": c["cursor"], "visit": c["visit"], "durable": True}
        if c["name"] == "model" and c.get("result") is not None:
            data = {"call": c["pos"], **message_data(c["result"]), "cost_usd": c["cost_usd"]}
            timed.append((at, 0, Event(anchor, "message", data, ts=at, **where)))
        else:
            data = {"call": c["pos"], "name": c["name"], "result": c.get("result")}
            if c.get("error") is not None:
                data["error"] = c["error"].get("message")
            timed.append((at, 0, Event(anchor, "call", data, ts=at, **where)))
    for h in history:
        at = h["ended_at"].timestamp()
        kind = "step_saved" if h["outcome"] == "saved" else "retry"
        if h["outcome"] not in ("saved", "retry"):
            continue  # how the run stopped: run_ended says it
        data = {"error": h.get("error")} if kind == "retry" else {}
        timed.append(
            (
                at,
                1,
                Event(
                    anchor,
                    kind,
                    data,
                    h["cursor"],
                    h["visit"],
                    h["epoch"],
                    h["seq"],
                    at,
                    durable=True,
                ),
            )
        )
    timed.sort(key=lambda t: (t[0], t[1]))
    out = [e for _, _, e in timed]
    if run.status in STOPPED:
        out.append(ended(run))
    elif run.status == RunStatus.WAITING:
        out.append(Event(anchor, "wait", {}, run.cursor, durable=True))
    return [dataclasses.replace(e, id=f"{anchor}{_TOLD}{i}") for i, e in enumerate(out, 1)]


def gap(
    info: StreamInfo | None, after: str | None, run: Run, history: list[dict[str, Any]]
) -> str | None:
    """Why the stream cannot give every event after the stream position `after` (None:
    from the run's first), or None when it can. Decided from the stream's own facts (its
    first entry, its ids, what was trimmed), never by comparing clocks. history: the
    run's step history, looked at only when there is no stream."""
    if info is None:
        # No stream: nothing emitted yet, or it expired or was lost with Redis's data.
        if after is None and not history and run.status not in STOPPED:
            return None
        return "the run's live events are gone (expired, or lost with Redis's data)"
    behind = after is None or entry_key(after) < entry_key(info.first)
    if behind and info.trimmed:
        return "the oldest live events were trimmed (CAIRN_EVENTS_MAXLEN) before they were read"
    if after is None and not info.origin:
        # Its first entry is not the run's first event: the stream was started again
        # (Redis lost its data, or it expired), or its first events were dropped.
        return "the live stream does not start at the run's beginning (Redis lost its data)"
    if behind and after is not None:
        return "the live stream was started again (Redis lost its data)"
    return None


@dataclasses.dataclass(frozen=True)
class Opening:
    """Where a reader starts (opening()): the stream position to read on from; and before
    that, a `gap` (why: its reason) and the durable record from its skip-th event, when
    skip is not None; over: the reader has seen the run's end."""

    pos: str | None
    why: str | None = None
    skip: int | None = None
    over: bool = False

    def told(
        self, run: Run, history: list[dict[str, Any]], calls: list[dict[str, Any]]
    ) -> tuple[list[Event], bool]:
        """The events told from Postgres before the stream (history, calls: the run's),
        and whether the reader then has the run's end (the record ends with it)."""
        anchor = self.pos or BEFORE_ALL
        first = [Event(f"{anchor}{_TOLD}0", "gap", {"reason": self.why})] if self.why else []
        record = durable(run, history, calls, anchor)
        return first + record[self.skip or 0 :], _ends(record)


def opening(
    run: Run,
    info: StreamInfo | None,
    after: str | None,
    history: list[dict[str, Any]] | None,
) -> Opening:
    """Where a reader that saw the event id `after` starts. history: the run's step
    history, needed only when there is no stream (info None)."""
    pos, told = position(after)
    if told == _END:
        return Opening(pos, over=True)
    if told is not None:
        # In the middle of a record told at pos: go on with it, if the stream still serves
        # what comes after pos (no stream: nothing came since).
        why = gap(info, pos, run, []) if info is not None and pos is not None else None
        if why is None:
            return Opening(pos, skip=int(told))
    else:
        why = gap(info, pos, run, history or [])
        if why is None:
            return Opening(pos)
    return Opening(info.last if info else (pos or BEFORE_ALL), why, 0)


def _ends(events: list[Event]) -> bool:
    return bool(events) and events[-1].kind == "run_ended"


class RunSource(Protocol):
    """The run's durable side, read when a stream cannot serve a reader."""

    def get(self, run_id: str) -> Run | None: ...

    def history(self, run_id: str) -> list[dict[str, Any]]: ...

    def calls(self, run_id: str, limit: int = ...) -> list[dict[str, Any]]: ...


def follow(
    runs: RunSource,
    log: EventLog,
    run_id: str,
    after: str | None = None,
    *,
    idle: float = 5.0,
    until: float | None = None,
) -> Iterator[Event]:
    """The run's events after `after`, live, until it ends (run_ended is the last one).
    idle: how long one blocking read waits before the run's status is looked at again;
    until: a time.monotonic() deadline after which the iterator ends (None: none)."""
    run = runs.get(run_id)
    if run is None:
        raise UnknownRun(f"no run {run_id!r}")
    info = log.info(run_id)
    start = opening(run, info, after, runs.history(run_id) if info is None else None)
    if start.over:
        return
    if start.skip is not None:
        told, over = start.told(run, runs.history(run_id), runs.calls(run_id))
        yield from told
        if over:
            return
    pos = start.pos
    while until is None or time.monotonic() < until:
        block = idle if until is None else max(0.001, min(idle, until - time.monotonic()))
        entries = log.read(run_id, pos or BEFORE_ALL, block=block)
        for entry_id, blob in entries:
            e = Event.parse(entry_id, blob)
            yield e
            if e.kind == "run_ended":
                return
            pos = entry_id
        if not entries:
            run = runs.get(run_id)
            if run is not None and run.status in STOPPED:
                # Its run_ended never reached the stream (lost, or written before Redis
                # came back): say how it ended from Postgres.
                yield ended(run, pos or BEFORE_ALL)
                return


class AsyncRunSource(Protocol):
    def get(self, run_id: str) -> Awaitable[Run | None]: ...

    def history(self, run_id: str) -> Awaitable[list[dict[str, Any]]]: ...

    def calls(self, run_id: str, limit: int = ...) -> Awaitable[list[dict[str, Any]]]: ...


class AsyncEventLog(Protocol):
    async def read_many(
        self, after: dict[str, str], count: int = ..., block: float | None = None
    ) -> dict[str, list[tuple[str, str]]]: ...

    async def info(self, run_id: str) -> StreamInfo | None: ...


class Live(Protocol):
    """A reader's wait for a run's entries after a position (see Hub.subscribe)."""

    async def wait(self, position: str, block: float) -> list[tuple[str, str]]: ...

    def close(self) -> None: ...


class _Own:
    """A reader's own blocking read (AsyncClient.events): one XREAD at a time."""

    def __init__(self, log: AsyncEventLog, run_id: str) -> None:
        self.log, self.run_id = log, run_id

    async def wait(self, position: str, block: float) -> list[tuple[str, str]]:
        got = await self.log.read_many({self.run_id: position}, block=block)
        return got.get(self.run_id, [])

    def close(self) -> None:
        pass


# A live stream rides out a Redis blip: this many waits a second apart, then it ends (an
# SSE client then reconnects with its Last-Event-ID).
_OUTAGE_TRIES = 10


async def afollow(
    runs: AsyncRunSource,
    log: AsyncEventLog,
    run_id: str,
    after: str | None = None,
    *,
    idle: float = 5.0,
    live: Callable[[str, str], Live] | None = None,
    until: float | None = None,
) -> AsyncIterator[Event]:
    """follow() for asyncio. live(run_id, position) subscribes to the run's entries (the
    web server's Hub shares one XREAD among all its readers); by default each reader
    blocks on its own read. Yields Event(kind="keepalive") after idle seconds without
    any, so a server can write its keep-alive. until: a time.monotonic() deadline after
    which the iterator ends (None: none)."""
    batches = afollow_batches(runs, log, run_id, after, idle=idle, live=live, until=until)
    async for batch in batches:
        for event in batch:
            yield event


async def afollow_batches(
    runs: AsyncRunSource,
    log: AsyncEventLog,
    run_id: str,
    after: str | None = None,
    *,
    idle: float = 5.0,
    live: Callable[[str, str], Live] | None = None,
    parse: bool = True,
    until: float | None = None,
) -> AsyncGenerator[list[Event], None]:
    """afollow() a read at a time: a server writes each list in one go. parse=False:
    events read from the stream carry their kind and raw JSON only (data None), for a
    server that passes them on as they are. until: as afollow's."""
    run = await runs.get(run_id)
    if run is None:
        raise UnknownRun(f"no run {run_id!r}")
    info = await log.info(run_id)
    start = opening(run, info, after, await runs.history(run_id) if info is None else None)
    if start.over:
        return
    if start.skip is not None:
        told, over = start.told(run, await runs.history(run_id), await runs.calls(run_id))
        if told:
            yield told
        if over:
            return
    pos = start.pos
    sub = live(run_id, pos or BEFORE_ALL) if live is not None else _Own(log, run_id)
    read = Event.parse if parse else Event.unparsed
    failed = 0
    try:
        while until is None or time.monotonic() < until:
            block = idle if until is None else max(0.001, min(idle, until - time.monotonic()))
            try:
                entries = await sub.wait(pos or BEFORE_ALL, block)
                failed = 0
            except StoreUnavailable:
                failed += 1
                if failed >= _OUTAGE_TRIES:
                    raise
                yield [Event(pos or BEFORE_ALL, "keepalive")]
                await asyncio.sleep(1.0)
                continue
            if entries:
                batch = []
                for entry_id, blob in entries:
                    batch.append(e := read(entry_id, blob))
                    if e.kind == "run_ended":
                        yield batch
                        return
                pos = entries[-1][0]
                yield batch
                continue
            run = await runs.get(run_id)
            if run is not None and run.status in STOPPED:
                yield [ended(run, pos or BEFORE_ALL)]
                return
            yield [Event(pos or BEFORE_ALL, "keepalive")]
    finally:
        sub.close()
