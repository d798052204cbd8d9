"""A version bump with real workers: runs pinned to v1 finish on v1 while v2 takes the new
runs, v1 drained; a v1 worker killed mid-step, and one started again with `cairn worker
--drain`, takes its run back (the reaper sends it to v1's queue)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cairn.client.client import Client
from cairn.core.status import RunStatus
from cairn.testing import fleet
from cairn.workers import broker
from tests.helpers.runs import wait_for
from tests.helpers.services import ROOT

BIN = Path(sys.executable).parent


def _cairn(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cairn.cli", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _done(client: Client, run_id: str, timeout: float = 30) -> Any:
    """The run once done (Client.wait returns a waiting run too)."""
    wait_for(lambda: client.get(run_id).status == RunStatus.DONE, timeout, f"{run_id} done")
    return client.get(run_id)


def _versions(client: Client, run_id: str) -> list[str | None]:
    return [s.code_version for s in client.history(run_id)]


def test_pinned_runs_finish_on_their_version_through_a_drain_and_a_kill(
    worker_env: dict[str, str],
    start_worker: Any,
    start_beat: Any,
    client: Client,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    env = {**worker_env, "CAIRN_WORKFLOWS": "tests.helpers.pin_flows"}
    v1 = {**env, "CAIRN_CODE_VERSION": "v1"}
    start_beat()
    old = start_worker(**v1)
    marker = tmp_path / "work-started"
    calm = client.enqueue("pin_fleet", {})
    killed = client.enqueue("pin_fleet", {"marker": str(marker)})
    for run_id in (calm, killed):
        wait_for(lambda r=run_id: client.get(r).status == RunStatus.WAITING, 30, "v1 to start it")

    # The deploy: v2 boots while v1 is drained (it takes nothing new, keeps its queue).
    new = fleet.spawn_worker({**env, "CAIRN_CODE_VERSION": "v2"}, tmp_path / "v2.log", "v2")
    request.addfinalizer(new.kill)
    drained = _cairn(env, "deploy", "drain", "v1")
    assert drained.returncode == 0, drained.stderr
    assert "draining 1 worker(s) of version v1" in drained.stdout
    assert "2 run(s) pinned to version v1 still under way" in drained.stdout
    fleet.wait_ready(new)
    new_pinned = client.enqueue("pin_fleet", {})
    assert client.wait(client.enqueue("pin_fleet_upgraded", {}), 30).state == {"by": "v2"}
    wait_for(lambda: client.get(new_pinned).status == RunStatus.WAITING, 30, "v2 to start it")
    assert client.get(new_pinned).started_version == "v2"

    # The signals go to the shared queues, which v2 alone consumes now: v2 sends the run
    # pinned to v1 to v1's queue, and v1 finishes it.
    for run_id in (calm, new_pinned):
        client.signal(run_id, "go")
    assert _done(client, calm).state == {"by": "v1"}
    assert _done(client, new_pinned).state == {"by": "v2"}
    assert _versions(client, calm) == ["v1", "v1"]

    # v1 is killed whole in the middle of a step; a v1 worker started again, drained
    # (its version's queue alone), gets the run from the reaper, on that queue.
    client.signal(killed, "go")
    wait_for(marker.exists, 30, "v1 to begin the step")
    assert marker.read_text() == "v1"
    old.kill()
    again = fleet.Proc(
        [str(BIN / "cairn"), "worker", "--drain", "--name", "v1-again@%h", "--concurrency", "1"],
        {**v1, "PATH": f"{BIN}:/usr/bin:/bin"}, tmp_path / "v1-again.log", "v1-again",
    )  # fmt: skip
    request.addfinalizer(again.kill)
    fleet.wait_ready(again)
    # Its banner's queues: the control queue and v1's own, none of the shared ones.
    consumed = set(re.findall(r"^\s+\.> (\S+)\s+exchange=", again.text(), re.MULTILINE))
    assert consumed == {broker.CONTROL, broker.pinned_queue("v1")}
    assert _done(client, killed, 60).state == {"by": "v1"}
    assert _versions(client, killed) == ["v1", "v1"]

    status = _cairn(env, "deploy", "status", "--json")
    assert status.returncode == 0, status.stderr
    versions = {v["version"]: v for v in json.loads(status.stdout)["versions"]}
    assert versions["v1"]["pinned"] == versions["v2"]["pinned"] == 0
    # The killed worker stays listed until it has missed three beats (15 s).
    assert any(w.startswith("v1-again@") for w in versions["v1"]["workers"])
    assert [w.split("@")[0] for w in versions["v2"]["workers"]] == ["v2"]
    done = _cairn(env, "deploy", "drain", "v1", "--wait", "5")
    assert "version v1 drained: no pinned run left; stop its workers" in done.stdout
