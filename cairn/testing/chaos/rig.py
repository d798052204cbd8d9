"""What the chaos run stands on: the mail stand-in that attributes every request to a
step attempt, the faulted workers' environment, and the workers themselves (K started in
parallel, replacements for the ones killed whole, and the beat)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cairn.testing import fleet
from cairn.testing.faults import HOLDER_HEADER, STEP_HEADER

if TYPE_CHECKING:
    from cairn.testing.chaos.config import ChaosConfig


def chaos_mail(**options: Any) -> Any:
    """A MailServer (not started) that also remembers, per request, the X-Cairn-Step
    header the faulted workers add (run, seq, cursor, attempt), their X-Cairn-Holder
    (pid, lease epoch), its arrival time and the Idempotency-Key:
    MailServer.messages() records neither the header nor the requests it deduplicated.
    (Defined here, not at import, so that `cairn --help` does not import the stand-ins.)"""
    from cairn.testing.standins import MailServer

    class ChaosMail(MailServer):
        def __init__(self, **options: Any) -> None:
            super().__init__(**options)
            self._events: list[dict[str, Any]] = []
            self._events_lock = threading.Lock()

        def events(self) -> list[dict[str, Any]]:
            with self._events_lock:
                return [dict(e) for e in self._events]

        def refuse(self, on: bool) -> None:
            """While on, every send is refused with a 403 (nothing delivered): a fault no
            retry heals, so the runs fail (`cairn chaos --replay-failed`)."""
            self._refusing = on

        def _send(self, headers: dict[str, str], raw: bytes) -> tuple[int, Any, dict[str, str]]:
            if getattr(self, "_refusing", False):
                return 403, {"error": {"type": "forbidden", "message": "sending is off"}}, {}
            lower = {k.lower(): v for k, v in headers.items()}
            step = lower.get(STEP_HEADER.lower())
            holder = lower.get(HOLDER_HEADER.lower())
            at = time.time()
            key = (lower.get("idempotency-key") or "").strip() or None
            status, result, extra = super()._send(headers, raw)
            if status == 200 and isinstance(result, dict):
                with self._events_lock:
                    self._events.append(
                        {
                            "step": step,
                            "holder": holder,
                            "at": at,
                            "key": key,
                            "id": result.get("id"),
                            "delivered": not result.get("deduplicated"),
                        }
                    )
            return status, result, extra

    return ChaosMail(**options)


def faulted_env(
    config: ChaosConfig,
    faults_dir: Path,
    db_url: str,
    mail_url: str,
    model_url: str,
    openai_url: str,
) -> dict[str, str]:
    """Write the fault plan (cairn/testing/faults.py) and return the workers' environment.

    faults_dir starts empty but for killed/, where the workers journal their kills.
    model_url is the model stand-in's Messages API, openai_url its OpenAI API (`/v1`)."""
    shutil.rmtree(faults_dir, ignore_errors=True)  # a reused state dir starts clean
    (faults_dir / "killed").mkdir(parents=True)
    plan = {
        "dir": str(faults_dir),
        "seed": config.seed,
        "rate": config.rate,
        "kills": [list(k) for k in (config.kills or [])],
        "spare_pid": os.getpid(),
    }
    plan_path = config.state / "faults.json"
    plan_path.write_text(json.dumps(plan))
    env = fleet.child_env(
        CAIRN_FAULTS=str(plan_path),
        CAIRN_DATABASE_URL=db_url,
        CAIRN_REDIS_URL=config.redis_url,
        CAIRN_MAIL_URL=mail_url,
        ANTHROPIC_BASE_URL=model_url,
        OPENAI_BASE_URL=openai_url,
        CAIRN_LEASE_TTL=str(config.lease_ttl),
        CAIRN_REAPER_INTERVAL=str(min(1.0, config.lease_ttl / 3)),
        CAIRN_DEFER_SECONDS=str(min(1.0, config.lease_ttl / 4)),
        CAIRN_PENDING_AFTER=str(config.pending_after),
        CAIRN_WORKFLOWS=",".join(config.modules),
        CAIRN_STORE_GIVE_UP_AFTER="20",
    )
    env.pop("CAIRN_BROKER_URL", None)
    if config.broker_url:
        env["CAIRN_BROKER_URL"] = config.broker_url
    # No real key goes to the stand-in (it takes any, and asks for none).
    env.pop("ANTHROPIC_API_KEY", None)
    env.pop("OPENAI_API_KEY", None)
    return env


class Crew:
    """The chaos workers chaos0..chaos<K-1>, their replacements chaos<K>, chaos<K+1>, ...
    and the beat (reaper); procs holds every one started, for the killers and teardown."""

    def __init__(
        self, env: dict[str, str], state: Path, workers: int, concurrency: int, pool: str
    ) -> None:
        self.procs: list[fleet.Proc] = []
        self.warnings: list[str] = []  # replacements that did not start
        self._env, self._state = env, state
        self._workers, self._concurrency, self._pool = workers, concurrency, pool
        self._numbers = itertools.count(workers)
        self.versions: dict[str, str | None] = {}  # worker name -> its CAIRN_CODE_VERSION
        self._starting: Counter[str | None] = Counter()  # workers starting, per version
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the K workers in parallel (each waits until ready), then the beat."""
        started: list[Any] = [None] * self._workers

        def start_into(i: int) -> None:
            try:
                started[i] = self._start(f"chaos{i}")
            except Exception as exc:  # noqa: BLE001 (re-raised below)
                started[i] = exc

        threads = [threading.Thread(target=start_into, args=(i,)) for i in range(self._workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.procs.extend(p for p in started if isinstance(p, fleet.Proc))
        failed_start = [p for p in started if not isinstance(p, fleet.Proc)]
        if failed_start:
            raise RuntimeError(f"a worker did not start: {failed_start[0]}")
        state = self._state
        self.procs.append(
            fleet.start_beat(self._env, state / "beat.log", state / "beat-schedule", wait=90)
        )

    def replace(self) -> str | None:
        """Start one more worker (for one killed whole); a failure becomes a warning. The
        new worker's name (None: it did not start)."""
        try:
            proc = self._start(f"chaos{next(self._numbers)}")
        except Exception as exc:  # noqa: BLE001 (reported, and the run goes on)
            self.warnings.append(f"a replacement worker did not start: {exc}")
            return None
        self.procs.append(proc)
        return proc.name

    def switch(self, env: dict[str, str]) -> None:
        """Start every worker from now on with env (a deploy's new code)."""
        self._env = env

    def others(self, version: str) -> tuple[list[fleet.Proc], int]:
        """The workers alive that are not of version, and how many such are starting (a
        replacement begun before a deploy's switch)."""
        alive = [p for p in self.procs if p.name.startswith("chaos") and p.alive()]
        with self._lock:
            starting = sum(n for v, n in self._starting.items() if v != version)
        return [p for p in alive if self.versions.get(p.name) != version], starting

    def revive(self) -> None:
        """Start a worker for each one dead (a threads worker dies whole at each kill),
        keeping the crew at its size."""
        alive = sum(1 for p in self.procs if p.name.startswith("chaos") and p.alive())
        for _ in range(self._workers - alive):
            self.replace()

    def kill(self) -> None:
        """SIGKILL every process started."""
        for p in self.procs:
            p.kill()

    def _start(self, name: str) -> fleet.Proc:
        log = self._state / f"{name}.log"
        env = self._env
        version = env.get("CAIRN_CODE_VERSION")
        with self._lock:
            self._starting[version] += 1
        try:
            proc = fleet.start_worker(
                env,
                log,
                name,
                self._concurrency,
                wait=90,
                app="cairn.testing.faulted",
                pool=self._pool,
            )
        finally:
            with self._lock:
                self._starting[version] -= 1
        self.versions[name] = version
        return proc
