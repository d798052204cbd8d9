"""The deploy files' health check against a real worker."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

from cairn.testing import fleet
from tests.helpers.runs import wait_for
from tests.helpers.services import ROOT, both_brokers

BIN = Path(sys.executable).parent
DOCKERFILE = (ROOT / "deploy" / "Dockerfile").read_text()


@both_brokers
def test_the_health_check_answers_for_a_live_worker_and_not_for_another_name(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    """The image's HEALTHCHECK, run as written against `cairn worker --name cairn@%h`."""
    check = json.loads(re.search(r"HEALTHCHECK .*?\n\s+CMD (\[.*\])", DOCKERFILE).group(1))
    env = {**worker_env, "PATH": f"{BIN}:/usr/bin:/bin", "HOSTNAME": socket.gethostname()}
    worker = fleet.Proc(
        [str(BIN / "cairn"), "worker", "--name", "cairn@%h", "--concurrency", "1"],
        env, tmp_path / "worker.log", "health",
    )  # fmt: skip
    try:
        wait_for(lambda: "ready." in worker.text() or not worker.alive(), 60, "the worker")
        assert worker.alive(), worker.text()[-2000:]
        alive = subprocess.run(
            check, env=env, capture_output=True, text=True, timeout=30, check=False
        )
        assert alive.returncode == 0, alive.stdout + alive.stderr
        # Another node name gets no answer (a shorter wait than the image's 10 s).
        other = [*check[:2], check[2].replace("--timeout 10", "--timeout 1")]
        gone = subprocess.run(
            other,
            env={**env, "HOSTNAME": "elsewhere"},
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert gone.returncode != 0
    finally:
        worker.kill()
