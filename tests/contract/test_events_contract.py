"""The event log's contract, run against Redis (store/events.py, store/lua/emit.lua) and
its in-memory twin (cairn.testing.MemoryEvents): order and ids, the fence, the cap, the
trim, blocking reads. A twin that drifts fails here."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cairn.core.events import Event, encode
from cairn.store.events import FENCED, OVER_CAP, RedisEvents
from cairn.store.lease import Leases
from cairn.testing import MemoryEvents, MemoryLeases


@pytest.fixture(params=["redis", "memory"])
def both(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    if request.param == "memory":
        leases = MemoryLeases()
        yield MemoryEvents(leases), leases
        return
    redis_url = request.getfixturevalue("redis_url")
    leases = Leases.from_url(redis_url)
    yield RedisEvents(leases.client), leases
    leases.client.close()


def _key(i: str) -> tuple[int, int]:
    ms, n = i.split("-")
    return int(ms), int(n)


def _append(log: Any, run_id: str, token: str, *events: str, cap: int = 0, maxlen: int = 1000):
    return log.append([(run_id, token, list(events))], maxlen=maxlen, ttl=60, cap=cap)[0]


def test_events_get_rising_ids_and_read_back_in_order_after_any_id(both) -> None:
    log, leases = both
    lease = leases.acquire("r", 30)
    token = str(lease.token)
    ids = _append(log, "r", token, *(encode("step", {"i": i}) for i in range(5)))
    assert all(isinstance(i, str) for i in ids) and ids == sorted(ids, key=_key)
    assert [Event.parse(*e).data["i"] for e in log.read("r")] == [0, 1, 2, 3, 4]
    assert [e[0] for e in log.read("r", ids[1])] == ids[2:]
    assert [e[0] for e in log.before("r", ids[3], 2)] == [ids[2], ids[1]]  # newest first
    info = log.info("r")
    assert (info.first, info.last, info.trimmed, info.origin) == (ids[0], ids[-1], False, False)
    assert log.info("none") is None and log.read("none") == []
    assert log.claim("none", 1, 10, 60) == [] and log.before("none", "1-0", 5) == []


def test_a_stream_begun_by_the_runs_first_event_says_so(both) -> None:
    log, leases = both
    token = str(leases.acquire("r", 30).token)
    _append(log, "r", token, encode("step_started", {}, origin=True), encode("mine", {}))
    assert log.info("r").origin
    _append(log, "s", token, encode("step_started", {}), encode("x", {}, origin=True))
    assert not log.info("s").origin  # only the first entry counts


def test_a_worker_that_takes_the_stream_over_fences_every_older_writer(both) -> None:
    """claim: from the new owner's epoch on, no event of an older epoch is added, whatever
    its kind (after its commit, too) and whatever the lease says; the newest entries come
    back, newest first, for the new owner to account for."""
    log, leases = both
    old = leases.acquire("r", 30)
    old_token = str(old.token)
    ids = _append(log, "r", old_token, *(encode("mine", {"i": i}) for i in range(3)))
    old.release()
    new = leases.acquire("r", 30)
    assert new.epoch > old.epoch
    assert [e[0] for e in log.claim("r", new.epoch, 2, 60)] == [ids[2], ids[1]]
    late = _append(log, "r", old_token, encode("step_saved", {}), encode("wait", {}))
    assert late == [FENCED, FENCED]  # a zombie's post-commit events, after the take-over
    assert isinstance(_append(log, "r", str(new.token), encode("step_saved", {}))[0], str)
    assert [Event.parse(*e).kind for e in log.read("r")] == ["mine"] * 3 + ["step_saved"]


def test_the_fence_by_kind_of_event(both) -> None:
    log, leases = both
    mine = leases.acquire("r", 30)
    token = str(mine.token)
    step = encode("mine", {})  # a step's own: fenced
    marker = encode("step_started", {})  # cairn's marker: refused only under another owner
    after = encode("step_saved", {})  # after a commit: never fenced
    assert all(isinstance(i, str) for i in _append(log, "r", token, step, marker, after))
    mine.release()
    # Nobody holds the run: a step's own event is refused, cairn's markers are not.
    assert [isinstance(i, str) for i in _append(log, "r", token, step, marker, after)] == [
        False,
        True,
        True,
    ]
    other = leases.acquire("r", 30)
    assert other is not None
    got = _append(log, "r", token, step, marker, after)
    assert got[:2] == [FENCED, FENCED] and isinstance(got[2], str)
    assert isinstance(_append(log, "r", str(other.token), step)[0], str)
    # Once the newer epoch has written, the older one's events are refused, all kinds.
    assert _append(log, "r", token, after) == [FENCED]


def test_the_cap_counts_a_steps_own_events_only(both) -> None:
    log, leases = both
    token = str(leases.acquire("r", 30).token)
    got = _append(log, "r", token, *(encode("mine", {}) for _ in range(3)), cap=2)
    assert got[2] == OVER_CAP and all(isinstance(i, str) for i in got[:2])
    over = _append(log, "r", token, encode("step_saved", {}), encode("mine", {}), cap=2)
    assert isinstance(over[0], str) and over[1] == OVER_CAP


def test_a_stream_past_its_maxlen_keeps_the_newest_and_says_it_was_trimmed(both) -> None:
    log, leases = both
    token = str(leases.acquire("r", 30).token)
    ids = _append(log, "r", token, *(encode("mine", {"i": i}) for i in range(450)), maxlen=10)
    info = log.info("r")
    kept = log.read("r", count=1000)
    # Redis trims whole nodes (MAXLEN ~): at most a node's worth over.
    assert info.trimmed and 10 <= len(kept) <= 110 and kept[-1][0] == ids[-1]
    assert info.first == kept[0][0] != ids[0]


def test_a_blocking_read_returns_when_an_event_comes(both) -> None:
    log, leases = both
    token = str(leases.acquire("r", 30).token)
    first = _append(log, "r", token, encode("mine", {}))[0]
    threading.Timer(0.2, lambda: _append(log, "r", token, encode("later", {}))).start()
    started = time.monotonic()
    got = log.read("r", first, block=5.0)
    assert [Event.parse(*e).kind for e in got] == ["later"]
    assert time.monotonic() - started < 2.0
    assert log.read("r", got[0][0], block=0.1) == []


def test_a_run_on_the_in_memory_twins_streams_its_events() -> None:
    """What a user's own test does: the loop on MemoryStore, MemoryLeases, MemoryEvents."""
    import cairn
    from cairn.client.events import follow
    from cairn.core.settings import Settings
    from cairn.testing import ManualClock, MemoryStore
    from cairn.workers import loop
    from cairn.workers.outbox import Outbox

    flow = cairn.workflow("events_twin")

    @flow.step()
    def hello(ctx: cairn.Context) -> cairn.StepResult:
        ctx.emit("said", {"text": "hello"})
        return cairn.StepResult(cursor=cairn.DONE)

    clock = ManualClock()
    store, leases = MemoryStore(clock), MemoryLeases(clock)
    outbox = Outbox(MemoryEvents(leases, clock), Settings())
    deps = loop.Deps(settings=Settings(), store=store, leases=leases, model=None, events=outbox)
    store.create_run("t1", "events_twin", {})
    assert loop.run("t1", deps) == "done"
    outbox.flush()
    events = list(follow(store, outbox.log, "t1", until=time.monotonic() + 5))
    assert [e.kind for e in events] == ["step_started", "said", "step_saved", "run_ended"]
    assert events[1].data == {"text": "hello"}


def test_redis_that_lost_its_scripts_still_takes_events(redis_url: str) -> None:
    """A restarted Redis forgets the loaded scripts: the append loads emit.lua again."""
    leases = Leases.from_url(redis_url)
    log = RedisEvents(leases.client)
    token = str(leases.acquire("r", 30).token)
    assert isinstance(_append(log, "r", token, encode("mine", {}))[0], str)
    leases.client.script_flush()
    got = log.append(
        [("r", token, [encode("mine", {})]), ("s", "", [encode("step_saved", {})])],
        maxlen=100,
        ttl=60,
        cap=0,
    )
    assert all(isinstance(ids[0], str) for ids in got)
    assert len(log.read("r")) == 2
    leases.client.close()


def test_a_read_blocked_as_long_as_a_follower_waits_returns_empty(redis_url: str) -> None:
    """follow() blocks 5 s at a time: the readers' sockets wait longer than that, so an
    idle run's read returns nothing instead of failing as a Redis outage."""
    log = RedisEvents.from_url(redis_url)
    try:
        assert log.read("idle", block=5.0) == []
    finally:
        log.close()
