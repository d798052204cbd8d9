"""A worker paused inside a model call's wait between two tries, past its lease, sends no
further request once resumed: real Celery workers, SIGSTOPped inside each kind of wait
(a 429's retry-after, the fleet's rate limit, a back-off after a 503, the same inside a
ctx.call), held there until another worker has taken the run over and finished it, then
SIGCONTed. The model stand-in's request count, read before and after, says what the
paused worker sent after it woke: nothing. The run finishes once, by the other worker.

The moment: the line the worker's model client logs as a wait begins ("model call waits
...", cairn.steps.model), right before it sleeps; the test reads it from the worker's
log and pauses the worker within the wait (several seconds long). The integration twin,
every surface that makes model requests: tests/integration/test_fenced_tries.py.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from cairn.store import Leases, PgStore
from cairn.testing import fleet
from cairn.testing.standins import ModelServer
from tests.helpers.runs import done, holder_pid, wait_for
from tests.helpers.services import LEASE_TTL

WAIT = 2 * LEASE_TTL  # each wait: the pause starts inside it; the lease expires in it
RETRY_AFTER = {"fail_next": 1, "retry_after": WAIT}
# Each kind of wait: how the stand-in answers the first try, the workers' environment,
# the fenced_try input (tests/helpers/flows.py), and the requests the run takes in all
# (the paused worker's before its wait, and those of the worker that takes over).
KINDS: dict[str, tuple[dict[str, Any], dict[str, str], dict[str, Any], int]] = {
    # The 429's retry-after is booked fleet-wide and waited out as the next try's
    # admission (the limiter's sleep in ModelClient._try).
    "429": ({**RETRY_AFTER, "status": 429}, {}, {"how": "create"}, 2),
    # The fleet's own limit, a slot every WAIT seconds: the step's second call waits for
    # its slot (the same sleep); the worker that takes over waits rather than defers.
    "rate_limit": (
        {},
        {"CAIRN_MODEL_RPM": str(round(60 / WAIT)), "CAIRN_RATE_WAIT_MAX": "60"},
        {"how": "create", "calls": 2},
        2,
    ),
    # A 503 with a retry-after: the retry policy's back-off (tenacity's sleep).
    "503": ({**RETRY_AFTER, "status": 503}, {}, {"how": "create"}, 2),
    # The same back-off, of a model call inside a journaled ctx.call.
    "ctx.call": ({**RETRY_AFTER, "status": 503}, {}, {"how": "call"}, 2),
}


@pytest.mark.parametrize(
    ("kind", "pool"), [(kind, "prefork") for kind in KINDS] + [("503", "threads")]
)
def test_a_worker_paused_in_a_wait_between_tries_sends_nothing_once_resumed(
    start_worker: Callable[..., fleet.Proc],
    start_beat: Callable[[], fleet.Proc],
    create: Callable[..., str],
    store: PgStore,
    leases: Leases,
    model: ModelServer,
    kind: str,
    pool: str,
) -> None:
    control, env, data, requests = KINDS[kind]
    model.control(reset=True, **control)
    a = start_worker(concurrency=1, CAIRN_POOL=pool, **env)
    run_id = create("fenced_try", data)
    wait_for(lambda: "model call waits" in a.text(), 30, "A inside a wait between tries")
    a.signal_all(signal.SIGSTOP)  # within the wait: WAIT seconds long
    try:
        zombie = holder_pid(leases, run_id)
        start_worker(concurrency=1, CAIRN_POOL=pool, **env)
        start_beat()  # its reaper sends the run again once A's lease has expired
        done(store, run_id, timeout=LEASE_TTL + 60)
        sent = model.stats()["requests"]
        assert sent == requests, model.stats()  # A's before its wait, B's
        assert holder_pid(leases, run_id) != zombie
    finally:
        a.signal_all(signal.SIGCONT)
    # A wakes in its wait, past its end: its next try meets the fence, and its step stops.
    wait_for(lambda: f"run {run_id}: stopped," in a.text(), 20, "A to stop")
    time.sleep(0.5)  # anything A would still send, it sends now
    assert model.stats()["requests"] == sent  # none from A after SIGCONT
    assert f"run {run_id}: lease lost" in a.text()
    finished = store.load(run_id)
    assert finished is not None and finished.state["said"] == ["fenced"] * data.get("calls", 1)
    journal = store.journal(run_id, "ask", 0)
    calls = data.get("calls", 1)
    assert [c.name for c in journal] == ["tool" if kind == "ctx.call" else "model"] * calls
