"""Steering on real workers: a message sent while the run's process is SIGKILLed is
delivered once (the replay reads what the journal says each turn got, and the message
comes at the first read the journal lacks), in order with the others."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from cairn.client.client import Client
from cairn.store import Leases
from cairn.testing import fleet
from tests.helpers.runs import holder_pid, wait_for

FLOWS = {"CAIRN_WORKFLOWS": "tests.helpers.steer_flows"}


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
