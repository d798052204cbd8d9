"""Payloads encrypted at rest on real workers: a worker process given CAIRN_PAYLOAD_KEYS
seals what it writes and opens what it reads; a dump of Postgres and of Redis afterwards
holds none of the run's secrets, and a client with the key reads them back."""

from __future__ import annotations

import glob
import shutil
import subprocess
from collections.abc import Callable, Iterator

import pytest

from cairn.client.client import Client
from cairn.core import sealing
from cairn.core.sealing import KeyRing, new_key
from cairn.store import Leases
from cairn.testing import fleet

KEYS = f"fleet:{new_key()}"
FLOWS = {"CAIRN_WORKFLOWS": "tests.helpers.steer_flows", "CAIRN_PAYLOAD_KEYS": KEYS}


@pytest.fixture
def keys() -> Iterator[None]:
    sealing.use(KeyRing(KEYS))
    yield
    sealing.use(None)


def test_a_worker_with_payload_keys_leaves_nothing_in_clear(
    keys: None,
    start_worker: Callable[..., fleet.Proc],
    client: Client,
    leases: Leases,
    db_url: str,
) -> None:
    start_worker(concurrency=1, **FLOWS)
    run_id = client.enqueue("steered_chat", {"secret": "sesame-fleet-input-61d0"})
    client.steer(run_id, "sesame-fleet-steer-0b3e")
    client.steer(run_id, "stop")
    run = client.wait(run_id, timeout=60)
    assert run.status == "done", run.error
    assert run.input == {"secret": "sesame-fleet-input-61d0"}
    assert run.state["got"][0] == ["sesame-fleet-steer-0b3e", "stop"]

    pg_dump = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_dump")) or [shutil.which("pg_dump")]
    dumped = subprocess.run(
        [str(pg_dump[-1]), "--data-only", db_url], capture_output=True, text=True, check=True
    ).stdout
    r = leases.client
    dumped += "".join(
        repr(r.xrange(k)) if r.type(k) == b"stream" else repr(r.dump(k)) for k in r.scan_iter()
    )
    assert "sesame-fleet" not in dumped
    assert '"cairn.sealed": "v1.fleet.' in dumped
