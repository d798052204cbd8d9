"""Real worker processes on this machine, for the demo, `cairn chaos`, tests and benches."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cairn.testing import leash

# Logs and scratch files of the demo and chaos: .cairn/ under the current directory.
STATE = Path(os.environ.get("CAIRN_STATE_DIR") or ".cairn").absolute()
WORKER_APP = "cairn.workers.main"  # the production app; chaos passes its faulted one


def celery(app: str, env: Mapping[str, str] | None = None) -> list[str]:
    # `python -m` puts the current directory on sys.path: the user's workflow modules
    # there import as they would for `cairn worker`. JSON logs: no banner, as `cairn
    # worker` and `cairn beat` run Celery then.
    quiet = ["--quiet"] if (env or {}).get("CAIRN_LOG_FORMAT") == "json" else []
    return [sys.executable, "-m", "celery", "-A", app, *quiet]


def _loglevel(env: Mapping[str, str]) -> str:
    return f"--loglevel={env.get('CAIRN_LOGLEVEL') or 'INFO'}"  # as `cairn worker` reads it


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


class Proc:
    """A process in its own session (killable whole): a worker, beat, or any command.
    Killed whole when this process dies too, however it dies (cairn.testing.leash)."""

    def __init__(
        self, cmd: list[str], env: Mapping[str, str], log: Path, name: str, cwd: Path | None = None
    ) -> None:
        self.log, self.name = log, name
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                cmd,
                env=dict(env),
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        leash.hold(self.proc.pid)  # its session's group: the pid is its id

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def children(self) -> list[int]:
        """Pool child pids (from /proc: no psutil needed on Linux)."""
        try:
            raw = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in raw.split()]

    def signal_all(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL parent and pool children: a node lost whole."""
        self.signal_all(signal.SIGCONT)
        self.signal_all(signal.SIGKILL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            return
        leash.drop(self.pid)


def spawn_worker(
    env: Mapping[str, str],
    log: Path,
    name: str,
    concurrency: int = 1,
    app: str = WORKER_APP,
    cwd: Path | None = None,
    queues: str | None = None,
    pool: str | None = None,
) -> Proc:
    """Start a worker without waiting for it (several can then boot in parallel). The pool
    is prefork unless pool or CAIRN_POOL (in env) says threads."""
    args = [
        "worker",
        f"--pool={pool or env.get('CAIRN_POOL') or 'prefork'}",
        f"--concurrency={concurrency}",
        _loglevel(env),
        "-n",
        f"{name}@%h",
        "--without-mingle",
        "--without-gossip",
        "--without-heartbeat",
        *([f"--queues={queues}"] if queues else []),
    ]
    return Proc(celery(app, env) + args, env, log, name, cwd)


def wait_ready(w: Proc, timeout: float = 60.0) -> Proc:
    wait_for(lambda: "ready." in w.text() or not w.alive(), timeout, f"worker {w.name} to start")
    if not w.alive():
        raise RuntimeError(f"worker {w.name} exited at start:\n{w.text()[-3000:]}")
    return w


def start_worker(
    env: Mapping[str, str],
    log: Path,
    name: str,
    concurrency: int = 1,
    wait: float = 60.0,
    app: str = WORKER_APP,
    cwd: Path | None = None,
    queues: str | None = None,
    pool: str | None = None,
) -> Proc:
    return wait_ready(spawn_worker(env, log, name, concurrency, app, cwd, queues, pool), wait)


def start_beat(
    env: Mapping[str, str], log: Path, schedule: Path, wait: float | None = None
) -> Proc:
    """The beat (the reaper's clock). wait: seconds to wait until it ticks; a measurement
    of recovery must not start before the reaper does (booting takes seconds under load)."""
    args = ["beat", _loglevel(env), f"--schedule={schedule}"]
    beat = Proc(celery(WORKER_APP, env) + args, env, log, "beat")
    if wait is not None:
        # Its line just before its first pass (cairn.workers.celerylog).
        wait_for(lambda: "beat ticking" in beat.text() or not beat.alive(), wait, "beat to tick")
        if not beat.alive():
            raise RuntimeError(f"beat exited at start:\n{beat.text()[-3000:]}")
    return beat


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(
    env: Mapping[str, str], log: Path, port: int, *args: str, wait: float = 30.0
) -> Proc:
    """`cairn serve` on 127.0.0.1:port, returned once it answers /healthz (whatever its
    answer: a server in front of a dead Postgres is still up)."""
    import httpx

    cmd = [sys.executable, "-m", "cairn.cli", "serve", "--port", str(port), *args]
    server = Proc(cmd, env, log, "serve")

    def answers() -> bool:
        if not server.alive():
            return True
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
        except httpx.TransportError:
            return False
        return True

    wait_for(answers, wait, "cairn serve to answer")
    if not server.alive():
        raise RuntimeError(f"cairn serve exited at start:\n{server.text()[-3000:]}")
    return server


def child_env(**overrides: str) -> dict[str, str]:
    """The current environment with overrides applied."""
    return {**os.environ, **overrides}


def runs_progress(console: Any, quiet: bool) -> Any:
    """The runs bar the demo and `cairn chaos` show on stderr while a fleet works."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]runs"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        disable=quiet,
    )
