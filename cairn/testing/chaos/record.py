"""What the runs left in Postgres and Redis, held against each other once every run
stopped: no LangGraph thread forked, and each run's live stream telling its steps as its
step history does.

* Forks: a run's graph thread (graph_checkpoints, thread_id = run_id, namespace '') is one
  chain: no checkpoint has two children, and the thread has one root. A worker that wrote
  after losing its run (a zombie's put) would leave a second child.
* Streams: the `step_saved` events of a run's stream name (seq, cursor, visit, attempt)
  exactly the steps its step history saved (seq, cursor, visit, epoch), each once; and no
  `attempt_abandoned` names an attempt whose step was saved. A kill between a commit and
  its events, or a pause past the lease, is where a stream could lie: the worker that
  takes the run over must tell the step late, and a zombie must not tell it again. That
  can come after the run is done in Postgres (a stopped run's message redelivered), so a
  stream that does not match yet is read again for a while (GRACE).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from cairn.store import admin

if TYPE_CHECKING:
    from cairn.core.events import Event
    from cairn.store.events import RedisEvents

# Seconds the stream check waits for late events (a redelivered message's) once every run
# stopped. A pool child's message comes back within a few seconds of its death (Celery's
# parent notices it 0.1-4 s later, measured under chaos on 2 cores).
GRACE = 10.0

# (seq, cursor, visit, attempt): a step attempt as a history row or an event names it (an
# event's fields may be None)
Step = tuple[Any, Any, Any, Any]

FORKS_SQL = """
SELECT g.thread_id, g.parent_id, count(*) AS children
  FROM graph_checkpoints g JOIN runs r ON r.run_id = g.thread_id
 WHERE g.ns = ''
 GROUP BY g.thread_id, g.parent_id HAVING count(*) > 1
 ORDER BY g.thread_id
"""
THREADS_SQL = """
SELECT count(DISTINCT g.thread_id) AS n
  FROM graph_checkpoints g JOIN runs r ON r.run_id = g.thread_id WHERE g.ns = ''
"""
SAVED_SQL = """
SELECT run_id, seq, cursor, visit, epoch FROM step_history WHERE outcome = 'saved'
"""


def forks(url: str) -> tuple[dict[str, Any], list[str]]:
    """The report's graph section (threads, forks) and a problem per forked parent (a
    second root counts as a fork of the thread's start)."""
    rows = admin.execute(url, FORKS_SQL)
    threads = int(admin.execute(url, THREADS_SQL)[0]["n"])
    problems = [
        f"run {r['thread_id']}: graph checkpoint {r['parent_id'] or '(the root)'} has "
        f"{r['children']} children: the thread forked"
        for r in rows
    ]
    return {"threads": threads, "forks": len(rows)}, problems


def compare(saved: Iterable[Step], events: Iterable[Event]) -> list[str]:
    """What a run's stream gets wrong about its saved steps (empty: it tells the truth)."""
    history = set(saved)
    attempts = {(step[1], step[2], step[3]): step for step in history}  # by (cursor, visit, epoch)
    told: Counter[Step] = Counter()
    abandoned: list[Step] = []
    for e in events:
        if e.kind == "step_saved":
            told[(e.seq, e.cursor, e.visit, e.attempt)] += 1
        elif e.kind == "attempt_abandoned" and isinstance(e.data, dict):
            where = (e.data.get("cursor"), e.data.get("visit"), e.data.get("attempt"))
            if where in attempts:
                abandoned.append(attempts[where])
    problems = [f"no step_saved for {_step(s)}" for s in _sorted(history - told.keys())]
    problems += [f"step_saved for {_step(s)}, not saved" for s in _sorted(told.keys() - history)]
    problems += [f"step_saved {n} times for {_step(s)}" for s, n in told.items() if n > 1]
    problems += [f"attempt_abandoned for saved {_step(s)}" for s in abandoned]
    return problems


def _sorted(steps: Iterable[Step]) -> list[Step]:
    return sorted(steps, key=repr)  # an event's fields may be None


def _step(s: Step) -> str:
    return f"seq {s[0]} {s[1]!r} visit {s[2]} attempt {s[3]}"


def read_stream(log: RedisEvents, run_id: str) -> list[Event] | None:
    """The run's whole stream, oldest first; None if it is gone or was trimmed (then it
    cannot be held against the history)."""
    from cairn.core.events import Event

    info = log.info(run_id)
    if info is None or info.trimmed:
        return None
    out: list[Event] = []
    after = "0-0"
    while page := log.read(run_id, after, count=1000):
        out += [Event.parse(i, blob) for i, blob in page]
        after = page[-1][0]
    return out


def streams(
    url: str, redis_url: str, grace: float = GRACE
) -> tuple[dict[str, Any], list[str], list[str]]:
    """Every run's stream against its step history: the report's stream section, a
    problem per mismatching run (a few, then how many more), and a note for the streams
    that are gone (not checked).

    A stream is told late after a kill between a commit and its events: by the worker the
    message is redelivered to, which may come after the run is done in Postgres. So the
    runs that do not match yet are looked at again, for up to `grace` seconds."""
    from cairn.store.events import RedisEvents

    run_ids = [r["run_id"] for r in admin.execute(url, "SELECT run_id FROM runs ORDER BY run_id")]
    log = RedisEvents.from_url(redis_url, max_connections=2)
    seen: dict[str, tuple[list[Event] | None, list[str]]] = {}
    began = time.monotonic()
    pending = run_ids
    try:
        while True:
            saved = _saved(url)
            for run_id in pending:
                events = read_stream(log, run_id)
                found = [] if events is None else compare(saved.get(run_id, ()), events)
                seen[run_id] = (events, found)
            pending = [r for r in pending if seen[r][1]]
            if not pending or time.monotonic() - began >= grace:
                break
            time.sleep(0.5)
    finally:
        log.close()
    waited = round(time.monotonic() - began, 1)
    wrong = {r: seen[r][1] for r in pending}
    gone = [r for r in run_ids if seen[r][0] is None]
    told = [e for events, _ in seen.values() for e in events or ()]
    problems = [
        f"run {run_id}'s stream does not match its step history after {waited:g}s: "
        + "; ".join(found[:3])
        for run_id, found in list(wrong.items())[:5]
    ]
    if len(wrong) > 5:
        problems.append(f"... and {len(wrong) - 5} more runs whose stream does not match")
    notes = (
        [f"{len(gone)} run(s) had no whole stream to check (gone or trimmed; e.g. {gone[0]})"]
        if gone
        else []
    )
    section = {
        "runs": len(run_ids) - len(gone),
        "mismatches": len(wrong),
        "gone": len(gone),
        "late_step_saved": sum(
            1
            for e in told
            if e.kind == "step_saved" and isinstance(e.data, dict) and e.data.get("late")
        ),
        "abandoned": sum(1 for e in told if e.kind == "attempt_abandoned"),
        "waited": waited,  # seconds until every stream matched (or the grace ran out)
    }
    return section, problems, notes


def _saved(url: str) -> dict[str, set[Step]]:
    saved: dict[str, set[Step]] = defaultdict(set)
    for r in admin.execute(url, SAVED_SQL):
        saved[r["run_id"]].add((r["seq"], r["cursor"], r["visit"], r["epoch"]))
    return saved
