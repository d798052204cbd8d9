"""A Postgres primary and its streaming replica (pg_basebackup), each a cluster of its own in
a temporary directory, for the failover test: the primary is SIGKILLed, the replica promoted.
CAIRN_TEST_FAILOVER_PG_PORT (a base port, the replica on the next) pins their ports."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name)]
    assert found[-1], f"no {name}"
    return str(found[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgPair:
    """start() makes both; dsn names both hosts, read-write only (libpq's multi-host)."""

    def __init__(self, synchronous: bool = False) -> None:
        self.synchronous = synchronous
        base = os.environ.get("CAIRN_TEST_FAILOVER_PG_PORT")
        self.ports = (int(base), int(base) + 1) if base else (_free_port(), _free_port())
        # Postgres refuses to run as root: as root, run it as the postgres user.
        self.runas = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.home = Path(tempfile.mkdtemp(prefix="cairn-pgpair-"))
        if self.runas:
            shutil.chown(self.home, "postgres", "postgres")
        self.data = (self.home / "primary", self.home / "replica")

    def url(self, which: int, db: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.ports[which]}/{db}"

    def dsn(self, db: str) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return f"postgresql://postgres@{hosts}/{db}?target_session_attrs=read-write"

    def _run(self, *args: str, timeout: float = 120) -> None:
        subprocess.run(
            [*self.runas, *args], cwd="/", check=True, capture_output=True, timeout=timeout
        )

    def _start(self, which: int) -> None:
        opts = f"-p {self.ports[which]} -k {self.home} -c listen_addresses=127.0.0.1"
        log = self.home / f"log{which}"
        try:
            self._run(_bin("pg_ctl"), "-D", str(self.data[which]), "-w", "-t", "60",
                      "-l", str(log), "-o", opts, "start")  # fmt: skip
        except subprocess.CalledProcessError:
            tail = log.read_text()[-1500:] if log.exists() else "(no log)"
            raise AssertionError(f"postgres on port {self.ports[which]} did not start:\n{tail}")

    def start(self) -> None:
        self._run(_bin("initdb"), "-D", str(self.data[0]), "-U", "postgres", "--auth=trust")
        self._start(0)
        self._run(_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.ports[0]),
                  "-U", "postgres", "-D", str(self.data[1]), "-R", "-X", "stream",
                  "-c", "fast")  # fmt: skip
        self._start(1)
        with psycopg.connect(self.url(0), autocommit=True) as conn:
            if self.synchronous:
                # The settings that lose nothing (docs/explanation/failover.md): a commit
                # returns once the standby has applied it.
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                conn.execute("ALTER SYSTEM SET synchronous_commit = 'remote_apply'")
                conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 60
            state = "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'"
            want = "sync" if self.synchronous else "async"
            while conn.execute(state).fetchone() != (want,):
                assert time.monotonic() < deadline, "the replica never streamed"
                time.sleep(0.1)

    def walsender(self) -> int:
        """The primary's process streaming WAL to the replica."""
        with psycopg.connect(self.url(0), autocommit=True) as conn:
            row = conn.execute("SELECT pid FROM pg_stat_replication").fetchone()
        assert row, "no walsender"
        return int(row[0])

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster and every process of it: a machine gone."""
        postmaster = int((self.data[0] / "postmaster.pid").read_text().split()[0])
        children = []
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:
                children.append(int(Path(stat).parent.name))
        for pid in [postmaster, *children]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def promote(self) -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.data[1]), "-w", "-t", "60", "promote")

    def close(self) -> None:
        for data in self.data:
            if (data / "postmaster.pid").exists():
                subprocess.run(
                    [*self.runas, _bin("pg_ctl"), "-D", str(data), "-w", "stop", "-m", "immediate"],
                    cwd="/", check=False, capture_output=True, timeout=60,
                )  # fmt: skip
        shutil.rmtree(self.home, ignore_errors=True)
