"""Run events: what a step and cairn emit while a run goes on, and how readers follow them.

Writing: a step's ctx.emit, its model tokens and the loop's own events go into the
process's Outbox, whose one thread sends them to the run's Redis stream in batches, so a
step never waits on Redis for a token (store/lua/emit.lua fences what is written before
the step commits by the run's lease: a worker that lost the run writes nothing).

Reading (Client.events, GET /runs/{id}/events): the stream from a position, live, until
the run ends. Where the stream cannot give what was asked (trimmed past a slow reader,
expired, lost with Redis), the reader gets a `gap` event and then the run's durable
record, rebuilt from Postgres (its journaled model messages and calls, its steps, how it
ended), and goes on live from the stream's end.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import dataclasses
import hashlib
import hmac
import json
import logging
import os
import re
import threading
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Sequence,
)
from typing import TYPE_CHECKING, Any, Protocol

from cairn import logs
from cairn.errors import EventRefused, LeaseLost, StoreUnavailable, UnknownRun
from cairn.status import STOPPED, RunStatus
from cairn.store.runs import StreamInfo

if TYPE_CHECKING:
    from cairn.store.runs import Run
    from cairn.workers.settings import Settings

logger = logging.getLogger(__name__)

KIND = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
# cairn's own kinds: a step's ctx.emit may not use them.
RESERVED = frozenset(
    {
        "step_started",  # a delivery's first step attempt began (then step_saved's "next")
        "token",  # a text delta of a streamed model call: {call, text}
        "model_restart",  # a streamed call was retried: drop its tokens so far ({call})
        "message",  # a model call's whole answer, once journaled: {call, text, tool_calls}
        "call",  # a journaled ctx.call's outcome: {call, name, result | error}
        "step_saved",  # the attempt's checkpoint committed: its events stand
        "retry",  # the attempt failed and will be retried: drop its events
        "attempt_abandoned",  # an attempt was cut (a killed worker): drop its events
        "wait",  # the run waits for a signal or a timeout, holding no worker
        "resumed",  # the run goes on after a wait, or after a lost worker
        "run_ended",  # the run stopped: {status, error, cost_usd}; the last event
        "dropped",  # events of the run were lost before Redis: {reason, count}
        "gap",  # the stream could not give everything asked for; the durable record follows
    }
)
# Written after a fenced Postgres write succeeded: they need no fence of their own.
_AFTER_COMMIT = frozenset(
    {"message", "call", "step_saved", "retry", "wait", "resumed", "run_ended", "dropped"}
)
# An attempt's last event is one of these when it ended on purpose: after any other, the
# next attempt's worker marks it abandoned.
ENDS_ATTEMPT = frozenset(
    {"step_saved", "retry", "run_ended", "wait", "attempt_abandoned", "resumed", "dropped"}
)
_ANCHOR = "0-0"
_KIND_AT = '{"kind":"'
# One encoder, made once: json.dumps with options builds a new one every call (half the cost).
_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


@dataclasses.dataclass(frozen=True)
class Event:
    """One run event. id: monotonic in the run (the SSE id; pass it back as `after`).
    cursor, visit, attempt: the step attempt that emitted it (attempt is the attempt's
    lease epoch: a later attempt of the same step visit has a larger one). durable:
    rebuilt from Postgres after a gap, not read from the live stream."""

    id: str
    kind: str
    data: Any = None
    cursor: str | None = None
    visit: int | None = None
    attempt: int | None = None
    seq: int | None = None
    ts: float = 0.0
    durable: bool = False
    # The JSON the stream holds, when read from it: a server can pass it on as it is.
    raw: str | None = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def parse(cls, entry_id: str, blob: str) -> Event:
        e = json.loads(blob)
        return cls(
            entry_id,
            e["kind"],
            e.get("data"),
            e.get("cursor"),
            e.get("visit"),
            e.get("attempt"),
            e.get("seq"),
            e.get("ts", 0.0),
            raw=blob,
        )

    @classmethod
    def unparsed(cls, entry_id: str, blob: str) -> Event:
        """Its id, kind and raw JSON only: what a server needs to pass it on."""
        if blob.startswith(_KIND_AT):  # encode() writes the kind first
            end = blob.find('"', len(_KIND_AT))
            return cls(entry_id, blob[len(_KIND_AT) : end], raw=blob)
        return cls.parse(entry_id, blob)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "data": self.data,
            "cursor": self.cursor,
            "visit": self.visit,
            "attempt": self.attempt,
            "seq": self.seq,
            "ts": self.ts,
            "durable": self.durable,
        }

    def json(self) -> str:
        """to_json() as JSON text: from the stream's own when there is one (no re-encode)."""
        if self.raw is not None and self.raw.startswith("{"):
            return f'{{"id":"{self.id}","durable":false,{self.raw[1:]}'
        return _JSON.encode(self.to_json())


def encode(
    kind: str,
    data: Any,
    *,
    cursor: str | None = None,
    visit: int | None = None,
    attempt: int | None = None,
    seq: int | None = None,
    ts: float | None = None,
    origin: bool = False,
) -> str:
    """An event as the stream keeps it, with its emit flag (see emit.lua). origin: the
    first event of a delivery of a run that has saved nothing yet; a stream whose first
    entry is one holds the run from its beginning (store.events.is_origin)."""
    event = {
        "kind": kind,
        "data": data,
        "cursor": cursor,
        "visit": visit,
        "attempt": attempt,
        "seq": seq,
        "ts": time.time() if ts is None else ts,
    }
    if origin:
        event["origin"] = True  # last: is_origin looks at the end of the text
    flag = "s" if kind in _AFTER_COMMIT else "g" if kind in RESERVED and kind != "token" else "f"
    return flag + _JSON.encode(event)


def check(kind: str, data: Any, max_bytes: int) -> str:
    """A ctx.emit's data as JSON, or EventRefused saying why not."""
    if not isinstance(kind, str) or not KIND.fullmatch(kind):
        raise EventRefused(f"event kind {kind!r}: use lower-case letters, digits, _ . - (max 64)")
    if kind in RESERVED:
        raise EventRefused(f"event kind {kind!r} is cairn's own; pick another name")
    try:
        raw = _JSON.encode(data)
    except (TypeError, ValueError) as exc:
        raise EventRefused(f"event {kind!r}: data is not JSON ({exc})") from exc
    if len(raw) > max_bytes:
        raise EventRefused(
            f"event {kind!r} is {len(raw):,} bytes, over CAIRN_MAX_EVENT_BYTES={max_bytes:,}: "
            "emit a smaller event (a reference to the data, not the data)"
        )
    return raw


class EventLog(Protocol):
    """Where run events live: store.events.RedisEvents, or the in-memory twin."""

    def append(
        self,
        batches: Sequence[tuple[str, str, Sequence[str]]],
        *,
        maxlen: int,
        ttl: float,
        cap: int,
    ) -> list[list[Any]]: ...

    def read(
        self, run_id: str, after: str = ..., count: int = ..., block: float | None = None
    ) -> list[tuple[str, str]]: ...

    def info(self, run_id: str) -> StreamInfo | None: ...

    def claim(self, run_id: str, epoch: int, count: int, ttl: float) -> list[tuple[str, str]]: ...

    def before(self, run_id: str, entry_id: str, count: int) -> list[tuple[str, str]]: ...


def read_token(api_token: str, run_id: str) -> str:
    """A token that reads one run's events and nothing else (GET /runs/{id}/events?token=):
    for a browser that shows one run (an EventSource sends no headers), handed out by the
    app that owns the run. Derived from the API token: every server agrees, none stores it."""
    key = api_token.encode()
    return hmac.new(key, b"cairn run events " + run_id.encode(), hashlib.sha256).hexdigest()


def _key(entry_id: str) -> tuple[int, int]:
    ms, _, n = entry_id.partition("-")
    return int(ms), int(n or 0)


# -- writing: the outbox ------------------------------------------------------------------


class _Pending:
    __slots__ = ("done", "event", "run_id", "text", "token", "where")

    def __init__(
        self, run_id: str, token: str, event: str, done: concurrent.futures.Future[str] | None
    ) -> None:
        self.run_id, self.token, self.event, self.done = run_id, token, event, done
        self.text: list[str] | None = None  # a token event's deltas, joined when it is sent
        self.where: tuple[Any, ...] = ()  # ... and its call, cursor, visit, attempt, seq, ts

    def encoded(self) -> str:
        if self.text is not None:
            call, cursor, visit, attempt, seq, ts = self.where
            data = {"call": call, "text": "".join(self.text)}
            self.event = encode(
                "token", data, cursor=cursor, visit=visit, attempt=attempt, seq=seq, ts=ts
            )
            self.text = None
        return self.event


class Outbox:
    """A process's run events on their way to Redis: steps put them, one thread sends them
    in batches (one round trip for whatever queued up meanwhile, across runs), in order.

    Bounded: past `limit` queued events (Redis slow or away) new ones are dropped, and the
    run gets a `dropped` event saying how many once Redis takes writes again. A step never
    waits, except ctx.emit, which waits for its own event's answer (its id, or the cap).
    """

    def __init__(
        self,
        log: EventLog,
        settings: Settings,
        limit: int = 100_000,
        linger: float = 0.005,
        slow: float = 0.02,
    ) -> None:
        # How long an event may wait for company before it is sent: linger for a token
        # (a reader watches it being written), slow for the rest (a step's end, a call's
        # outcome: a reader does not see 20 ms). One Redis call then carries the events
        # of many steps, not one step's; a ctx.emit, or a run's end, is sent at once.
        self.log, self.limit, self.linger, self.slow = log, limit, linger, slow
        self._due = float("inf")  # when the oldest queued event must go
        self.maxlen, self.ttl, self.cap = (
            settings.events_maxlen,
            settings.events_ttl,
            settings.max_events,
        )
        self._queue: collections.deque[_Pending] = collections.deque()
        self._cond = threading.Condition()
        self._lost: dict[str, tuple[str, int]] = {}  # run: (token, events dropped)
        self._over: set[str] = set()  # runs past their cap (their tokens are dropped)
        self._queued: collections.Counter[str] = collections.Counter()  # per run
        self._open: dict[str, _Pending] = {}  # each run's queued token event, still growing
        self._pid = 0
        self._idle = False  # the thread waits for events: the next put wakes it
        self._urgent = 0  # queued events a ctx.emit waits on
        self._settling = 0  # runs waiting for their events to be sent (settle)
        self.sent = 0  # events written (metrics, tests)

    def put(self, run_id: str, token: str, event: str, wait: bool = False) -> str | None:
        """Queue one encoded event; with wait, block until it is written and return its id
        (EventRefused past the cap, LeaseLost if fenced, StoreUnavailable)."""
        done: concurrent.futures.Future[str] | None = concurrent.futures.Future() if wait else None
        with self._cond:
            if len(self._queue) >= self.limit:
                token_, n = self._lost.get(run_id, (token, 0))
                self._lost[run_id] = (token_, n + 1)
                if done is None:
                    return None
                raise StoreUnavailable("the event outbox is full: Redis is slow or away")
            self._queue.append(_Pending(run_id, token, event, done))
            self._open.pop(run_id, None)  # a later delta must not jump over this event
            self._queued[run_id] += 1
            self._start()
            if done is not None:
                self._urgent += 1
            self._soon(self.slow, done is not None)
        return done.result(timeout=60) if done is not None else None

    def put_token(self, run_id: str, token: str, text: str, where: tuple[Any, ...]) -> None:
        """Queue a text delta: where = (call, cursor, visit, attempt, seq). A delta that
        comes while the run's last one is still queued (a burst, or Redis slow) joins it:
        one event, one entry, one write to each reader, for what readers join anyway."""
        with self._cond:
            p = self._open.get(run_id)
            if p is not None and p.token == token and p.where[:5] == where and p.text:
                p.text.append(text)
                return
            if len(self._queue) >= self.limit:
                token_, n = self._lost.get(run_id, (token, 0))
                self._lost[run_id] = (token_, n + 1)
                return
            p = _Pending(run_id, token, "f", None)
            p.text, p.where = [text], (*where, time.time())
            self._queue.append(p)
            self._open[run_id] = p
            self._queued[run_id] += 1
            self._start()
            self._soon(self.linger)

    def _soon(self, within: float, now: bool = False) -> None:
        """What was just queued goes within that many seconds (under the lock): wake the
        thread if it sleeps, or lingers towards a later time."""
        due = time.monotonic() + within
        if due < self._due or now:
            self._due = min(self._due, due)
            if self._idle or now or within < self.slow:
                self._cond.notify()

    def over_cap(self, run_id: str) -> bool:
        return run_id in self._over

    def settle(self, run_id: str, timeout: float = 2.0) -> bool:
        """Wait until the run's events queued so far are sent (before its lease goes, which
        would fence them, and before another worker takes the run, which fences them by
        epoch); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            if not self._queued.get(run_id):
                return True
            self._settling += 1  # the thread sends now instead of lingering
            self._cond.notify_all()
            try:
                while self._queued.get(run_id):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(min(left, 0.05))
            finally:
                self._settling -= 1
        return True

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far is sent; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    _busy = False

    def _start(self) -> None:
        if self._pid != os.getpid():  # first use, or a forked child: the thread did not follow
            self._pid = os.getpid()
            threading.Thread(target=self._run, name="cairn-events", daemon=True).start()
            atexit.register(self.flush, 2.0)  # a process that ends sends what it queued

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._lost:
                    self._busy, self._idle = False, True
                    self._cond.notify_all()
                    self._cond.wait(30.0)
                self._busy, self._idle = True, False
                # Linger for company until the oldest event is due, unless someone waits
                # on what is queued already.
                while not (self._urgent or self._settling or self._lost):
                    now = time.monotonic()
                    left = min(self._due, now + self.slow) - now  # a marker queued unsaid
                    if left <= 0:
                        break
                    self._cond.wait(left)
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), 2000))]
                self._due = time.monotonic() if self._queue else float("inf")
                for p in batch:
                    if p.text is not None and self._open.get(p.run_id) is p:
                        del self._open[p.run_id]  # on its way: the next delta starts anew
                lost, self._lost = self._lost, {}
                # Left behind (a batch holds 2,000 at most): do they include a waiter?
                self._urgent = sum(1 for p in self._queue if p.done is not None)
            try:
                self._send(batch, lost)
            except Exception as exc:  # a dead thread would stop every run's events
                logger.exception(
                    "%d run event(s) lost to a bug", len(batch), extra=logs.run(None, "events_bug")
                )
                for p in batch:
                    if p.done is not None and not p.done.done():
                        p.done.set_exception(exc)

    def _send(self, batch: list[_Pending], lost: dict[str, tuple[str, int]]) -> None:
        try:
            self._write(batch, lost)
        finally:
            with self._cond:
                for p in batch:
                    self._queued[p.run_id] -= 1
                    if self._queued[p.run_id] <= 0:
                        del self._queued[p.run_id]
                self._cond.notify_all()

    def _write(self, batch: list[_Pending], lost: dict[str, tuple[str, int]]) -> None:
        pending = [
            _Pending(r, t, encode("dropped", {"reason": "the outbox was full", "count": n}), None)
            for r, (t, n) in lost.items()
        ]
        groups = _segments(pending + batch)
        try:
            answers = self.log.append(
                [(ps[0].run_id, token, [p.encoded() for p in ps]) for token, ps in groups],
                maxlen=self.maxlen,
                ttl=self.ttl,
                cap=self.cap,
            )
        except Exception as exc:  # noqa: BLE001 (the thread must live on: Redis comes back)
            with self._cond:
                for r, (t, n) in lost.items():  # still owed, with this batch's
                    token, m = self._lost.get(r, (t, 0))
                    self._lost[r] = (token, m + n)
                for p in batch:
                    if p.done is None:
                        token, n = self._lost.get(p.run_id, (p.token, 0))
                        self._lost[p.run_id] = (token, n + 1)
            for p in batch:
                if p.done is not None:
                    p.done.set_exception(exc)
            logger.warning(
                "%d run event(s) not sent: %s",
                len(batch),
                exc,
                extra=logs.run(None, "events_failed"),
            )
            time.sleep(0.5)  # bounded: the next batch tries again, later ones are dropped
            return
        capped: list[tuple[str, str]] = []
        for (token, ps), ids in zip(groups, answers, strict=True):
            run_id = ps[0].run_id
            for p, answer in zip(ps, ids, strict=True):
                if isinstance(answer, str):
                    self.sent += 1
                    if p.done is not None:
                        p.done.set_result(answer)
                elif answer == 0:
                    if p.done is not None:
                        p.done.set_exception(LeaseLost(run_id, "its events are fenced"))
                else:
                    if run_id not in self._over:
                        capped.append((run_id, token))
                    self._over.add(run_id)
                    if p.done is not None:
                        p.done.set_exception(
                            EventRefused(
                                f"run {run_id} passed CAIRN_MAX_EVENTS={self.cap:,} events; "
                                "emit fewer (tokens count too), or raise the cap"
                            )
                        )
        for run_id, token in capped:  # once per run: readers learn why its tokens stop
            marker = encode("dropped", {"reason": f"over CAIRN_MAX_EVENTS={self.cap}"})
            with self._cond:
                self._queue.appendleft(_Pending(run_id, token, marker, None))
                self._queued[run_id] += 1


def _segments(events: list[_Pending]) -> list[tuple[str, list[_Pending]]]:
    """Events as emit.lua calls: per run, in order, a new call wherever the fencing token
    changes (an event written after a commit has none and joins any). The calls run in
    this order, so each run's events land in the order they were put."""
    out: list[tuple[str, list[_Pending]]] = []
    last: dict[str, int] = {}  # run: its newest call's index
    for p in events:
        i = last.get(p.run_id)
        if i is not None:
            token, ps = out[i]
            if not p.token or not token or token == p.token:
                ps.append(p)
                out[i] = (token or p.token, ps)
                continue
        last[p.run_id] = len(out)
        out.append((p.token, [p]))
    return out


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
    if after is None or after in ("0", _ANCHOR):
        return None, None
    pos, _, told = after.partition(_TOLD)
    if not told:
        return pos, None
    return (None if pos == _ANCHOR else pos), (told if told == _END else int(told))


def ended(run: Run, at: str = _ANCHOR) -> Event:
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


def message_data(message: dict[str, Any]) -> dict[str, Any]:
    """A journaled model message's text and tool calls (what a chat UI shows)."""
    content = message.get("content") or []
    return {
        "text": "".join(b.get("text", "") for b in content if b.get("type") == "text"),
        "tool_calls": [
            {"id": b.get("id"), "name": b.get("name"), "input": b.get("input")}
            for b in content
            if b.get("type") == "tool_use"
        ],
    }


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
    behind = after is None or _key(after) < _key(info.first)
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
        anchor = self.pos or _ANCHOR
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
    return Opening(info.last if info else (pos or _ANCHOR), why, 0)


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
        entries = log.read(run_id, pos or _ANCHOR, block=block)
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
                yield ended(run, pos or _ANCHOR)
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
) -> AsyncIterator[Event]:
    """follow() for asyncio. live(run_id, position) subscribes to the run's entries (the
    web server's Hub shares one XREAD among all its readers); by default each reader
    blocks on its own read. Yields Event(kind="keepalive") after idle seconds without
    any, so a server can write its keep-alive."""
    async for batch in afollow_batches(runs, log, run_id, after, idle=idle, live=live):
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
) -> AsyncGenerator[list[Event], None]:
    """afollow() a read at a time: a server writes each list in one go. parse=False:
    events read from the stream carry their kind and raw JSON only (data None), for a
    server that passes them on as they are."""
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
    sub = live(run_id, pos or _ANCHOR) if live is not None else _Own(log, run_id)
    read = Event.parse if parse else Event.unparsed
    failed = 0
    try:
        while True:
            try:
                entries = await sub.wait(pos or _ANCHOR, idle)
                failed = 0
            except StoreUnavailable:
                failed += 1
                if failed >= _OUTAGE_TRIES:
                    raise
                yield [Event(pos or _ANCHOR, "keepalive")]
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
                yield [ended(run, pos or _ANCHOR)]
                return
            yield [Event(pos or _ANCHOR, "keepalive")]
    finally:
        sub.close()


class Hub:
    """One process's live readers of many runs, served by one blocking XREAD at a time
    (not a Redis connection per open stream). A reader subscribes for as long as its
    stream is open; the hub's task reads every subscribed run from where it got to, keeps
    each run's last entries, and wakes the run's readers.

    A reader further behind than what the hub keeps reads its gap itself (one XRANGE), so
    a slow reader never holds the others back, and never the worker either: the worker
    only ever writes to Redis. After each read the task lingers a moment, so that under
    load one XREAD carries the entries of many runs."""

    def __init__(self, log: Any, keep: int = 64, linger: float = 0.005) -> None:
        self.log, self.keep, self.linger = log, keep, linger
        self._runs: dict[str, _Watched] = {}
        self._task: asyncio.Task[None] | None = None
        self._kicking = False
        self._wake = f"hub:{os.getpid()}:{id(self):x}"  # a stream only the hub's kick writes

    def subscribe(self, run_id: str, position: str) -> Live:
        w = self._runs.get(run_id)
        if w is None:
            w = self._runs[run_id] = _Watched(position, self.keep)
            self._kick()
        w.readers += 1
        return _Subscription(self, run_id, w)

    def _leave(self, run_id: str, w: _Watched) -> None:
        w.readers -= 1
        if w.readers == 0 and self._runs.get(run_id) is w:
            del self._runs[run_id]

    def _kick(self) -> None:
        """Start the reading task, or have its blocked XREAD return to take in the new
        runs: one wake for any number of runs subscribed meanwhile."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._read())
        elif not self._kicking:
            self._kicking = True
            asyncio.get_running_loop().create_task(self._wake_up())

    async def _wake_up(self) -> None:
        try:
            await self.log.poke(self._wake)
        except StoreUnavailable as exc:  # the next read (5 s at most) takes the run in
            logger.warning("event hub: wake failed: %s", exc, extra=logs.run(None, "hub_wake"))
        finally:
            self._kicking = False

    async def _read(self) -> None:
        while self._runs:
            after = {r: w.pos for r, w in self._runs.items()}
            after[self._wake] = "$"
            try:
                got = await self.log.read_many(after, count=self.keep, block=5.0)
            except StoreUnavailable as exc:
                logger.warning("event hub: %s", exc, extra=logs.run(None, "hub_read"))
                await asyncio.sleep(1.0)
                continue
            for run_id, entries in got.items():
                w = self._runs.get(run_id)
                if w is None or not entries:
                    continue
                async with w.cond:
                    w.add(entries)
                    w.cond.notify_all()
            await asyncio.sleep(self.linger)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        try:
            await self.log.forget(self._wake)
        except StoreUnavailable:
            pass


class _Subscription:
    def __init__(self, hub: Hub, run_id: str, w: _Watched) -> None:
        self.hub, self.run_id, self.w = hub, run_id, w
        self.closed = False

    async def wait(self, position: str, block: float) -> list[tuple[str, str]]:
        w = self.w
        if self.hub._task is None or self.hub._task.done():
            self.hub._kick()  # the task ended (no runs for a moment, or an error)
        deadline = time.monotonic() + block
        async with w.cond:
            while _key(w.pos) <= _key(position):
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                try:
                    await asyncio.wait_for(w.cond.wait(), left)
                except TimeoutError:
                    return []
            held = w.covers(position)
            if held is not None:
                return held
        # Further behind than the hub keeps: read it from Redis itself.
        got: dict[str, list[tuple[str, str]]] = await self.hub.log.read_many(
            {self.run_id: position}
        )
        return got.get(self.run_id, [])

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.hub._leave(self.run_id, self.w)


class _Watched:
    """A run the hub reads: how far, its last entries, its readers."""

    def __init__(self, pos: str, keep: int) -> None:
        self.pos = pos  # read up to here
        self.start = pos  # entries after this one are held, until the deque drops some
        self.entries: collections.deque[tuple[str, str]] = collections.deque(maxlen=keep)
        self.dropped = False
        self.cond = asyncio.Condition()
        self.readers = 0

    def add(self, entries: list[tuple[str, str]]) -> None:
        self.dropped |= len(self.entries) + len(entries) > (self.entries.maxlen or 0)
        self.entries.extend(entries)
        self.pos = entries[-1][0]

    def covers(self, position: str) -> list[tuple[str, str]] | None:
        """The held entries after position, or None if some of them are no longer held."""
        at = _key(position)
        whole = not self.dropped and at >= _key(self.start)
        if whole or (self.entries and _key(self.entries[0][0]) <= at):
            newer = []  # from the newest back: a reader that keeps up wants the last one or two
            for e in reversed(self.entries):
                if _key(e[0]) <= at:
                    break
                newer.append(e)
            newer.reverse()
            return newer
        return None
