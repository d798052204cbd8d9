"""The fleet one mix runs its programs on, started once: a fresh `mix_*` database (the
migrations, the chaos history trigger that records every checkpoint version, the flows'
ledger table), a flushed Redis database, the mail and model stand-ins with their request
logs, K faulted workers and the beat (cairn.testing.chaos.rig.Crew), `cairn serve`, the
admin's API token, and payload keys on (every process seals what it writes).

Through it a program reaches the public surface as a user does: a Client (the admin's or
a tenant's view), an AsyncClient on an event loop of its own, and HTTP with the admin's
token or a tenant's (`cairn tokens`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.markup import escape

from cairn.testing import fleet
from cairn.testing.chaos.history import create_database, drop_database
from cairn.testing.chaos.rig import Crew
from cairn.testing.faults import ARMED, armed_path
from cairn.testing.mix import flows
from cairn.testing.mix.standins import MixModel, mix_mail

if TYPE_CHECKING:
    import httpx

    from cairn.client.aio import AsyncClient
    from cairn.client.client import Client
    from cairn.testing.mix.reference import Twin

T = TypeVar("T")
MIX_REDIS_DB = 13  # the chaos database's (a mix flushes it too): run one at a time


@dataclasses.dataclass(frozen=True, kw_only=True)
class FleetOptions:
    """How the mix's fleet is made (run_mix documents the defaults)."""

    base_db: str  # the Postgres server the mix_* database is made on
    redis_url: str  # the Redis database it uses, FLUSHED at start
    state: Path  # logs, the fault plan, the programs found
    workers: int = 2
    concurrency: int = 2
    lease_ttl: float = 2.0
    modules: tuple[str, ...] = ()  # the user's workflow modules (the mix's own are added)
    keep: bool = False  # keep the database


class MixFleet:
    """The services and processes of one mix, from start() to close()."""

    def __init__(self, options: FleetOptions, say: Callable[[str], None] = print) -> None:
        self.options, self._say = options, say
        self.db_name = f"mix_{time.strftime('%Y%m%d_%H%M%S')}_{os.getpid()}"
        self.db_url = ""
        self.faults_dir = options.state / "faults"
        self.keys = ""
        self.token = uuid.uuid4().hex
        self.mail: Any = None
        self.model: MixModel | None = None
        self.crew: Crew | None = None
        self.serve: fleet.Proc | None = None
        self.serve_url = ""
        self._env: dict[str, str] = {}
        self._client: Client | None = None
        self._aclient: AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._http: dict[str | None, httpx.Client] = {}
        self._tokens: dict[str, str] = {}
        self._sealing_before: Any = None
        self._twin: Twin | None = None
        self._beats = 0  # beats restarted

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> MixFleet:
        from cairn.core import sealing
        from cairn.store.admin import RedisDatabase, execute

        o = self.options
        o.state.mkdir(parents=True, exist_ok=True)
        for old in o.state.glob(
            "*.log"
        ):  # a worker is ready when its log says so: not an old one's
            old.unlink()
        redis = RedisDatabase(o.redis_url)
        redis.flush()
        redis.close()
        self.db_url = create_database(o.base_db, self.db_name)
        execute(self.db_url, flows.LEDGER_SQL)
        self.keys = f"mix:{sealing.new_key()}"
        self._sealing_before = sealing.ring() if os.environ.get("CAIRN_PAYLOAD_KEYS") else None
        sealing.use(sealing.KeyRing(self.keys))
        self.mail = mix_mail(delay_ms=5).start()
        self.model = MixModel(delay_ms=5).start()
        self._env = self._worker_env()
        self.crew = Crew(self._env, o.state, o.workers, o.concurrency, "prefork")
        starting = threading.Thread(target=self._start_serve, daemon=True)
        starting.start()
        # The twin's model calls import the SDKs: seconds, better spent while workers boot.
        preloading = threading.Thread(target=_preload, daemon=True)
        preloading.start()
        self.crew.start()
        starting.join()
        preloading.join()
        if self.serve is None:
            raise RuntimeError(f"cairn serve did not start (log: {o.state / 'serve.log'})")
        self._say(
            f"[bold]mix[/]: {o.workers} workers x {o.concurrency}, lease TTL {o.lease_ttl:g}s, "
            f"database {self.db_name}, payload keys on"
        )
        return self

    def _worker_env(self) -> dict[str, str]:
        o = self.options
        shutil.rmtree(self.faults_dir, ignore_errors=True)
        (self.faults_dir / "killed").mkdir(parents=True)
        (self.faults_dir / ARMED).mkdir()
        plan = {"dir": str(self.faults_dir), "seed": 0, "rate": 0.0, "spare_pid": os.getpid()}
        plan_path = o.state / "faults.json"
        plan_path.write_text(json.dumps(plan))
        assert self.model is not None
        env = fleet.child_env(
            CAIRN_FAULTS=str(plan_path),
            CAIRN_DATABASE_URL=self.db_url,
            CAIRN_REDIS_URL=o.redis_url,
            CAIRN_MAIL_URL=self.mail.url,
            ANTHROPIC_BASE_URL=self.model.url,
            OPENAI_BASE_URL=self.model.openai_url,
            CAIRN_LEASE_TTL=str(o.lease_ttl),
            CAIRN_REAPER_INTERVAL=str(min(0.5, o.lease_ttl / 4)),
            CAIRN_DEFER_SECONDS="0.5",
            CAIRN_PENDING_AFTER="6",
            CAIRN_SCHEDULE_TICK="0.3",
            CAIRN_WORKFLOWS=",".join(("cairn.testing.mix.flows", *o.modules)),
            CAIRN_STORE_GIVE_UP_AFTER="20",
            CAIRN_PAYLOAD_KEYS=self.keys,
            CAIRN_API_TOKEN=self.token,
        )
        for name in ("CAIRN_BROKER_URL", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
            env.pop(name, None)
        return env

    def _start_serve(self) -> None:
        port = fleet.free_port()
        try:
            self.serve = fleet.start_server(
                self._env, self.options.state / "serve.log", port, wait=90
            )
        except (RuntimeError, TimeoutError) as exc:
            self._say(f"[red]cairn serve did not start[/]: {escape(str(exc))}")
            return
        self.serve_url = f"http://127.0.0.1:{port}"

    def restart(self, what: str) -> None:
        """SIGKILL `cairn serve` or the beat and start it again (on the same port)."""
        assert self.crew is not None
        if what == "serve":
            assert self.serve is not None
            self.serve.kill()
            port = int(self.serve_url.rsplit(":", 1)[1])
            self.serve = fleet.start_server(
                self._env, self.options.state / "serve.log", port, wait=90
            )
            self.forget_http()
            return
        beat = next(p for p in self.crew.procs if p.name == "beat" and p.alive())
        beat.kill()
        self.crew.procs.remove(beat)
        state, self._beats = self.options.state, self._beats + 1
        # A log of its own: the new beat is up when its log says it ticks, not the old one's.
        log = state / f"beat-{self._beats}.log"
        self.crew.procs.append(fleet.start_beat(self._env, log, state / "beat-schedule", wait=90))

    def arm(self, run_id: str, point: str) -> None:
        """The run's worker SIGKILLs itself at its next hit of point (faults.py)."""
        Path(armed_path(str(self.faults_dir), run_id, point)).touch()

    def disarm(self) -> None:
        for path in (self.faults_dir / ARMED).iterdir():
            path.unlink(missing_ok=True)

    def close(self) -> None:
        from cairn.core import sealing

        if self.crew is not None:
            self.crew.kill()
        if self._twin is not None:
            self._twin.close()
        if self.serve is not None:
            self.serve.kill()
        for server in (self.mail, self.model):
            if server is not None:
                server.stop()
        for http in self._http.values():
            http.close()
        if self._aclient is not None and self._loop is not None:
            self.run(self._aclient.close())
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(10)
            self._loop.close()
        if self._client is not None:
            self._client.close()
        sealing.use(self._sealing_before)
        if self.db_url and not self.options.keep:
            try:
                drop_database(self.options.base_db, self.db_name)
            except Exception as exc:  # noqa: BLE001 (reported, the mix is over)
                self._say(f"could not drop {self.db_name}: {escape(str(exc))}")

    # -- the surfaces ----------------------------------------------------------------------
    def settings(self) -> Any:
        from cairn.core.settings import Settings

        return Settings(
            database_url=self.db_url,
            redis_url=self.options.redis_url,
            lease_ttl=self.options.lease_ttl,
            api_token=self.token,
            database_prepare=Settings.from_env().database_prepare,
        )

    def client(self, tenant: str | None = None) -> Client:
        """The admin's Client, or its view for a tenant."""
        from cairn.client.client import Client

        if self._client is None:
            self._client = Client(settings=self.settings())
        return self._client if tenant is None else self._client.for_tenant(tenant)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Await coro on the mix's event loop (a thread of its own) and return its result."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(
                target=self._loop.run_forever, daemon=True, name="mix-loop"
            )
            self._loop_thread.start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def aclient(self, tenant: str | None = None) -> AsyncClient:
        """The admin's AsyncClient, or its view for a tenant."""
        from cairn.client.aio import AsyncClient

        if self._aclient is None:
            self._aclient = AsyncClient(settings=self.settings())
        return self._aclient if tenant is None else self._aclient.for_tenant(tenant)

    def http(self, tenant: str | None = None) -> httpx.Client:
        """An HTTP client of `cairn serve` with the admin's token, or a tenant's."""
        import httpx

        if tenant not in self._http:
            token = self.token if tenant is None else self._tenant_token(tenant)
            self._http[tenant] = httpx.Client(
                base_url=self.serve_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
            )
        return self._http[tenant]

    def forget_http(self) -> None:
        """Drop the HTTP clients (their pooled connections): after a 500, which closes its
        connection, and after `cairn serve` restarted."""
        for http in self._http.values():
            http.close()
        self._http.clear()

    def _tenant_token(self, tenant: str) -> str:
        from cairn.store import Database
        from cairn.store.tokens import Tokens

        if tenant not in self._tokens:
            db = Database(self.db_url, max_size=1)
            try:
                self._tokens[tenant] = Tokens(db).create(tenant, name=f"mix {tenant}")[1]
            finally:
                db.close()
        return self._tokens[tenant]

    def twin(self) -> Twin:
        """The in-memory twin the programs are compared with (its stand-ins its own)."""
        from cairn.testing.mix.reference import Twin

        if self._twin is None:
            self._twin = Twin()
        return self._twin

    def worker_procs(self) -> list[fleet.Proc]:
        assert self.crew is not None
        return [p for p in self.crew.procs if p.name != "beat"]


def _preload() -> None:
    from cairn.steps.model import preload_sdk

    preload_sdk()


def mix_redis_url(url: str) -> str:
    """The mix's Redis database (index MIX_REDIS_DB) on the server of url."""
    from cairn.store.admin import with_path

    return with_path(url, str(MIX_REDIS_DB))
