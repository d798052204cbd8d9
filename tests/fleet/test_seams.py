"""Where a new part meets a kill or a pause at a narrow moment, on real worker processes:

- a worker paused (SIGSTOP) inside CairnSaver's put, between its INSERT and its COMMIT,
  past its lease: the claim of the worker that takes the run over waits for the put (or
  the server ends the paused transaction after its hold), so the LangGraph thread never
  forks and no node runs twice; the moment is held open by a trigger on the test's own
  database that waits on an advisory lock the test holds;
- a worker SIGKILLed between a step's commit and the events that announce it: the stream
  it leaves, once the run is taken over (or delivered again, for its last step), has a
  `step_saved` for exactly the saved rows of the step history, and no saved attempt is
  called abandoned.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cairn.client.client import Client
from cairn.testing import fleet
from cairn.testing.standins import MailServer
from tests.helpers.runs import wait_for
from tests.helpers.services import LEASE_TTL

HELD = 4343  # the advisory lock the put's INSERT waits on, held by the test
FLOWS = {"CAIRN_WORKFLOWS": "tests.helpers.seam_flows"}


@pytest.fixture
def admin(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the test's database straight, not through PgBouncer."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield conn


def _hold_the_put_after(admin: psycopg.Connection[Any], step: int) -> None:
    """The first INSERT of a checkpoint of LangGraph step `step` waits, inside its
    statement (its fence taken), until the test lets go of the advisory lock HELD."""
    admin.execute(
        f"""
        CREATE SEQUENCE seam_gate;
        CREATE FUNCTION seam_hold() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.metadata ->> 'step' = '{step}' THEN
            IF nextval('seam_gate') = 1 THEN
              PERFORM pg_advisory_xact_lock_shared({HELD});
            END IF;
          END IF;
          RETURN NEW;
        END $$;
        CREATE TRIGGER seam_hold BEFORE INSERT ON graph_checkpoints
           FOR EACH ROW EXECUTE FUNCTION seam_hold();
        """
    )
    admin.execute("SELECT pg_advisory_lock(%s)", (HELD,))


def _waiting(admin: psycopg.Connection[Any], what: str) -> bool:
    """A session waits for a lock while running a statement like `what`."""
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND query LIKE %s",
        (what,),
    ).fetchone()
    return bool(row and row[0])


def _steps_past(admin: psycopg.Connection[Any], run_id: str, step: int) -> bool:
    row = admin.execute(
        "SELECT count(*) FROM graph_checkpoints WHERE thread_id = %s"
        " AND (metadata ->> 'step')::int >= %s",
        (run_id, step),
    ).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("resumed", ["after_its_hold", "before_its_hold"])
@pytest.mark.parametrize("graph", ["lg_mail", "lg_mail_list"])
def test_a_zombie_paused_inside_a_langgraph_put_neither_forks_the_thread_nor_runs_a_node_twice(
    start_worker: Callable[..., fleet.Proc],
    start_beat: Callable[[], fleet.Proc],
    client: Client,
    admin: psycopg.Connection[Any],
    mail: MailServer,
    tmp_path: Path,
    graph: str,
    resumed: str,
) -> None:
    """A is paused with the checkpoint after `draft` half written (its INSERT done, its
    COMMIT not). B takes the run over: its claim waits for A's put. Then either A stays
    paused past its put's hold (the server ends A's transaction, B goes on from the
    checkpoint before; A, resumed, is refused), or A resumes first (its put lands before
    B's claim; A learns it lost the run before running another node, and B goes on from
    A's checkpoint). Either way: one line of checkpoints, each node run once, one email."""
    _hold_the_put_after(admin, step=1)
    log = tmp_path / "nodes.log"
    a = start_worker(concurrency=1, **FLOWS)
    data: dict[str, Any] = {"to": "ada@example.com", "log": str(log)}
    if graph == "lg_mail_list":
        data["notes"] = []
    run_id = client.enqueue(graph, data)
    wait_for(lambda: _waiting(admin, "%INSERT INTO graph_checkpoints%"), 30, "A inside its put")
    a.signal_all(signal.SIGSTOP)
    try:
        start_worker(concurrency=1, **FLOWS)
        start_beat()  # its reaper sends the run again once A's lease has expired
        # B's claim waits for A's put (or, were the put a plain read, B goes on past it).
        wait_for(
            lambda: _waiting(admin, "%UPDATE checkpoints%") or _steps_past(admin, run_id, 2),
            LEASE_TTL + 30,
            "B to take the run over",
        )
        admin.execute("SELECT pg_advisory_unlock(%s)", (HELD,))
        if resumed == "after_its_hold":
            done = client.wait(run_id, timeout=60)
            assert done.status == "done", done.error
        a.signal_all(signal.SIGCONT)
        done = client.wait(run_id, timeout=60)
        assert done.status == "done", done.error
        time.sleep(1.0)  # anything A would still do, it does now
    finally:
        a.signal_all(signal.SIGCONT)
    forks = admin.execute(
        "SELECT parent_id, count(*) FROM graph_checkpoints WHERE thread_id = %s"
        " GROUP BY parent_id HAVING count(*) > 1",
        (run_id,),
    ).fetchall()
    assert forks == []
    ran = Counter(line.split()[0] for line in log.read_text().splitlines())
    assert ran == {"draft": 1, "send": 1, "after": 1}
    assert mail.stats()["deliveries"] == 1
    run = client.get(run_id)
    assert run is not None and run.state["output"]["sent"].startswith(f"cairn:{run_id}:send:")


def _stream(client: Client, run_id: str) -> list[Any]:
    return list(client.events(run_id, timeout=1))


def _said(events: list[Any]) -> list[tuple[Any, ...]]:
    return sorted((e.seq, e.cursor, e.visit, e.attempt) for e in events if e.kind == "step_saved")


def _killing_after(cursor: str, tmp_path: Path, whole: bool) -> dict[str, str]:
    """A worker's environment that SIGKILLs it (with whole, its main process too) right
    after the commit of the save of `cursor`, before its events: once a run."""
    return {
        "CAIRN_MIDDLEWARE": "tests.helpers.seam_flows:KillAfterCommit",
        "CAIRN_TEST_KILL_AFTER": cursor,
        "CAIRN_TEST_KILL_DIR": str(tmp_path),
        "CAIRN_TEST_KILL_WHOLE": "1" if whole else "0",
    }


def _told_to_the_end(client: Client, run_id: str) -> list[Any]:
    """The run's stream, once it has been told the run's end."""
    wait_for(
        lambda: any(e.kind == "run_ended" and not e.durable for e in _stream(client, run_id)),
        LEASE_TTL + 30,
        "the stream to be told the run's end",
    )
    return list(client.events(run_id, timeout=20))


@pytest.mark.parametrize(
    ("cursor", "whole"), [("two", False), ("three", False), ("three", True)],
    ids=["two", "three", "three-whole-worker"],
)  # fmt: skip
def test_a_worker_killed_between_a_steps_commit_and_its_events_leaves_a_truthful_stream(
    start_worker: Callable[..., fleet.Proc],
    start_beat: Callable[[], fleet.Proc],
    client: Client,
    tmp_path: Path,
    cursor: str,
    whole: bool,
) -> None:
    """SIGKILL right after the save of `two` (the run resumes on the next process) or of
    `three` (the run is done; its message comes again, or, with the whole worker killed
    on the Redis broker where its message waits out a visibility timeout, the reaper
    finds the delivery that never let go of the run and sends it again): the stream's
    step_saved events are the history's saved rows, no saved attempt is called
    abandoned, and every step's answer is in the stream once it stands."""
    start_worker(concurrency=1, **_killing_after(cursor, tmp_path, whole), **FLOWS)
    run_id = client.enqueue("seam_stream", {})
    wait_for(lambda: (tmp_path / f"{run_id}.{cursor}").exists(), 60, "the kill")
    if whole:  # a worker to take the run again, and the reaper to send it
        start_worker(concurrency=1, **FLOWS)
        start_beat()
    done = client.wait(run_id, timeout=60)
    assert done.status == "done", done.error
    events = _told_to_the_end(client, run_id)
    saved = [h for h in client.history(run_id) if h.outcome == "saved"]
    assert _said(events) == sorted((h.seq, h.cursor, h.visit, h.epoch) for h in saved)
    abandoned = {(e.data["cursor"], e.data["visit"], e.data["attempt"]) for e in events
                 if e.kind == "attempt_abandoned"}  # fmt: skip
    assert not abandoned & {(h.cursor, h.visit, h.epoch) for h in saved}
    late = [e for e in events if e.kind == "step_saved" and e.data.get("late")]
    assert [e.cursor for e in late] == [cursor]
    assert events[-1].kind == "run_ended" and events[-1].data["status"] == "done"
    for step in ("one", "two", "three"):
        # Each answer stands in the stream: its tokens, or (where the kill cut them) the
        # journaled message the take-over told.
        said = f"{step} says four words"
        text = "".join(e.data["text"] for e in events if e.kind == "token" and e.cursor == step)
        whole = [e.data["text"] for e in events if e.kind == "message" and e.cursor == step]
        assert text == said or said in whole, (step, text, whole)


def test_a_run_cancelled_after_its_worker_died_between_a_commit_and_its_events_tells_both(
    start_worker: Callable[..., fleet.Proc],
    start_beat: Callable[[], fleet.Proc],
    client: Client,
    tmp_path: Path,
) -> None:
    """The whole worker SIGKILLed right after the save of `two`, before its events; the
    run is cancelled while no worker holds it; the delivery that finds it cancelled first
    tells the stream the save it was not told, then the cancel."""
    start_worker(concurrency=1, **_killing_after("two", tmp_path, whole=True), **FLOWS)
    run_id = client.enqueue("seam_stream", {})
    wait_for(lambda: (tmp_path / f"{run_id}.two").exists(), 60, "the kill")
    assert client.cancel(run_id, "customer left").status == "running"  # stops at its next turn
    start_worker(concurrency=1, **FLOWS)
    start_beat()  # the reaper sends the run the dead worker held
    done = client.wait(run_id, timeout=60)
    assert done.status == "cancelled", done.error
    events = _told_to_the_end(client, run_id)
    saved = [h for h in client.history(run_id) if h.outcome == "saved"]
    assert [h.cursor for h in saved] == ["one", "two"]
    assert _said(events) == sorted((h.seq, h.cursor, h.visit, h.epoch) for h in saved)
    assert [e.cursor for e in events if e.kind == "step_saved" and e.data.get("late")] == ["two"]
    assert events[-1].kind == "run_ended" and events[-1].data["status"] == "cancelled"
