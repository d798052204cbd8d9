"""Eight journaled calls side by side (tests/helpers/flows.py: fan_sync with ctx.parallel,
fan_async with asyncio.gather over ctx.acall) on real workers: SIGKILLed, and paused with
SIGSTOP past the lease, while the fast half is journaled and the slow half is out. After
the resume every call's result is its own, each call ran at most once more per kill that
cut it (the `ran` lines of the log, the mail stand-in's keyed sends), and the zombie's late
results never reach the journal."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from cairn.store import Leases, PgStore
from cairn.testing.standins import MailServer
from tests.helpers.runs import done, holder_pid, step_log, wait_for
from tests.helpers.services import LEASE_TTL

CURSOR = {"fan_sync": "fan", "fan_async": "afan"}
both_forms = pytest.mark.parametrize("flow", ["fan_sync", "fan_async"])


def _events(log: Path) -> list[tuple[int, str]]:
    """(pid, event) of every call's `sleep-i` and `ran-i` line."""
    return [(pid, e) for _, _, pid, e in step_log(log) if e.startswith(("ran-", "sleep-"))]


def _cut(store: PgStore, run_id: str, flow: str, log: Path) -> None:
    """Wait until the fast half is journaled and the slow half is asleep in its calls."""

    def there() -> bool:
        asleep = [e for _, e in _events(log) if e.startswith("sleep-")]
        return len(store.journal(run_id, CURSOR[flow], 0)) == 4 and len(asleep) == 4

    wait_for(there, 30, "four calls journaled, four asleep")


def _check_results(store: PgStore, run_id: str, flow: str, cut_pid: int) -> list[Any]:
    cp = store.load(run_id)
    assert cp is not None and cp.status == "done"
    results = cp.state["results"]
    for i, result in enumerate(results):  # each call's own result, in its own place
        assert result["i"] == i
        if i % 2 == 0:
            assert result["key"] == f"cairn:{run_id}:{CURSOR[flow]}:0:fetch:{i}"
        # The fast half was served from the journal; the slow half made by the new owner.
        assert (result["pid"] == cut_pid) == (i < 4)
    return results  # type: ignore[no-any-return]


@both_forms
def test_a_worker_killed_mid_parallel_makes_only_the_cut_calls_again(
    start_worker, create, store, leases: Leases, mail: MailServer, tmp_path, flow
) -> None:
    log = tmp_path / "steps.log"
    start_worker(concurrency=1)
    run_id = create(flow, {"log": str(log), "pause": 60})
    _cut(store, run_id, flow, log)
    pid = wait_for(lambda: holder_pid(leases, run_id), 10, "a lease holder")
    os.kill(pid, signal.SIGKILL)  # the pool child: its worker sends the run again
    done(store, run_id)
    _check_results(store, run_id, flow, pid)
    ran = [e for _, e in _events(log) if e.startswith("ran-")]
    assert sorted(ran) == [f"ran-{i}" for i in range(8)]  # none made twice
    stats = mail.stats()
    assert stats["deliveries"] == 4 and stats["attempts"] == 4


@both_forms
def test_a_worker_paused_mid_parallel_past_its_lease_has_its_late_results_refused(
    start_worker, start_beat, create, store, leases: Leases, mail: MailServer, tmp_path, flow
) -> None:
    log = tmp_path / "steps.log"
    a = start_worker(concurrency=1)
    run_id = create(flow, {"log": str(log), "pause": 2 * LEASE_TTL + 2})
    _cut(store, run_id, flow, log)
    zombie = wait_for(lambda: holder_pid(leases, run_id), 10, "a lease holder")
    a.signal_all(signal.SIGSTOP)
    start_worker(concurrency=1)
    start_beat()  # the reaper notices the expired lease and re-enqueues the run
    done(store, run_id, timeout=LEASE_TTL + 30)
    finished = store.load(run_id)
    journal = store.journal(run_id, CURSOR[flow], 0)
    _check_results(store, run_id, flow, zombie)
    a.signal_all(signal.SIGCONT)
    # Its slow calls wake: the even ones stop at the lease check before their send, the
    # odd ones return and the journal's fence refuses their records (it stays as it was).
    late = {f"ran-{i}" for i in range(4, 8)}
    wait_for(lambda: {e for p, e in _events(log) if p == zombie} >= late, 20, "the late calls")
    wait_for(lambda: "lease lost" in a.text(), 20, "the zombie to stop")
    time.sleep(1.0)
    assert store.load(run_id) == finished
    assert store.journal(run_id, CURSOR[flow], 0) == journal
    for i in range(8):  # at most once more per pause that cut it: the slow half only
        made = [p for p, e in _events(log) if e == f"ran-{i}"]
        assert len(made) == (1 if i < 4 else 2)
    stats = mail.stats()
    assert stats["deliveries"] == 4 and stats["attempts"] == 4  # the zombie sent nothing
