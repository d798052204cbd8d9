"""A new payload key deployed while runs are in flight (docs/guides/encryption.md), on real
worker processes, in either order: the new key ring to the workers first, or to the API
(the Client) first. Each run takes turns, each a delivery any worker may take, reading the
steer messages its client sends: an old worker (the old ring alone) meets payloads sealed
under the new key, at the claim (a state a new worker saved: workers first) or inside a
step (a message the new API sealed: API first). It hands those runs back, one line each,
and a worker with the key goes on. Every run finishes; none fails; the old worker logs no
traceback, and `cairn worker --check` with its ring fails naming the key it lacks."""

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


def _tell(client: Client, runs: list[str], turns: range) -> None:
    for i in turns:
        for run_id in runs:
            client.steer(run_id, {"i": i, "note": f"secret-{i}"})


def _statuses(sql: Callable[..., list[tuple[Any, ...]]], runs: list[str]) -> dict[str, int]:
    # Status and seq are never sealed: readable whichever keys this process holds.
    rows = sql("SELECT status, count(*) FROM checkpoints WHERE run_id = ANY(%s) GROUP BY 1", runs)
    return {status: n for status, n in rows}


def _read(sql: Callable[..., list[tuple[Any, ...]]], runs: list[str]) -> int:
    """The messages the slowest run has read (its journaled reads hold their numbers, in
    clear: readable whichever keys this process holds)."""
    rows = sql(
        "SELECT r, coalesce(max((m #>> '{}')::int), 0) FROM unnest(%s::text[]) r"
        " LEFT JOIN journal j ON j.run_id = r AND j.name = 'cairn.messages'"
        " LEFT JOIN LATERAL jsonb_array_elements(j.result) m ON true GROUP BY r",
        runs,
    )
    return min(int(n) for _, n in rows)


def _turns(sql: Callable[..., list[tuple[Any, ...]]], runs: list[str]) -> int:
    """The turns (saves) the slowest run has taken."""
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
    _tell(client, runs, range(3))
    wait_for(lambda: _read(sql, runs) >= 3, 90, "the runs' first turns")
    if order == "workers-first":
        new = start_worker(concurrency=2, CAIRN_PAYLOAD_KEYS=NEW, **FLOWS)
        # Both workers take turns a while: the old one meets states the new one sealed.
        base = _turns(sql, runs)
        _tell(client, runs, range(3, 6))
        wait_for(lambda: _turns(sql, runs) >= base + 6, 120, "turns on both workers")
        wait_for(lambda: _read(sql, runs) >= 6, 60, "the messages read")
        api_keys(NEW)  # then the API
    else:
        api_keys(NEW)  # the API first: the old worker meets k2 in every message from now
        _tell(client, runs, range(3, 6))
        wait_for(lambda: "lacks payload key 'k2'" in old.text(), 60, "a hand-back")
        lacking = _check(worker_env, OLD)
        assert lacking.returncode == 1, lacking.stdout + lacking.stderr
        assert "sealed under key 'k2', which CAIRN_PAYLOAD_KEYS lacks" in lacking.stderr
        assert "Traceback" not in lacking.stderr
        new = start_worker(concurrency=2, CAIRN_PAYLOAD_KEYS=NEW, **FLOWS)
        assert _check(worker_env, NEW).returncode == 0
    old.proc.send_signal(signal.SIGTERM)  # the old worker goes: its runs are handed back
    _tell(client, runs, range(6, TURNS))
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
