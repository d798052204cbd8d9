"""The Redis lease against a real Redis: exclusivity, fencing epochs, compare-and-delete."""

from __future__ import annotations

import threading
import time

import pytest

from cairn.core.errors import LeaseLost
from cairn.store import Leases, keys


def test_second_owner_is_kept_off(leases: Leases) -> None:
    a = leases.acquire("r", ttl=2)
    assert a is not None
    assert leases.acquire("r", ttl=2) is None
    assert leases.holder("r") == a.token


def test_epoch_grows_and_respects_the_stored_floor(leases: Leases) -> None:
    a = leases.acquire("r", ttl=2)
    assert a is not None
    a.release()
    b = leases.acquire("r", ttl=2)
    assert b is not None and b.epoch == a.epoch + 1
    b.release()
    leases.client.flushdb()  # Redis lost its data: the checkpoint's epoch still fences
    c = leases.acquire("r", ttl=2, floor=41)
    assert c is not None and c.epoch == 42


def test_the_epoch_counter_expires_and_goes_with_the_lease_of_an_ended_run(
    leases: Leases,
) -> None:
    # Redis keeps no key per run forever: a counter idle for EPOCH_TTL expires, and the
    # release of a run that ended deletes it (the stored epoch is the floor after that).
    a = leases.acquire("r", ttl=2)
    assert a is not None
    ttl = leases.client.pttl(keys.epoch("r")) / 1000
    assert keys.EPOCH_TTL - 60 < ttl <= keys.EPOCH_TTL
    a.release()  # the run goes on later (waiting, handed off): its counter stays
    assert leases.client.exists(keys.epoch("r"))
    b = leases.acquire("r", ttl=0.2)
    assert b is not None and b.epoch == a.epoch + 1
    time.sleep(0.3)
    c = leases.acquire("r", ttl=2)  # b expired; c holds the run now
    assert c is not None
    b.release(ended=True)  # not b's lease any more: neither it nor the counter goes
    assert leases.holder("r") == c.token and leases.client.exists(keys.epoch("r"))
    c.release(ended=True)
    assert leases.holder("r") is None and not leases.client.exists(keys.epoch("r"))


def test_release_never_deletes_a_successors_lease(leases: Leases) -> None:
    a = leases.acquire("r", ttl=0.3)
    assert a is not None
    time.sleep(0.4)
    b = leases.acquire("r", ttl=5)
    assert b is not None
    a.release()
    assert leases.holder("r") == b.token


def test_heartbeat_keeps_it_and_loss_is_detected(leases: Leases) -> None:
    a = leases.acquire("r", ttl=0.6).start_heartbeat()  # type: ignore[union-attr]
    time.sleep(1.5)  # > 2 TTLs: only the heartbeat can have kept it
    a.ensure()
    assert leases.holder("r") == a.token
    leases.client.set("cairn:lease:r", "thief:1:x|99")
    time.sleep(0.5)
    with pytest.raises(LeaseLost, match="thief"):
        a.ensure()
    a.release()
    assert str(leases.holder("r")) == "thief:1:x|99"


def test_ensure_asks_redis_once_the_last_renewal_is_old(leases: Leases) -> None:
    a = leases.acquire("r", ttl=0.4)  # no heartbeat: as in a process paused by SIGSTOP
    assert a is not None
    time.sleep(0.5)  # its lease expired
    b = leases.acquire("r", ttl=5)
    assert b is not None
    with pytest.raises(LeaseLost, match="now held by"):
        a.ensure()


def test_a_fresh_check_asks_redis_even_right_after_a_renewal(leases: Leases) -> None:
    a = leases.acquire("r", ttl=5)
    assert a is not None
    leases.client.set("cairn:lease:r", "thief:1:x|99")  # taken while we were paused
    a.ensure()  # the renewal is young: trusted (the window ctx.once closes with fresh)
    with pytest.raises(LeaseLost, match="thief"):
        a.ensure(fresh=True)


def test_a_sent_mark_holds_until_a_worker_takes_the_run(leases: Leases) -> None:
    # The reaper sends one message per run while one is out untaken: no duplicate storm.
    assert leases.mark_sent("r-sent", 5.0)
    assert not leases.mark_sent("r-sent", 5.0)
    lease = leases.acquire("r-sent", 5.0)
    assert lease is not None
    assert leases.mark_sent("r-sent", 5.0)  # taken: the next stall may be reaped at once
    lease.release()


def test_one_heartbeat_thread_renews_every_lease_of_the_process(leases: Leases) -> None:
    def beats() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "cairn-lease-heartbeat"]

    before = set(beats())  # other tests' Leases may still have theirs (and end them idle)
    held = [leases.acquire(f"r-{i}", ttl=0.6).start_heartbeat() for i in range(50)]  # type: ignore[union-attr]
    time.sleep(1.5)  # > 2 TTLs: only the heartbeat can have kept them
    assert all(leases.holder(f"r-{i}") == lease.token for i, lease in enumerate(held))
    assert len(set(beats()) - before) == 1  # one thread for the 50
    for lease in held[:25]:
        lease.release()
    time.sleep(1.0)  # released ones are no longer renewed (release deleted them anyway)
    assert all(leases.holder(f"r-{i}") is None for i in range(25))
    assert all(leases.holder(f"r-{i}") == held[i].token for i in range(25, 50))
    for lease in held[25:]:
        lease.release()


def test_a_delivery_that_never_lets_go_of_its_run_is_found_once_its_lease_is_old(
    leases: Leases,
) -> None:
    """keys.DELIVERIES: an acquire lists the run, its release takes it out (ended or
    not); a worker that died holding it leaves it listed, found past older_than."""
    gone = leases.acquire("died", ttl=0.3)
    let_go = leases.acquire("released", ttl=5)
    broken = leases.acquire("broken", ttl=5)
    assert gone is not None and let_go is not None and broken is not None
    let_go.release(ended=True)
    assert leases.break_dead("broken", broken.token)  # the one breaking it takes it next
    assert leases.lost_deliveries(older_than=5) == []  # none old enough yet
    time.sleep(0.4)
    assert sorted(leases.lost_deliveries(older_than=0.3)) == ["broken", "died"]
    assert leases.unheld(["died", "broken"]) == ["died", "broken"]
    again = leases.acquire("died", ttl=5)  # a worker takes it: listed anew, now
    assert again is not None and leases.lost_deliveries(older_than=0.3) == ["broken"]
    again.release()
    assert leases.lost_deliveries(older_than=0.0) == ["broken"]
