"""`cairn worker --metrics-port`: the pool's step metrics, summed, on /metrics."""

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
    w = fleet.Proc([*cmd, "--metrics-port", str(port)], worker_env, tmp_path / "m.log", "m")
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
    finally:
        w.kill()
