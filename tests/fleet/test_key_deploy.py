"""A new payload key deployed while runs are in flight (docs/guides/encryption.md), on real
worker processes, in either order: the new key ring to the workers first, or to the API
(the Client) first. Each run takes a turn per signal, each turn a delivery any worker may
take, so old workers (the old ring alone) meet payloads sealed under the new key: they
hand those runs back, one line each, and a worker with the key goes on. Every run
finishes; none fails; the old worker logs no traceback, and `cairn worker --check` with
its ring fails naming the key it lacks."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cairn.client.client import Client
from cairn.core import sealing
from cairn.core.sealing import KeyRing, new_key
from cairn.testing import fleet
from tests.helpers.runs import wait_for

OLD = f"k1:{new_key()}"
NEW = f"k2:{new_key()},{OLD}"  # the new key first, the old one after it
FLOWS = {"CAIRN_WORKFLOWS": "tests.helpers.seal_flows"}
RUNS, TURNS = 8, 9


@pytest.fixture
def api_keys() -> Iterator[Callable[[str], None]]:
    """The Client's (the API's) key ring, switched as a deploy would switch it."""
    yield lambda spec: sealing.use(KeyRing(spec))
    sealing.use(None)


def _tick(client: Client, runs: list[str], turns: range) -> None:
    for i in turns:
        for run_id in runs:
            client.signal(run_id, "tick", {"i": i, "note": f"secret-{i}"}, signal_id=f"t{i}")


def _statuses(sql: Callable[..., list[tuple[Any, ...]]], runs: list[str]) -> dict[str, int]:
    # Status and seq are never sealed: readable whichever keys this process holds.
    rows = sql("SELECT status, count(*) FROM checkpoints WHERE run_id = ANY(%s) GROUP BY 1", runs)
    return {status: n for status, n in rows}


def _turns(sql: Callable[..., list[tuple[Any, ...]]], runs: list[str]) -> int:
    """Turns taken by the slowest run (its saves: the first save is its first turn)."""
    return int(sql("SELECT min(seq) FROM checkpoints WHERE run_id = ANY(%s)", runs)[0][0])


def _check(worker_env: dict[str, str], keys: str) -> subprocess.CompletedProcess[str]:
    env = {**worker_env, **FLOWS, "CAIRN_PAYLOAD_KEYS": keys}
    return subprocess.run(
        [sys.executable, "-m", "cairn.cli", "worker", "--check"],
        check=False, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("order", ["workers-first", "api-first"])
def test_a_key_deployed_in_either_order_finishes_every_run_in_flight(
    order: str,
    start_worker: Callable[..., fleet.Proc],
    start_beat: Callable[[], fleet.Proc],
    client: Client,
    api_keys: Callable[[str], None],
    sql: Callable[..., list[tuple[Any, ...]]],
    worker_env: dict[str, str],
) -> None:
    api_keys(OLD)
    old = start_worker(concurrency=2, CAIRN_PAYLOAD_KEYS=OLD, **FLOWS)
    start_beat()  # the reaper: a run whose message a stopped worker took is sent again
    runs = [client.enqueue("ticked", {"secret": f"s{n}", "turns": TURNS}) for n in range(RUNS)]
    _tick(client, runs, range(3))
    wait_for(lambda: _turns(sql, runs) >= 2, 60, "the runs' first turns")
    if order == "workers-first":
        new = start_worker(concurrency=2, CAIRN_PAYLOAD_KEYS=NEW, **FLOWS)
        _tick(client, runs, range(3, 6))  # both workers take turns: the old meets k2
        wait_for(lambda: _turns(sql, runs) >= 5, 90, "turns on both workers")
        api_keys(NEW)  # then the API
    else:
        api_keys(NEW)  # the API first: the old worker meets k2 in every signal from now
        _tick(client, runs, range(3, 6))
        wait_for(lambda: "lacks payload key 'k2'" in old.text(), 60, "a hand-back")
        lacking = _check(worker_env, OLD)
        assert lacking.returncode == 1, lacking.stdout + lacking.stderr
        assert "sealed under key 'k2', which CAIRN_PAYLOAD_KEYS lacks" in lacking.stderr
        assert "Traceback" not in lacking.stderr
        new = start_worker(concurrency=2, CAIRN_PAYLOAD_KEYS=NEW, **FLOWS)
        assert _check(worker_env, NEW).returncode == 0
    old.proc.send_signal(signal.SIGTERM)  # the old worker goes: its runs are handed back
    _tick(client, runs, range(6, TURNS))
    wait_for(lambda: _statuses(sql, runs).get("done") == RUNS, 120, "every run to finish")
    assert _statuses(sql, runs) == {"done": RUNS}  # none failed
    for run_id in runs:
        run = client.get(run_id)
        assert run is not None and run.state["seen"] == list(range(TURNS)), run.state
    handed = old.text().count("lacks payload key 'k2'")
    if order == "api-first":
        assert handed >= 1
    assert "Traceback" not in old.text()
    print(f"{order}: {RUNS} runs in flight, {RUNS} done, 0 failed, {handed} hand-backs")
    assert new.alive()
