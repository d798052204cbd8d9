"""`cairn worker --metrics-port`: the pool's step metrics, summed, on /metrics; the code
version it states (CAIRN_CODE_VERSION) on its runs, their steps and its metrics."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import httpx

from cairn.store import PgStore
from cairn.testing import fleet
from tests.helpers.runs import done, wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_worker_serves_step_and_run_metrics(
    worker_env, create, store: PgStore, tmp_path: Path
) -> None:
    port = _free_port()
    cmd = [sys.executable, "-m", "cairn.cli", "worker", "-c", "2", "-n", "m@%h"]
    env = {**worker_env, "CAIRN_CODE_VERSION": "fleet-1.0"}
    w = fleet.Proc([*cmd, "--metrics-port", str(port)], env, tmp_path / "m.log", "m")
    try:
        fleet.wait_ready(w)
        runs = [create("probe", {"log": str(tmp_path / f"{i}.log")}) for i in range(3)]
        for run_id in runs:
            done(store, run_id)

        def scraped() -> str | None:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            return text if 'cairn_runs_total{outcome="done"} 3.0' in text else None

        text = wait_for(scraped, 10, "the metrics of 3 runs")
        assert 'cairn_steps_total{step="mail",workflow="probe"} 3.0' in text
        assert 'cairn_step_seconds_count{workflow="probe"} 15.0' in text
        assert "cairn_model_cost_usd_total" in text
        # The version the worker stated: the runs it started, and on each of their steps.
        started = 'cairn_runs_started_total{code_version="fleet-1.0",workflow="probe"} 3.0'
        assert started in text
        for run_id in runs:
            run = store.get(run_id)
            assert run is not None and run.started_version == "fleet-1.0"
            assert {h["code_version"] for h in store.history(run_id)} == {"fleet-1.0"}
    finally:
        w.kill()
