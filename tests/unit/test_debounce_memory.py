"""Debounced enqueues on the in-memory twin, as a user's test drives them: a Client on a
LocalWorker's MemoryStore, a ManualClock moved past the quiet period, one run started with
the latest input. Postgres, racing processes and killed passes: tests/integration and
tests/fleet's test_debounce.py."""

from __future__ import annotations

import cairn
from cairn.core.status import RunStatus
from cairn.testing import LocalWorker, ManualClock

echo = cairn.workflow("debounce-echo")


@echo.step()
def said(ctx: cairn.Context) -> cairn.StepResult:
    return cairn.StepResult(cursor="done", state={"input": dict(ctx.input)})


def test_a_burst_on_a_local_worker_is_one_run_with_the_latest_input() -> None:
    clock = ManualClock()
    worker = LocalWorker(clock=clock)
    with cairn.Client(store=worker.store, send=worker.send) as client:

        def enqueue(n: int) -> str:
            return client.enqueue(
                "debounce-echo", {"n": n}, debounce_key="k", debounce=5, max_wait=60
            )

        run_id = enqueue(1)
        for n in (2, 3):
            clock.advance(4)
            assert enqueue(n) == run_id
            assert worker.run_until_idle() == 0  # never within the quiet period
        clock.advance(5.1)
        assert worker.run_until_idle() == 1
        run = client.get(run_id)
        assert run is not None and run.status == RunStatus.DONE
        assert run.state == {"input": {"n": 3}} and run.resumes == 0
        assert enqueue(4) != run_id  # started: the key's next burst is a new run
