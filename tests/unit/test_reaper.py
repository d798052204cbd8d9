"""The reaper's rules, without Celery: which runs a pass sends again, which it leaves, and
how much one pass may list.

The store here answers only the reaper's questions, from lists the test sets (which runs
look abandoned is the store's, held by the contract tests); the leases are the in-memory
twin on a clock the test moves. The same rules against real Postgres, Redis and workers
are tests/fleet/test_lost_messages.py, tests/fleet/test_backlog.py and the crash tests.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.testing.memory import MemoryLeases
from cairn.testing.memory.clock import ManualClock
from cairn.workers.reaper import Reaper

SETTINGS = Settings(lease_ttl=4.0, lost_after=10.0, pending_after=300.0, reaper_interval=2.0)
WINDOW = SETTINGS.resend_window  # 10 s: a message sent waits this long, then twice that...


@dataclasses.dataclass
class Store:
    stalled_rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    unclaimed_rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    touched: set[str] = dataclasses.field(default_factory=set)  # claimed/saved since listed
    folds: int = 0
    pages: list[tuple[str, int]] = dataclasses.field(default_factory=list)  # (after, limit)
    counted: list[int] = dataclasses.field(default_factory=list)  # unclaimed_count's upto
    pending_taken: int = 0  # pending runs a worker took (counted among the pending)

    def stalled(
        self, running_after: float, after: str = "", limit: int = 500
    ) -> tuple[list[dict[str, Any]], str | None]:
        assert running_after == SETTINGS.lease_ttl / 2
        self.pages.append((after, limit))
        page = sorted(
            (r for r in self.stalled_rows if r["run_id"] > after), key=lambda r: r["run_id"]
        )[:limit]
        return page, page[-1]["run_id"] if len(page) == limit else None

    def counts(self) -> dict[str, dict[str, Any]]:
        pending = len(self.unclaimed_rows) + self.pending_taken
        return {RunStatus.PENDING: {"n": pending}} if pending else {}

    def unclaimed_count(self, older_than: float, upto: int) -> int:
        assert older_than == SETTINGS.lost_after
        self.counted.append(upto)
        return min(len(self.unclaimed_rows), upto)

    def unclaimed(
        self, older_than: float, limit: int = 10_000, after: tuple[Any, str] | None = None
    ) -> list[dict[str, Any]]:
        assert older_than == SETTINGS.lost_after
        rows = [
            r
            for r in self.unclaimed_rows
            if after is None or (r["created_at"], r["run_id"]) > after
        ]
        return rows[:limit]

    def unchanged(self, rows: list[dict[str, Any]]) -> set[str]:
        return {r["run_id"] for r in rows} - self.touched

    def fold_counts(self) -> int:
        self.folds += 1
        return 0


class Ticks:
    """The reaper's clock for its deadline: each reading a tick later."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def row(run_id: str, status: str = RunStatus.RUNNING, epoch: int = 3) -> dict[str, Any]:
    return {"run_id": run_id, "status": status, "epoch": epoch, "updated_at": 0, "created_at": 0}


def make(
    store: Store,
    leases: MemoryLeases | None = None,
    in_flight: int = 0,
    **options: Any,
) -> tuple[Reaper, list[str], MemoryLeases]:
    """A reaper over store, and what it sent. in_flight: the broker's run messages before
    the reaper sends any (it then holds one more for each the reaper sent)."""
    sent: list[str] = []
    leases = leases or MemoryLeases(ManualClock())
    r = Reaper(
        store=store,
        leases=leases,
        settings=SETTINGS,
        in_flight=lambda _: in_flight + len(sent),
        send=sent.append,
        **options,
    )
    return r, sent, leases


def hold(leases: MemoryLeases, run_id: str, ttl: float = 1e6) -> None:
    assert leases.acquire(run_id, ttl) is not None


def test_a_stalled_run_without_a_lease_is_sent_once_and_a_held_one_never() -> None:
    store = Store(stalled_rows=[row("dead"), row("alive")])
    r, sent, leases = make(store)
    hold(leases, "alive")
    assert r.reap() == 1 and sent == ["dead"]
    assert r.reap() == 0 and sent == ["dead"]  # its message is out: no second send
    assert store.folds == 2  # every pass folds the status counts


def test_a_run_touched_between_the_listing_and_the_lease_check_is_not_sent() -> None:
    store = Store(stalled_rows=[row("finished-meanwhile")], touched={"finished-meanwhile"})
    r, sent, _ = make(store)
    assert r.reap() == 0 and sent == []
    # Not marked as sent either: stalled again later (its worker lost), it goes at once.
    store.touched.clear()
    assert r.reap() == 1 and sent == ["finished-meanwhile"]


def test_a_run_sent_and_not_taken_waits_each_wait_twice_the_last() -> None:
    """A resume that waits behind a backlog longer than a window is not sent again each
    window: the waits double up to CAIRN_PENDING_AFTER, and a worker taking the run
    starts them over."""
    clock = ManualClock()
    store = Store(stalled_rows=[row("queued")])
    r, _, leases = make(store, MemoryLeases(clock))
    assert r.reap() == 1
    at = [clock.now]
    for _ in range(200):  # 2,000 s of passes, 10 s apart
        clock.advance(10)
        if r.reap():
            at.append(clock.now)
    waits = [round(b - a) for a, b in itertools.pairwise(at)]
    assert waits[:7] == [10, 20, 40, 80, 160, 300, 300], waits  # never one a window
    assert set(waits[5:]) == {300}
    lease = leases.acquire("queued", SETTINGS.lease_ttl)  # a worker takes it, then dies
    assert lease is not None
    clock.advance(SETTINGS.lease_ttl)
    assert r.reap() == 1  # at once: its last message was taken
    clock.advance(WINDOW)
    assert r.reap() == 1  # and the first wait again


def test_never_taken_runs_wait_while_the_broker_holds_a_message_for_each() -> None:
    """A backlog after an outage: 10,000 runs never taken, however old, each with its
    message queued. None is sent again; one whose message was lost is, the oldest first."""
    backlog = [row(f"u{i:05d}", status=RunStatus.PENDING, epoch=0) for i in range(10_000)]
    store = Store(unclaimed_rows=backlog)
    r, sent, leases = make(store, in_flight=10_000)
    for _ in range(5):
        assert r.reap() == 0
    assert sent == [] and store.counted == []  # as many messages as pending runs: no count
    # Pending runs a worker took (their first step under way) count among the pending:
    # then the runs never taken are counted, up to what the answer needs.
    store.pending_taken = 5
    assert r.reap() == 0 and sent == []
    assert store.counted == [10_000 + r.batch + 1]
    r, sent, _ = make(store, leases, in_flight=9_998)
    assert r.reap() == 2 and sent == ["u00000", "u00001"]  # the oldest two lost theirs
    assert r.reap() == 0  # their messages are out


def test_lost_messages_are_sent_a_page_a_pass() -> None:
    """A flushed broker: 1,200 runs lost their messages. A pass sends at most a page of
    them; the broker then holds those, so the next pass sends the next page."""
    store = Store(unclaimed_rows=[row(f"u{i:04d}", RunStatus.PENDING, 0) for i in range(1_200)])
    r, sent, _ = make(store, batch=500)
    assert [r.reap() for _ in range(4)] == [500, 500, 200, 0]
    assert sorted(sent) == sorted(x["run_id"] for x in store.unclaimed_rows)


def test_a_pass_walks_a_page_at_a_time_stops_at_its_deadline_and_the_next_goes_on() -> None:
    """3,000 runs a worker took, all stalled (a fleet lost whole): each page lists at most
    a batch, a pass stops once its time is up, the next goes on where it stopped, and
    every run is sent once."""
    store = Store(stalled_rows=[row(f"r{i:04d}") for i in range(3_000)])
    r, sent, _ = make(store, batch=200, budget=1.0, clock=Ticks(0.1))
    first = r.reap()
    assert 0 < first < 3_000 and len(store.pages) < 15  # stopped at its deadline
    assert all(limit == 200 for _, limit in store.pages)
    while len(sent) < 3_000:
        before = len(sent)
        r.reap()
        assert len(sent) > before
    assert sorted(sent) == [x["run_id"] for x in store.stalled_rows]  # each once
    afters = [after for after, _ in store.pages]
    assert afters[0] == "" and afters[1:] == sorted(afters[1:], key=lambda a: (a == "", a))


def test_a_delivery_that_never_let_go_of_its_run_is_sent_again_whatever_its_status() -> None:
    """A worker that died after a run's last commit: nothing in Postgres says the run
    needs a worker (it is done), but its delivery never let go of it. Sent again once,
    unless its lease is still held (a long step)."""
    clock = ManualClock()
    leases = MemoryLeases(clock)
    for run_id in ("done-then-died", "also-stalled"):
        assert leases.acquire(run_id, SETTINGS.lease_ttl) is not None
    hold(leases, "long-step")
    clock.advance(SETTINGS.lease_ttl + 1)  # the two leases expired, their deliveries listed
    store = Store(stalled_rows=[row("also-stalled")])
    r, sent, _ = make(store, leases)
    assert r.reap() == 2 and sorted(sent) == ["also-stalled", "done-then-died"]
    assert r.reap() == 0  # their messages are out


def test_the_walk_over_deliveries_reaches_past_a_page_of_live_ones() -> None:
    """Hundreds of long runs hold their leases; a worker lost whole holds the newest
    deliveries. A pass walks a page of them, the next pass the next page: the dead ones
    are found, not hidden behind the live ones at the head."""
    clock = ManualClock()
    leases = MemoryLeases(clock)
    for i in range(250):
        hold(leases, f"long-{i:03d}")
        clock.advance(0.01)
    for i in range(3):
        assert leases.acquire(f"dead-{i}", SETTINGS.lease_ttl) is not None
    clock.advance(SETTINGS.lease_ttl + 1)
    r, sent, _ = make(Store(), leases, batch=100, budget=1.0, clock=Ticks(0.6))
    for _ in range(4):
        r.reap()
    assert sorted(sent) == ["dead-0", "dead-1", "dead-2"]
