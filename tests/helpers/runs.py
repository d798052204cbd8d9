"""Watching runs and the processes that move them: a condition waited for, a run's lease
holder, the probe workflow's step log (tests/helpers/flows.py), a run waited to its end,
and the handle of a `cairn serve` the `serve` fixture started."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from cairn.store import Leases, PgStore
from cairn.testing import fleet


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """predicate's first truthy answer; an AssertionError (a test failure, not an error)
    when none came within timeout."""
    try:
        return fleet.wait_for(predicate, timeout, what)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None


def done(store: PgStore, run_id: str, timeout: float = 60.0) -> None:
    """Wait for run_id to stop, and fail unless it is done."""

    def finished() -> bool:
        cp = store.load(run_id)
        return cp is not None and cp.status in ("done", "failed")

    wait_for(finished, timeout, f"run {run_id} to finish")
    cp = store.load(run_id)
    assert cp is not None and cp.status == "done", cp.error if cp else "missing"


def holder_pid(leases: Leases, run_id: str) -> int | None:
    token = leases.holder(run_id)
    return token.pid if token else None


def step_log(path: Path) -> list[tuple[str, int, int, str]]:
    """The probe workflow's log: (cursor, visit, pid, event) a line."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        cursor, visit, pid, event = line.split()
        rows.append((cursor, int(visit), int(pid), event))
    return rows


def starts(path: Path) -> list[str]:
    return [c for c, _, _, e in step_log(path) if e == "start"]


def sleeping(log: Path, cursor: str, where: str) -> bool:
    """The probe is asleep at cursor's `where` (before or after its effect)."""
    return any(c == cursor and e == f"sleep-{where}" for c, _, _, e in step_log(log))


@dataclasses.dataclass
class Server:
    url: str
    token: str | None
    proc: fleet.Proc

    def http(self, token: str | None = "") -> httpx.Client:
        """A client sending this server's token (or the one given; None: no header)."""
        token = self.token if token == "" else token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)
