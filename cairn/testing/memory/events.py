"""MemoryEvents: the run event streams (store/lua/emit.lua and Redis Streams) in dicts,
fenced against MemoryLeases."""

from __future__ import annotations

import threading
import time
from typing import Any

from cairn.store.events import is_origin
from cairn.store.lease import LeaseToken
from cairn.testing.memory.clock import Clock
from cairn.testing.memory.leases import MemoryLeases, _live


class MemoryEvents:
    """The run event streams (EventLog) in dicts, as store/lua/emit.lua and Redis Streams
    do it: ids "<ms>-<n>" rising per run, MAXLEN trimming, the fence against MemoryLeases,
    the cap. Give it to an Outbox (`loop.Deps(events=Outbox(MemoryEvents(leases), settings))`)
    to see a step's events in process."""

    def __init__(self, leases: MemoryLeases, clock: Clock = time.time) -> None:
        self._leases, self._clock = leases, clock
        self._cond = threading.Condition()
        self._streams: dict[str, list[tuple[str, str]]] = {}
        self._added: dict[str, int] = {}  # entries ever added (XINFO's entries-added)
        self._counted: dict[str, int] = {}  # events counted toward the cap
        self._newest: dict[str, int] = {}  # the newest epoch that wrote or claimed
        self._last: dict[str, tuple[int, int]] = {}

    def _id(self, run_id: str) -> str:
        ms = int(self._clock() * 1000)
        last_ms, n = self._last.get(run_id, (0, -1))
        ms, n = (last_ms, n + 1) if ms <= last_ms else (ms, 0)
        self._last[run_id] = (ms, n)
        return f"{ms}-{n}"

    def append(self, batches: Any, *, maxlen: int, ttl: float, cap: int) -> list[list[Any]]:
        out = []
        with self._cond:
            for run_id, token, events in batches:
                with self._leases._lock:
                    held = _live(self._leases._leases, run_id, self._leases._clock())
                held_by = str(held) if held is not None else None
                writer = LeaseToken.parse(token).epoch if token else 0
                stale = writer < self._newest.get(run_id, 0)
                ids: list[Any] = []
                for raw in events:
                    flag, blob = raw[0], raw[1:]
                    if (
                        stale
                        or (flag == "f" and held_by != token)
                        or (flag == "g" and held_by is not None and held_by != token)
                    ):
                        ids.append(0)
                        continue
                    if flag == "f" and cap > 0 and self._counted.get(run_id, 0) >= cap:
                        ids.append(1)
                        continue
                    if flag == "f":
                        self._counted[run_id] = self._counted.get(run_id, 0) + 1
                    entry = (self._id(run_id), blob)
                    stream = self._streams.setdefault(run_id, [])
                    stream.append(entry)
                    self._added[run_id] = self._added.get(run_id, 0) + 1
                    del stream[: max(0, len(stream) - maxlen)]
                    ids.append(entry[0])
                    self._newest[run_id] = max(writer, self._newest.get(run_id, 0))
                out.append(ids)
            self._cond.notify_all()
        return out

    def read(
        self, run_id: str, after: str = "0-0", count: int = 500, block: float | None = None
    ) -> list[tuple[str, str]]:
        def newer() -> list[tuple[str, str]]:
            at = _event_key(after)
            return [e for e in self._streams.get(run_id, []) if _event_key(e[0]) > at][:count]

        with self._cond:
            if block is not None:
                self._cond.wait_for(newer, timeout=block)
            return newer()

    def info(self, run_id: str) -> Any:
        from cairn.core.records import StreamInfo

        with self._cond:
            stream = self._streams.get(run_id)
            if not stream:
                return None
            trimmed = self._added[run_id] > len(stream)
            origin = is_origin(stream[0][1])
            return StreamInfo(stream[0][0], stream[-1][0], trimmed, origin)

    def claim(self, run_id: str, epoch: int, count: int, ttl: float) -> list[tuple[str, str]]:
        """claim.lua: fence the stream at epoch, then its newest entries, newest first."""
        with self._cond:
            self._newest[run_id] = max(epoch, self._newest.get(run_id, 0))
            return list(reversed(self._streams.get(run_id, [])[-count:]))

    def before(self, run_id: str, entry_id: str, count: int) -> list[tuple[str, str]]:
        with self._cond:
            at = _event_key(entry_id)
            older = [e for e in self._streams.get(run_id, []) if _event_key(e[0]) < at]
            return list(reversed(older[-count:]))

    def lose(self, run_id: str) -> None:
        """Drop the run's stream and its keys, as an expiry or a Redis that lost its data
        would."""
        with self._cond:
            for kept in (self._streams, self._added, self._counted, self._newest):
                kept.pop(run_id, None)


def _event_key(entry_id: str) -> tuple[int, int]:
    ms, _, n = entry_id.partition("-")
    return int(ms), int(n or 0)
