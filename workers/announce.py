"""A delivery's account of its run on the run's live stream.

The loop tells its Announcer what happened (a step started or saved, a retry, a wait, the
run's end, a resume) and the Announcer writes the events through the process's outbox,
each under the delivery's lease token: emit.lua refuses them once another worker has the
run, and refuses any event of an older epoch once a newer one has written.

A worker that takes a run over (after a lost worker, a wait, or a redelivery of a run that
has stopped) first accounts for the last attempt that wrote to the stream (take_over): the
stream is fenced at the new epoch, then its tail is read and held against the step
history, which says what each attempt did. A step that saved gets its `step_saved`, late
if the kill came between its commit and its events, with the journaled answers the stream
lacks; a retry its `retry`; an attempt that saved nothing is abandoned. So the stream never
calls a committed step abandoned, and never misses one.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from cairn.core import logs
from cairn.core.errors import StoreUnavailable
from cairn.core.events import ENDS_ATTEMPT, Event, encode, message_data
from cairn.core.status import STOPPED, RunStatus
from cairn.steps.registry import DONE

if TYPE_CHECKING:
    from cairn.store import Checkpoint
    from cairn.store.contract import CheckpointStore, HeldLease
    from cairn.workers.outbox import Outbox

logger = logging.getLogger(__name__)

_PAGE = 200  # entries read at once while looking back over the cut attempt's events
_SCAN = 20_000  # the most looked at: an attempt's tokens past it are taken as told


class Announcer:
    """The events of one delivery of a run. outbox None: the fleet runs without events,
    and every call does nothing. origin: the run had saved nothing when this delivery
    claimed it, so its first event may begin the stream (store.events.is_origin)."""

    def __init__(self, outbox: Outbox | None, lease: HeldLease, origin: bool = False) -> None:
        self.outbox, self.lease, self._origin = outbox, lease, origin

    def tell(self, cp: Checkpoint, kind: str, data: Any) -> None:
        """One of cairn's own events about the step at cp, queued (the loop does not wait)."""
        if self.outbox is None:
            return
        visit = cp.visits.get(cp.cursor, 0)
        self._put(cp.run_id, kind, data, cp.cursor, visit, cp.epoch, cp.seq)

    def _put(
        self,
        run_id: str,
        kind: str,
        data: Any,
        cursor: str | None,
        visit: int | None,
        attempt: int | None,
        seq: int | None,
    ) -> None:
        assert self.outbox is not None
        origin, self._origin = self._origin, False
        event = encode(
            kind, data, cursor=cursor, visit=visit, attempt=attempt, seq=seq, origin=origin
        )
        self.outbox.put(run_id, str(self.lease.token), event)

    def step_saved(self, cp: Checkpoint, nxt: Checkpoint) -> None:
        self.tell(cp, "step_saved", {"next": nxt.cursor, "status": str(nxt.status)})
        if nxt.status == RunStatus.WAITING and nxt.wait_event is not None:
            self.tell(nxt, "wait", {"event": nxt.wait_event})

    def ended(self, cp: Checkpoint, status: RunStatus, error: str | None) -> None:
        self.tell(cp, "run_ended", {"status": str(status), "error": error, "cost_usd": cp.cost_usd})

    # -- taking a run over ------------------------------------------------------------
    def take_over(self, cp: Checkpoint, store: CheckpointStore) -> None:
        """Before this delivery's own events: fence the stream at this lease's epoch and
        tell what the last attempt that wrote to it did (cp: the checkpoint as claimed, or
        as found stopped)."""
        if self.outbox is None:
            return
        try:
            self._take_over(cp, store)
        except StoreUnavailable as exc:  # live events only: the run goes on without these
            logger.warning(
                "run %s: its stream's tail was not accounted for: %s",
                cp.run_id,
                exc,
                extra=logs.at(cp, "take_over_events"),
            )

    def _take_over(self, cp: Checkpoint, store: CheckpointStore) -> None:
        assert self.outbox is not None
        log, run_id, epoch = self.outbox.log, cp.run_id, self.lease.epoch
        tail = _Tail(log.claim(run_id, epoch, _PAGE, self.outbox.ttl))
        while tail.more():
            tail.extend(log.before(run_id, tail.oldest, _PAGE))
        cut = tail.cut if tail.cut is not None else -1  # -1: nothing in the stream
        if cut >= epoch:
            return  # (after a lost counter) nothing older
        # What the cut attempt did after the last thing it told, and all that the
        # attempts after it did: their events never reached the stream (a newer epoch's
        # come after an older one's, never before).
        rows = [
            h
            for h in store.history(run_id)
            if h["outcome"] in _TOLD_AFTER
            and ((h["epoch"] == cut and h["seq"] >= tail.floor) or cut < h["epoch"] < epoch)
        ]
        rows.sort(key=lambda h: (h["seq"], h["epoch"]))
        calls: list[dict[str, Any]] | None = None
        ended = tail.newest_kind == "run_ended"
        for h in rows:
            if h["outcome"] == "saved":
                if calls is None:
                    calls = store.calls(run_id, limit=10_000)
                ended |= self._saved_late(cp, h, calls, tail.shown, last=h is rows[-1])
            elif h["outcome"] == "retry":
                self._late(run_id, h, "retry", {"error": h["error"]})
            elif cp.status in STOPPED and h is rows[-1]:
                self._late(run_id, h, "run_ended", _end_of(cp))
                ended = True
            else:  # it stopped the run, which was re-armed since: its events do not stand
                self._abandon(cp, h["cursor"], h["visit"], h["epoch"])
        told = any(h["epoch"] == cut and h["seq"] >= tail.newest_seq for h in rows)
        if tail.newest is not None and not told and tail.newest_kind not in ENDS_ATTEMPT:
            self._abandon(cp, tail.newest.cursor, tail.newest.visit, cut)
        if cp.status in STOPPED and not ended:
            self.tell(cp, "run_ended", {**_end_of(cp), "late": True})

    def _saved_late(
        self,
        cp: Checkpoint,
        h: dict[str, Any],
        calls: list[dict[str, Any]],
        shown: set[tuple[str | None, int | None, int]],
        last: bool,
    ) -> bool:
        """A step the cut attempt saved whose step_saved the stream lacks: first its
        journaled answers the stream lacks (the outbox lost them with its process), then
        its step_saved, and what came with the save (a wait, the run's end: True)."""
        run_id, cursor, visit = cp.run_id, h["cursor"], h["visit"]
        for c in calls:
            mine = c["cursor"] == cursor or c["cursor"].startswith(f"{cursor}/")
            if not mine or c["visit"] != visit or (c["cursor"], visit, c["pos"]) in shown:
                continue
            if c["name"] == "model" and c.get("result") is not None:
                kind = "message"
                data = {"call": c["pos"], **message_data(c["result"]), "cost_usd": c["cost_usd"]}
            else:
                kind = "call"
                data = {"call": c["pos"], "name": c["name"], "result": c.get("result")}
                if c.get("error") is not None:
                    data["error"] = c["error"].get("message")
            data["late"] = True
            self._put(run_id, kind, data, c["cursor"], visit, h["epoch"], h["seq"])
        nxt = h["next_cursor"]
        waits = last and h["seq"] + 1 == cp.seq and cp.status == RunStatus.WAITING
        status = (
            RunStatus.DONE if nxt == DONE else RunStatus.WAITING if waits else RunStatus.RUNNING
        )
        self._late(run_id, h, "step_saved", {"next": nxt, "status": str(status)})
        if waits and cp.wait_event is not None:
            wait = {"event": cp.wait_event, "late": True}
            self._put(run_id, "wait", wait, nxt, None, h["epoch"], h["seq"] + 1)
        if nxt == DONE and cp.status == RunStatus.DONE:
            self._late(run_id, h, "run_ended", _end_of(cp))
            return True
        return False

    def _late(self, run_id: str, h: dict[str, Any], kind: str, data: dict[str, Any]) -> None:
        """An event the attempt of history row h would have written, written now."""
        data = {**data, "late": True}
        self._put(run_id, kind, data, h["cursor"], h["visit"], h["epoch"], h["seq"])

    def _abandon(self, cp: Checkpoint, cursor: str | None, visit: int | None, cut: int) -> None:
        where = {"cursor": cursor, "visit": visit, "attempt": cut}
        self._put(cp.run_id, "attempt_abandoned", where, cursor, visit, self.lease.epoch, cp.seq)


# The step history's outcomes the stream tells of (a fork's mark is not an attempt's).
_TOLD_AFTER = frozenset({"saved", "retry", *(str(s) for s in STOPPED)})


def _end_of(cp: Checkpoint) -> dict[str, Any]:
    return {"status": str(cp.status), "error": cp.error, "cost_usd": cp.cost_usd}


# The events that tell what an attempt's step did, with what their seq says of it: a
# step_saved, retry or run_ended tells its own step; a wait (written at the saved seq)
# the step before.
_TELLS = {"step_saved": 0, "retry": 0, "run_ended": 0, "wait": -1}


class _Tail:
    """What the stream's newest entries say of the last attempt that wrote to it (the
    cut attempt): its epoch, its newest event, through which step it told what its steps
    did, and which journaled calls it showed. Fed newest first, until an event of another
    attempt or the cut attempt's newest telling event (everything before that was told,
    in order)."""

    def __init__(self, entries: list[tuple[str, str]]) -> None:
        self.cut: int | None = None
        self.newest: Event | None = None
        self.oldest = ""
        self.told_through: int | None = None
        self.first_seq: int | None = None  # the oldest seq of its events looked at
        self.shown: set[tuple[str | None, int | None, int]] = set()
        self._done, self._seen = False, 0
        self.extend(entries)

    def extend(self, entries: list[tuple[str, str]]) -> None:
        if not entries:
            self._done = True
        for entry_id, blob in entries:
            if self._done:
                return
            self.oldest, self._seen = entry_id, self._seen + 1
            e = Event.parse(entry_id, blob)
            if e.attempt is None:
                continue  # the outbox's own markers (dropped): nobody's attempt
            if self.cut is None:
                self.cut, self.newest = e.attempt, e
            elif e.attempt != self.cut:
                self._done = True
                return
            if e.kind in _TELLS and e.seq is not None:
                self.told_through, self._done = e.seq + _TELLS[e.kind], True
                return
            if e.seq is not None:
                self.first_seq = e.seq
            if e.kind in ("message", "call") and isinstance(e.data, dict):
                self.shown.add((e.cursor, e.visit, e.data.get("call", -1)))
        if self._seen >= _SCAN:
            self._done = True

    def more(self) -> bool:
        return not self._done

    @property
    def floor(self) -> int:
        """The cut attempt's steps from this seq on may be untold."""
        if self.told_through is not None:
            return self.told_through + 1
        return self.first_seq if self.first_seq is not None else 0

    @property
    def newest_seq(self) -> int:
        return self.newest.seq if self.newest is not None and self.newest.seq is not None else -1

    @property
    def newest_kind(self) -> str | None:
        return self.newest.kind if self.newest is not None else None
