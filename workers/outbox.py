"""Writing run events: a step's ctx.emit, its model tokens and the loop's own events go
into the process's Outbox, whose one thread sends them to the run's Redis stream in
batches, so a step never waits on Redis for a token (store/lua/emit.lua fences each
event by the run's lease and by its writer's epoch: a worker that lost the run writes
nothing).
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from cairn.core import logs
from cairn.core.errors import EventRefused, LeaseLost, StoreUnavailable
from cairn.core.events import encode
from cairn.core.records import StreamInfo

if TYPE_CHECKING:
    from cairn.core.settings import Settings

logger = logging.getLogger(__name__)


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
