"""CAIRN_DATABASE_READ_URL: the API's reads come from a real streaming replica of the
tests' Postgres (pg_basebackup, started on a port of its own), and a run the replica has
not replayed yet is read from the primary, never a 404."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cairn.core.settings import Settings
from tests.helpers.services import BASE_DB

SETTINGS_A_STANDBY_COPIES = (
    "max_connections",
    "max_worker_processes",
    "max_wal_senders",
    "max_prepared_transactions",
    "max_locks_per_transaction",
)


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name)]
    assert found[-1], f"no {name}"
    return str(found[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def replica_port() -> Iterator[int]:
    """A hot standby of the tests' Postgres, streaming from it, on a port of its own."""
    info = psycopg.conninfo.conninfo_to_dict(BASE_DB)
    with psycopg.connect(BASE_DB, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
            (list(SETTINGS_A_STANDBY_COPIES),),
        ).fetchall()
    # Postgres refuses to run as root: as root, run it as the postgres user.
    runas = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    home = Path(tempfile.mkdtemp(prefix="cairn-replica-"))
    if runas:
        shutil.chown(home, "postgres", "postgres")
    data, port = home / "data", _free_port()
    subprocess.run(
        [*runas, _bin("pg_basebackup"), "-h", str(info.get("host", "127.0.0.1")),
         "-p", str(info.get("port", 5432)), "-U", str(info.get("user", "postgres")),
         "-D", str(data), "-R", "-X", "stream", "-c", "fast"],
        cwd="/", check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    options = " ".join(f"-c {name}={value}" for name, value in rows)
    options += f" -p {port} -k {home} -c listen_addresses=127.0.0.1"
    pg_ctl = [*runas, _bin("pg_ctl"), "-D", str(data)]
    subprocess.run(
        [*pg_ctl, "-w", "-t", "60", "-l", str(home / "log"), "-o", options, "start"],
        cwd="/", check=True, capture_output=True, timeout=90,
    )  # fmt: skip
    try:
        yield port
    finally:
        subprocess.run([*pg_ctl, "-w", "stop", "-m", "immediate"], cwd="/", check=False)
        shutil.rmtree(home, ignore_errors=True)


def _on_replica(db_url: str, port: int) -> str:
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    return psycopg.conninfo.make_conninfo(**{**info, "host": "127.0.0.1", "port": str(port)})


def test_the_api_reads_from_the_replica_and_the_primary_for_a_run_it_lacks(
    settings: Settings, db_url: str, replica_port: int
) -> None:
    from fastapi.testclient import TestClient

    import tests.helpers.flows  # noqa: F401  (registers sleeper)
    from cairn.web.api import create_app

    replica = _on_replica(db_url, replica_port)
    app = create_app(settings.with_options(database_read_url=replica), insecure_no_auth=True)
    with TestClient(app) as http, psycopg.connect(replica, autocommit=True) as standby:
        assert standby.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        first = http.post("/runs", json={"workflow": "sleeper", "run_id": "first"})
        assert first.status_code == 202, first.text
        deadline = time.monotonic() + 90  # a loaded machine replays a test suite's WAL too
        while not standby.execute("SELECT 1 FROM runs WHERE run_id = 'first'").fetchone():
            assert time.monotonic() < deadline, "the replica never replayed the first run"
            time.sleep(0.05)
        # The replica stops replaying: from here it lags the primary by every write.
        standby.execute("SELECT pg_wal_replay_pause()")
        try:
            paused = "SELECT pg_get_wal_replay_pause_state() = 'paused'"
            while standby.execute(paused).fetchone() != (True,):  # asked, then done
                assert time.monotonic() < deadline, "the replica never paused"
                time.sleep(0.02)
            late = http.post("/runs", json={"workflow": "sleeper", "run_id": "late"})
            assert late.status_code == 202 and late.json()["run_id"] == "late", late.text
            # Lists and counts are the replica's: the late run is not there yet.
            assert [r["run_id"] for r in http.get("/runs").json()["runs"]] == ["first"]
            assert sum(http.get("/counts").json().values()) == 1
            # A run the replica lacks is the primary's, the run page too.
            assert http.get("/runs/late").json()["run_id"] == "late"
            assert http.get("/runs/late/steps").json() == {"run_id": "late", "steps": []}
            assert http.get("/runs/late/calls").status_code == 200
            page = http.get("/ui/runs/late")
            assert page.status_code == 200 and "late" in page.text
            assert http.get("/runs/first").json()["status"] == "pending"
            assert http.get("/runs/never").status_code == 404
            assert http.get("/runs/never/steps").status_code == 404
            assert http.get("/ui/runs/never").status_code == 404
        finally:
            standby.execute("SELECT pg_wal_replay_resume()")
