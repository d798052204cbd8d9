"""Run events on real Postgres and Redis: ctx.emit and cairn's own events in the run's
stream, read back by Client.events and AsyncClient.events; the limits; the fence; an
attempt cut short marked abandoned; the durable record after a gap."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import cairn
from cairn.client.client import Client
from cairn.core.errors import LeaseLost
from cairn.core.events import Event
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.steps import Context, StepResult, workflow
from cairn.steps.model import ModelClient
from cairn.store import keys
from cairn.store.events import RedisEvents
from cairn.store.lease import Leases
from cairn.workers import loop
from cairn.workers.middleware import Chain
from cairn.workers.outbox import Outbox

flow = workflow("events_flow")
CRASH = {"armed": False}


class Crash(BaseException):
    """A worker gone mid-step: nothing after it runs, the lease is let go unsaved."""


@flow.step()
def talk(ctx: Context) -> StepResult:
    for i in range(int(ctx.input.get("n", 3))):
        ctx.emit("progress", {"i": i})
    if CRASH["armed"]:
        CRASH["armed"] = False
        raise Crash
    answer = ctx.model(messages=[{"role": "user", "content": "REPLY: four words come back"}])
    return StepResult(cursor="end", state={"said": answer.content[0].text})


@flow.step()
def end(ctx: Context) -> StepResult:
    data = ctx.input.get("data", {})
    ctx.emit(ctx.input.get("kind", "finished"), {"x": float("nan")} if data == "nan" else data)
    return StepResult(cursor=cairn.DONE)


@pytest.fixture
def events_deps(settings: Settings, store: Any, leases: Leases) -> Iterator[loop.Deps]:
    model = ModelClient(base_url=settings.anthropic_base_url, give_up_after=10.0)
    outbox = Outbox(RedisEvents(leases.client), settings)
    yield loop.Deps(settings=settings, store=store, leases=leases, model=model, events=outbox)
    model.close()


def _run(client: Client, deps: loop.Deps, data: dict[str, Any] | None = None) -> str:
    run_id = f"ev-{uuid.uuid4().hex[:10]}"
    client.store.create_run(run_id, "events_flow", data or {})
    return run_id


def _kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


def _ids_increase(events: list[Event]) -> bool:
    keys_ = [tuple(int(x) for x in e.id.split("-")) for e in events]
    return all(a < b for a, b in itertools.pairwise(keys_))


def test_a_run_streams_its_events_in_order_and_a_reader_goes_on_after_an_id(
    client: Client, events_deps: loop.Deps
) -> None:
    run_id = _run(client, events_deps)
    assert loop.run(run_id, events_deps) == RunStatus.DONE
    events = list(client.events(run_id, timeout=10))
    assert _kinds(events) == [
        "step_started",
        "progress",
        "progress",
        "progress",
        "message",
        "step_saved",
        "finished",
        "step_saved",
        "run_ended",
    ]
    assert _ids_increase(events)
    assert [e.data["i"] for e in events if e.kind == "progress"] == [0, 1, 2]
    message = next(e for e in events if e.kind == "message")
    assert message.data["text"] == "four words come back" and message.data["call"] == 0
    assert events[-1].data["status"] == "done"
    assert {e.cursor for e in events[:6]} == {"talk"} and events[0].attempt >= 1
    # Resuming after any id gives exactly the rest: no gap, no duplicate.
    for cut in (0, 3, 7):
        rest = list(client.events(run_id, after=events[cut].id, timeout=10))
        assert [e.id for e in rest] == [e.id for e in events[cut + 1 :]]


def test_async_client_reads_the_same_events(
    settings: Settings, client: Client, events_deps: loop.Deps
) -> None:
    run_id = _run(client, events_deps)
    assert loop.run(run_id, events_deps) == RunStatus.DONE

    async def read() -> list[Event]:
        async with cairn.AsyncClient(settings=settings) as aclient:
            return [e async for e in aclient.events(run_id)]

    assert asyncio.run(read()) == list(client.events(run_id, timeout=10))


def test_a_reader_that_starts_first_follows_the_run_live(
    client: Client, events_deps: loop.Deps
) -> None:
    run_id = _run(client, events_deps)
    seen: list[Event] = []
    reader = threading.Thread(target=lambda: seen.extend(client.events(run_id, timeout=20)))
    reader.start()
    assert loop.run(run_id, events_deps) == RunStatus.DONE
    reader.join(20)
    assert not reader.is_alive() and seen[-1].kind == "run_ended" and _ids_increase(seen)
    assert len(seen) == 9


@pytest.mark.parametrize(
    ("kind", "data", "why"),
    [
        ("token", {}, "cairn's own"),
        ("Bad Kind", {}, "lower-case"),
        ("big", {"x": "y" * 70_000}, "CAIRN_MAX_EVENT_BYTES"),
        ("nan", "nan", "not JSON"),
    ],
)
def test_an_event_refused_fails_the_step_with_the_reason(
    client: Client, events_deps: loop.Deps, kind: str, data: Any, why: str
) -> None:
    run_id = _run(client, events_deps, {"kind": kind, "data": data})
    assert loop.run(run_id, events_deps) == RunStatus.FAILED
    run = client.get(run_id)
    assert run is not None and "EventRefused" in (run.error or "") and why in (run.error or "")


def test_the_run_that_passes_its_event_cap_is_told(client: Client, events_deps: loop.Deps) -> None:
    capped = dataclasses.replace(events_deps.settings, max_events=4)
    deps = dataclasses.replace(events_deps, events=Outbox(events_deps.events.log, capped))
    run_id = _run(client, deps, {"n": 6})
    assert loop.run(run_id, deps) == RunStatus.FAILED
    run = client.get(run_id)
    assert run is not None and "CAIRN_MAX_EVENTS=4" in (run.error or "")
    events = list(client.events(run_id, timeout=10))
    assert [e.data["i"] for e in events if e.kind == "progress"] == [0, 1, 2, 3]
    assert "dropped" in _kinds(events) and events[-1].kind == "run_ended"


def test_a_worker_that_lost_the_run_writes_no_event(
    settings: Settings, client: Client, events_deps: loop.Deps, leases: Leases
) -> None:
    run_id = _run(client, events_deps)
    lease = leases.acquire(run_id, 30)
    assert lease is not None
    outbox = events_deps.events
    assert outbox is not None
    from cairn.core.events import encode

    assert outbox.put(run_id, str(lease.token), encode("mine", {}), wait=True)
    lease.release()
    newer = leases.acquire(run_id, 30)
    assert newer is not None
    with pytest.raises(LeaseLost):
        outbox.put(run_id, str(lease.token), encode("zombie", {}), wait=True)
    assert outbox.put(run_id, str(newer.token), encode("owner", {}), wait=True)
    kinds = [Event.parse(i, b).kind for i, b in outbox.log.read(run_id)]
    assert kinds == ["mine", "owner"]


def test_an_attempt_cut_short_is_marked_abandoned_by_the_next(
    client: Client, events_deps: loop.Deps
) -> None:
    run_id = _run(client, events_deps)
    CRASH["armed"] = True
    with pytest.raises(Crash):
        loop.run(run_id, events_deps)
    assert loop.run(run_id, events_deps) == RunStatus.DONE
    events = list(client.events(run_id, timeout=10))
    cut = next(e for e in events if e.kind == "attempt_abandoned")
    first = events[0]
    assert (cut.data["cursor"], cut.data["visit"], cut.data["attempt"]) == (
        "talk",
        0,
        first.attempt,
    )
    assert cut.attempt > first.attempt
    # What a reader keeps once it drops the abandoned attempt: one clean run.
    kept = [
        e
        for e in events
        if (e.cursor, e.visit, e.attempt) != ("talk", 0, first.attempt)
        and e.kind not in ("attempt_abandoned", "resumed")
    ]
    assert [e.data["i"] for e in kept if e.kind == "progress"] == [0, 1, 2]
    assert _kinds(events).index("resumed") == _kinds(events).index("attempt_abandoned") + 1


def test_after_redis_lost_the_stream_a_reader_gets_the_durable_record(
    settings: Settings, client: Client, events_deps: loop.Deps
) -> None:
    run_id = _run(client, events_deps)
    assert loop.run(run_id, events_deps) == RunStatus.DONE
    seen = list(client.events(run_id, timeout=10))
    redis.Redis.from_url(settings.redis_url).delete(keys.events(run_id))
    rebuilt = list(client.events(run_id, after=seen[2].id, timeout=10))
    assert rebuilt[0].kind == "gap" and "lost" in rebuilt[0].data["reason"]
    assert all(e.durable for e in rebuilt[1:])
    assert _kinds(rebuilt[1:]) == ["message", "step_saved", "step_saved", "run_ended"]
    assert rebuilt[1].data["text"] == "four words come back"


def test_a_reader_behind_a_trimmed_stream_gets_a_gap_then_the_record(
    settings: Settings, client: Client, events_deps: loop.Deps
) -> None:
    short = dataclasses.replace(events_deps.settings, events_maxlen=1)
    deps = dataclasses.replace(events_deps, events=Outbox(events_deps.events.log, short))
    run_id = _run(client, deps, {"n": 400})  # MAXLEN ~ trims whole nodes of 100 entries
    assert loop.run(run_id, deps) == RunStatus.DONE
    events = list(client.events(run_id, timeout=10))
    assert events[0].kind == "gap" and "trimmed" in events[0].data["reason"]
    assert events[-1].kind == "run_ended" and events[-1].data["status"] == "done"
    assert "message" in _kinds(events)


def test_an_unknown_run_has_no_events(client: Client) -> None:
    with pytest.raises(cairn.UnknownRun):
        next(iter(client.events("no-such-run", timeout=1)))


streamed = workflow("events_streamed")


@streamed.step()
def ask(ctx: Context) -> StepResult:
    reply = ctx.model(stream=True, messages=[{"role": "user", "content": ctx.input["prompt"]}])
    if CRASH["armed"]:  # the answer is journaled; the step dies before its save
        CRASH["armed"] = False
        raise Crash
    return StepResult(cursor=cairn.DONE, state={"answer": reply.content[0].text})


def test_a_streamed_answer_arrives_token_by_token_and_whole_after_a_crash(
    client: Client, events_deps: loop.Deps, model: Any
) -> None:
    run_id = f"ev-{uuid.uuid4().hex[:10]}"
    words = " ".join(f"w{i}" for i in range(12))
    prompt = f"REPLY: {words}\nTOKEN_MS: 15"  # paced as a model writes: a delta an event
    client.store.create_run(run_id, "events_streamed", {"prompt": prompt})
    CRASH["armed"] = True
    with pytest.raises(Crash):
        loop.run(run_id, events_deps)
    assert loop.run(run_id, events_deps) == RunStatus.DONE
    events = list(client.events(run_id, timeout=10))
    tokens = [e for e in events if e.kind == "token"]
    assert len(tokens) >= 6 and "".join(e.data["text"] for e in tokens) == words
    first, again = [e for e in events if e.kind == "message"]
    assert first.data["text"] == again.data["text"] == words
    assert again.data["replayed"] and again.attempt > first.attempt
    assert model.stats()["requests"] == 1  # the replay asked nothing
    run = client.get(run_id)
    assert run is not None and run.cost_usd == pytest.approx(first.data["cost_usd"])


def test_a_batch_keeps_each_runs_order_across_fenced_and_unfenced_events() -> None:
    from cairn.workers.outbox import _Pending, _segments

    put = [
        ("a", "tok1", "g1"),
        ("a", "", "s2"),  # after a commit: no token, joins whatever call is open
        ("b", "tokb", "f1"),
        ("a", "tok1", "f3"),
        ("a", "tok2", "g4"),  # a new attempt of the same run in this process: a new call
        ("a", "", "s5"),
        ("b", "", "s2"),
    ]
    calls = _segments([_Pending(r, t, e, None) for r, t, e in put])
    assert [(ps[0].run_id, t, [p.event for p in ps]) for t, ps in calls] == [
        ("a", "tok1", ["g1", "s2", "f3"]),
        ("b", "tokb", ["f1", "s2"]),
        ("a", "tok2", ["g4", "s5"]),
    ]


def test_a_burst_of_deltas_joins_while_queued_and_keeps_its_place(
    settings: Settings, leases: Leases
) -> None:
    """Deltas that come faster than the outbox sends (a burst, Redis slow) become fewer
    token events, with the same text, never jumping over another event of the run."""
    from cairn.core.events import encode

    outbox = Outbox(RedisEvents(leases.client), settings, linger=0.05)
    lease = leases.acquire("burst", 30)
    assert lease is not None
    token, where = str(lease.token), (0, "ask", 0, lease.epoch, 0)
    for word in ("a ", "b ", "c "):
        outbox.put_token("burst", token, word, where)
    outbox.put("burst", token, encode("progress", {"n": 1}))
    outbox.put_token("burst", token, "d", where)
    outbox.put_token("burst", token, "e", (1, "ask", 0, lease.epoch, 0))  # another call
    outbox.flush()
    got = [(e.kind, e.data) for e in (Event.parse(*x) for x in outbox.log.read("burst"))]
    assert got == [
        ("token", {"call": 0, "text": "a b c "}),
        ("progress", {"n": 1}),
        ("token", {"call": 0, "text": "d"}),
        ("token", {"call": 1, "text": "e"}),
    ]


def test_the_outbox_thread_outlives_a_bug_in_a_batchs_answer(
    settings: Settings, leases: Leases
) -> None:
    """One batch whose handling raises (here the log answers for fewer events than it got)
    fails its waiters with the error; the thread goes on and the next event is written."""
    from cairn.core.events import encode

    class Short(RedisEvents):
        broken = True

        def append(self, calls, **kw):  # type: ignore[no-untyped-def]
            answers = super().append(calls, **kw)
            if self.broken:
                self.broken = False
                return [ids[:-1] for ids in answers]
            return answers

    outbox = Outbox(Short(leases.client), settings)
    lease = leases.acquire("bug", 30)
    assert lease is not None
    token = str(lease.token)
    with pytest.raises(ValueError):
        outbox.put("bug", token, encode("progress", {"n": 1}), wait=True)
    event_id = outbox.put("bug", token, encode("progress", {"n": 2}), wait=True)
    assert event_id is not None
    assert [Event.parse(*x).data for x in outbox.log.read("bug")][-1] == {"n": 2}


class _DieAfterCommit(cairn.Middleware):
    """A worker gone right after a step's commit, before the events that announce it
    (the middleware's after_step runs between the two)."""

    def __init__(self, cursor: str) -> None:
        self.cursor = cursor

    def after_step(self, cp, *, saved, exception, seconds):  # type: ignore[no-untyped-def]
        if saved is not None and cp.cursor == self.cursor:
            self.cursor = ""
            raise Crash


def _saved_in_stream(events: list[Event]) -> list[tuple[Any, ...]]:
    return sorted((e.seq, e.cursor, e.visit, e.attempt) for e in events if e.kind == "step_saved")


def _saved_in_history(client: Client, run_id: str) -> list[tuple[Any, ...]]:
    return sorted(
        (h.seq, h.cursor, h.visit, h.epoch) for h in client.history(run_id) if h.outcome == "saved"
    )


def test_a_step_saved_just_before_its_worker_died_is_told_late_never_abandoned(
    client: Client, events_deps: loop.Deps
) -> None:
    """Killed between the commit of `talk` and its step_saved: the worker that takes the
    run over tells the stream what history says (a late step_saved), not that the attempt
    was abandoned; a reader following the live-output guide keeps its answer."""
    dying = dataclasses.replace(events_deps, middleware=Chain(
        [_DieAfterCommit("talk")]
    ))  # fmt: skip
    run_id = _run(client, dying)
    with pytest.raises(Crash):
        loop.run(run_id, dying)
    assert loop.run(run_id, events_deps) == RunStatus.DONE
    events = list(client.events(run_id, timeout=10))
    assert "attempt_abandoned" not in _kinds(events)
    assert _saved_in_stream(events) == _saved_in_history(client, run_id)
    late = next(e for e in events if e.kind == "step_saved")
    assert late.cursor == "talk" and late.data == {"next": "end", "status": "running", "late": True}
    # The attempt's own events stand: its progress and its answer come before it, once.
    before = _kinds(events)[: _kinds(events).index("step_saved")]
    assert before == ["step_started", "progress", "progress", "progress", "message"]
    assert _kinds(events)[-3:] == ["finished", "step_saved", "run_ended"]


def test_the_last_step_saved_before_its_worker_died_is_told_with_the_runs_end(
    client: Client, events_deps: loop.Deps
) -> None:
    """Killed between the run's last commit and its events: nothing resumes the run (it
    is done), but its message comes again (the broker's redelivery) and that delivery
    tells the stream: the late step_saved and run_ended."""
    dying = dataclasses.replace(events_deps, middleware=Chain([_DieAfterCommit("end")]))
    run_id = _run(client, dying)
    with pytest.raises(Crash):
        loop.run(run_id, dying)
    assert loop.run(run_id, events_deps) == RunStatus.DONE  # the redelivery
    events = list(client.events(run_id, timeout=10))
    assert _saved_in_stream(events) == _saved_in_history(client, run_id)
    assert _kinds(events)[-2:] == ["step_saved", "run_ended"]
    assert events[-1].data["late"] and not events[-1].durable  # in the stream itself
    assert "attempt_abandoned" not in _kinds(events)


def test_a_finished_run_read_from_its_start_has_no_gap(
    client: Client, events_deps: loop.Deps
) -> None:
    """The stream's first entry says it began with the run (its origin), so a reader from
    the start is served by the stream, whatever the clocks of Postgres and Redis say."""
    run_id = _run(client, events_deps)
    assert loop.run(run_id, events_deps) == RunStatus.DONE
    for after in (None, "0", "0-0"):
        events = list(client.events(run_id, after=after, timeout=10))
        assert events[0].kind == "step_started" and not events[0].durable
        assert len({e.id for e in events}) == len(events) == 9


class _LoseStream(cairn.Middleware):
    """Redis loses the run's stream after its first step (a restart without persistence)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def after_step(self, cp, *, saved, exception, seconds):  # type: ignore[no-untyped-def]
        if saved is not None and cp.cursor == "talk":
            redis.Redis.from_url(self.url).delete(keys.events(cp.run_id))


def test_a_stream_started_again_mid_run_gives_a_reader_from_the_start_a_gap_and_ids(
    settings: Settings, client: Client, events_deps: loop.Deps
) -> None:
    """Redis lost the stream after step one: a reader from the start learns it (the new
    stream's first entry is no origin), gets the durable record with an id per event, and
    a reader that reconnects with any of those ids gets exactly the rest."""
    losing = dataclasses.replace(events_deps, middleware=Chain(
        [_LoseStream(settings.redis_url)]
    ))  # fmt: skip
    run_id = _run(client, losing)
    events_deps.events.flush()  # type: ignore[union-attr]
    assert loop.run(run_id, losing) == RunStatus.DONE
    losing.events.flush()  # type: ignore[union-attr]
    events = list(client.events(run_id, timeout=10))
    assert events[0].kind == "gap" and "beginning" in events[0].data["reason"]
    told = [e for e in events if e.id.partition("~")[2]]
    assert told[0] is events[0] and _kinds(told[1:]) == [
        "message",
        "step_saved",
        "step_saved",
        "run_ended",
    ]
    assert len({e.id for e in events}) == len(events)
    for i in range(len(events) - 1):
        rest = list(client.events(run_id, after=events[i].id, timeout=10))
        assert [e.id for e in rest] == [e.id for e in events[i + 1 :]], events[i].id
    assert list(client.events(run_id, after=events[-1].id, timeout=10)) == []
