"""The reaper's rules, without Celery: which runs a pass sends again, and which it leaves.

The store and leases here answer only the reaper's questions, from lists the test sets;
the same rules against real Postgres, Redis and workers are tests/fleet/test_lost_messages.py
and the crash tests.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.workers.reaper import Reaper

SETTINGS = Settings(lease_ttl=4.0, lost_after=10.0, pending_after=300.0)


@dataclasses.dataclass
class Store:
    stalled_rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    unclaimed_rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    touched: set[str] = dataclasses.field(default_factory=set)  # claimed/saved since listed
    folds: int = 0

    def stalled(self, pending_after: float, running_after: float) -> list[dict[str, Any]]:
        assert (pending_after, running_after) == (300.0, 2.0)
        return list(self.stalled_rows)

    def unclaimed(self, older_than: float, limit: int = 10_000) -> list[dict[str, Any]]:
        assert older_than == 10.0
        return self.unclaimed_rows[:limit]

    def unchanged(self, rows: list[dict[str, Any]]) -> set[str]:
        return {r["run_id"] for r in rows} - self.touched

    def fold_counts(self) -> int:
        self.folds += 1
        return 0


@dataclasses.dataclass
class Leases:
    held: set[str] = dataclasses.field(default_factory=set)
    sent: dict[str, float] = dataclasses.field(default_factory=dict)
    lost: list[str] = dataclasses.field(default_factory=list)  # deliveries never let go of

    def lost_deliveries(self, older_than: float, limit: int = 10_000) -> list[str]:
        assert older_than == SETTINGS.lease_ttl
        return self.lost[:limit]

    def unheld(self, run_ids: list[str]) -> list[str]:
        return [r for r in run_ids if r not in self.held]

    def mark_sent(self, run_id: str, window: float) -> bool:
        if run_id in self.sent:
            return False
        self.sent[run_id] = window
        return True


def row(run_id: str, status: str = RunStatus.RUNNING, epoch: int = 3) -> dict[str, Any]:
    return {"run_id": run_id, "status": status, "epoch": epoch, "updated_at": 0}


def reaper(store: Store, leases: Leases, in_flight: int = 0) -> tuple[Reaper, list[str]]:
    sent: list[str] = []
    counts: list[float] = []

    def count(taken_within: float) -> int:
        counts.append(taken_within)
        return in_flight

    return Reaper(
        store=store, leases=leases, settings=SETTINGS, in_flight=count, send=sent.append
    ), sent


def test_a_stalled_run_without_a_lease_is_sent_once_and_a_held_one_never() -> None:
    store = Store(stalled_rows=[row("dead"), row("alive")])
    leases = Leases(held={"alive"})
    r, sent = reaper(store, leases)
    assert r.reap() == 1 and sent == ["dead"]
    assert leases.sent == {"dead": SETTINGS.resend_window}
    assert r.reap() == 0 and sent == ["dead"]  # its message is out: no second send
    assert store.folds == 2  # every pass folds the status counts


def test_a_run_touched_between_the_listing_and_the_lease_check_is_not_sent() -> None:
    store = Store(stalled_rows=[row("finished-meanwhile")], touched={"finished-meanwhile"})
    r, sent = reaper(store, Leases())
    assert r.reap() == 0 and sent == []


def test_a_never_taken_pending_run_waits_out_pending_after_again() -> None:
    store = Store(stalled_rows=[row("queued", status=RunStatus.PENDING, epoch=0)])
    leases = Leases()
    r, sent = reaper(store, leases)
    assert r.reap() == 1 and sent == ["queued"]
    assert leases.sent == {"queued": SETTINGS.pending_after}


def test_only_unclaimed_runs_beyond_the_brokers_messages_count_as_lost() -> None:
    store = Store(
        unclaimed_rows=[row(f"u{i}", status=RunStatus.PENDING, epoch=0) for i in range(5)]
    )
    r, sent = reaper(store, Leases(), in_flight=3)
    assert r.reap() == 2 and sent == ["u0", "u1"]  # the oldest two lost their message
    r, sent = reaper(Store(unclaimed_rows=store.unclaimed_rows), Leases(), in_flight=5)
    assert r.reap() == 0 and sent == []  # a message for each: no storm


def test_a_delivery_that_never_let_go_of_its_run_is_sent_again_whatever_its_status() -> None:
    """A worker that died after a run's last commit: nothing in Postgres says the run
    needs a worker (it is done), but its delivery never let go of it. Sent again once,
    unless its lease is still held (a long step)."""
    leases = Leases(lost=["done-then-died", "long-step", "also-stalled"], held={"long-step"})
    store = Store(stalled_rows=[row("also-stalled")])
    r, sent = reaper(store, leases)
    assert r.reap() == 2 and sorted(sent) == ["also-stalled", "done-then-died"]
    assert r.reap() == 0  # their messages are out
