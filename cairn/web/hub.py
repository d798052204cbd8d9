"""The web server's live readers of many runs, served by one blocking XREAD at a time."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from typing import Any

from cairn.client.events import Live
from cairn.core import logs
from cairn.core.errors import StoreUnavailable
from cairn.core.events import entry_key

logger = logging.getLogger(__name__)


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
            while entry_key(w.pos) <= entry_key(position):
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
        at = entry_key(position)
        whole = not self.dropped and at >= entry_key(self.start)
        if whole or (self.entries and entry_key(self.entries[0][0]) <= at):
            newer = []  # from the newest back: a reader that keeps up wants the last one or two
            for e in reversed(self.entries):
                if entry_key(e[0]) <= at:
                    break
                newer.append(e)
            newer.reverse()
            return newer
        return None
