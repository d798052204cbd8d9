"""Steering on real workers: a message sent while the run's process is SIGKILLed is
delivered once (the replay reads what the journal says each turn got, and the message
comes at the first read the journal lacks), in order with the others."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from cairn.client.client import Client
from cairn.store import Leases
from cairn.testing import fleet
from cairn.testing.standins.model import ModelServer
from tests.helpers.runs import holder_pid, wait_for

FLOWS = {"CAIRN_WORKFLOWS": "tests.helpers.steer_flows"}
SLOW = 20.0  # seconds the model stand-in takes to answer a call nobody cuts


def _delivered(db_url: str, run_id: str) -> list[Any]:
    """The messages the run's journal says its reads got (their numbers), in order."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT s.message FROM journal j"
            " CROSS JOIN LATERAL jsonb_array_elements(j.result) WITH ORDINALITY AS r (n, k)"
            " JOIN steer_messages s ON s.run_id = j.run_id AND s.n = (r.n #>> '{}')::bigint"
            " WHERE j.run_id = %s AND j.name = 'cairn.messages' ORDER BY j.visit, j.pos, r.k",
            (run_id,),
        ).fetchall()
    return [message for (message,) in rows]


def test_a_message_sent_while_the_run_is_killed_is_delivered_once(
    start_worker: Callable[..., fleet.Proc], client: Client, leases: Leases, db_url: str
) -> None:
    start_worker(concurrency=1, **FLOWS)
    run_id = client.enqueue("steered_chat", {})
    assert client.steer(run_id, "one") == 1
    wait_for(lambda: "one" in _delivered(db_url, run_id), 30, "the first message read")

    # SIGKILL the process in the step (a prefork child: its worker sends the run again)
    # while another thread sends the next message.
    pid = wait_for(lambda: holder_pid(leases, run_id), 10, "the run's process")
    sent = threading.Thread(target=lambda: client.steer(run_id, "two"))
    sent.start()
    os.kill(pid, signal.SIGKILL)
    sent.join()
    wait_for(lambda: (holder_pid(leases, run_id) or pid) != pid, 60, "the run taken again")
    assert client.steer(run_id, "three") == 3
    wait_for(lambda: "three" in _delivered(db_url, run_id), 30, "the third message read")
    assert client.steer(run_id, "stop") == 4

    run = client.wait(run_id, timeout=60)
    assert run.status == "done", run.error
    got = [m for turn in run.state["got"] for m in turn]
    assert got == ["one", "two", "three", "stop"]  # each once, in order
    assert _delivered(db_url, run_id) == got
    assert client.get(run_id).resumes >= 1  # the kill did cut the step


def test_an_interrupting_message_cuts_the_model_call_once_even_across_a_kill(
    start_worker: Callable[..., fleet.Proc],
    client: Client,
    leases: Leases,
    db_url: str,
    model: ModelServer,
) -> None:
    """A message sent with interrupt=True cuts the model call in flight at once (the
    stand-in would answer after SLOW seconds); the cut is journaled, so the replay after a
    SIGKILL of the run's process raises it again without asking the model again."""
    model.control(delay_ms=int(SLOW * 1000))
    start_worker(concurrency=1, **FLOWS)
    run_id = client.enqueue("cut_chat", {})
    wait_for(lambda: model.stats()["requests"] == 1, 30, "the first model call")

    sent = time.monotonic()
    client.steer(run_id, "turn left", interrupt=True)
    wait_for(lambda: "turn left" in _delivered(db_url, run_id), SLOW, "the cutting message read")
    assert time.monotonic() - sent < SLOW / 3  # cut, not answered
    wait_for(lambda: model.stats()["requests"] == 2, 30, "the next turn's model call")

    # SIGKILL the run's process inside the second call; the next one replays the first
    # turns from the journal (the cut raised again, not asked again) and asks once more.
    pid = wait_for(lambda: holder_pid(leases, run_id), 10, "the run's process")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: model.stats()["requests"] == 3, 60, "the replay's model call")
    client.steer(run_id, "stop", interrupt=True)

    run = client.wait(run_id, timeout=SLOW)
    assert run.status == "done", run.error
    assert run.state["got"] == [[], ["cut"], ["turn left"], ["cut"], ["stop"]]
    assert model.stats()["requests"] == 3
    cuts = [c for c in client.calls(run_id) if c.error and c.error["type"] == "CallInterrupted"]
    assert [c.pos for c in cuts] == [1, 3]
    assert all(c.cost_usd > 0 for c in cuts)  # each counts its worst case
