"""Real services for the tests: a fresh Postgres database per test (from a migrated
template), a flushed Redis database, loopback stand-ins, real Celery worker processes."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis as redis_lib
from celery import Celery

from steps.model import ModelClient
from steps.standins import MailServer, ModelServer
from store import Database, Leases, PgStore, upgrade
from workers import loop
from workers.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
BASE_DB = os.environ.get("CAIRN_DATABASE_URL", "postgresql://postgres@127.0.0.1:54329/cairn")
BASE_REDIS = os.environ.get("CAIRN_REDIS_URL", "redis://127.0.0.1:63790/0")
TEMPLATE = "cairn_test_template"
LEASE_TTL = 3.0

# Clear our own prefix so a developer's shell settings cannot leak into a test.
for _name in [n for n in os.environ if n.startswith("CAIRN_")]:
    del os.environ[_name]


def _with_db(url: str, name: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + name


def _require_services() -> None:
    try:
        psycopg.connect(BASE_DB, connect_timeout=3).close()
        redis_lib.Redis.from_url(BASE_REDIS, socket_connect_timeout=3).ping()
    except Exception as exc:
        pytest.exit(f"Postgres/Redis not reachable ({exc}); run the tests with `bash scripts/test`", 2)


@pytest.fixture(scope="session")
def template_db() -> str:
    _require_services()
    with psycopg.connect(BASE_DB, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {TEMPLATE}")
    upgrade(_with_db(BASE_DB, TEMPLATE))
    return TEMPLATE


_counter = itertools.count()


@pytest.fixture
def db_url(template_db: str) -> Iterator[str]:
    name = f"cairn_t{os.getpid()}_{next(_counter)}"
    with psycopg.connect(BASE_DB, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {template_db}")
    yield _with_db(BASE_DB, name)
    with psycopg.connect(BASE_DB, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


_redis_dbs = itertools.cycle(range(1, 16))


@pytest.fixture
def redis_url() -> Iterator[str]:
    url = BASE_REDIS.rsplit("/", 1)[0] + f"/{next(_redis_dbs)}"
    client = redis_lib.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


@pytest.fixture
def mail() -> Iterator[MailServer]:
    with MailServer() as server:
        yield server


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer() as server:
        yield server


@pytest.fixture
def settings(db_url: str, redis_url: str, mail: MailServer, model: ModelServer) -> Settings:
    return Settings(
        database_url=db_url,
        redis_url=redis_url,
        lease_ttl=LEASE_TTL,
        mail_url=mail.url,
        anthropic_base_url=model.url,
        store_give_up_after=5.0,
    )


@pytest.fixture
def store(settings: Settings) -> Iterator[PgStore]:
    db = Database(settings.database_url, give_up_after=settings.store_give_up_after)
    yield PgStore(db)
    db.close()


@pytest.fixture
def leases(settings: Settings) -> Iterator[Leases]:
    leases = Leases.from_url(settings.redis_url)
    yield leases
    leases.client.close()


@pytest.fixture
def deps(settings: Settings, store: PgStore, leases: Leases) -> Iterator[loop.Deps]:
    import tests.flows  # noqa: F401  (registers probe, loop, bad)
    import steps.invoice  # noqa: F401

    model = ModelClient(base_url=settings.anthropic_base_url, give_up_after=10.0)
    yield loop.Deps(settings=settings, store=store, leases=leases, model=model)
    model.close()


@pytest.fixture
def sql(settings: Settings) -> Iterator[Callable[..., list[tuple[Any, ...]]]]:
    conn = psycopg.connect(settings.database_url, autocommit=True)

    def run(query: str, *params: Any) -> list[tuple[Any, ...]]:
        cur = conn.execute(query, params or None)
        return cur.fetchall() if cur.description else []

    yield run
    conn.close()


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Worker:
    """A real `celery worker` process (its own session, so it can be killed whole)."""

    def __init__(self, env: dict[str, str], log: Path, concurrency: int, name: str) -> None:
        self.log = log
        self.name = name
        cmd = [
            sys.executable, "-m", "celery", "-A", "workers.app", "worker",
            f"--concurrency={concurrency}", "--loglevel=INFO", "-n", f"{name}@%h",
            "--without-mingle", "--without-gossip", "--without-heartbeat",
        ]
        with log.open("ab") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(lambda: "ready." in self.text() or self.proc.poll() is not None, 60, f"{name} ready")
        assert self.proc.poll() is None, f"worker {name} exited:\n{self.text()[-3000:]}"

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def signal_all(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the whole worker: parent and pool children, as a lost node."""
        self.signal_all(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.signal_all(signal.SIGCONT)
            self.signal_all(signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def worker_env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "ANTHROPIC_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        CAIRN_DATABASE_URL=settings.database_url,
        CAIRN_REDIS_URL=settings.redis_url,
        CAIRN_MAIL_URL=settings.mail_url,
        ANTHROPIC_BASE_URL=settings.anthropic_base_url or "",
        CAIRN_LEASE_TTL=str(LEASE_TTL),
        CAIRN_REAPER_INTERVAL="0.5",
        CAIRN_DEFER_SECONDS="0.5",
        CAIRN_WORKFLOWS="tests.flows",
        CAIRN_STORE_GIVE_UP_AFTER="5",
    )
    return env


@pytest.fixture
def start_worker(worker_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(concurrency: int = 1, **env: str) -> Worker:
        name = f"w{len(started)}"
        w = Worker({**worker_env, **env}, tmp_path / f"{name}.log", concurrency, name)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


@pytest.fixture
def start_beat(worker_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable, "-m", "celery", "-A", "workers.app", "beat", "--loglevel=INFO",
            f"--schedule={tmp_path / 'beat-schedule'}",
        ]
        with (tmp_path / "beat.log").open("ab") as out:
            p = subprocess.Popen(
                cmd, env=worker_env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        procs.append(p)
        return p

    yield start
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)


@pytest.fixture
def send(settings: Settings) -> Iterator[Callable[[str], None]]:
    """Put a cairn.run message on the test broker, as enqueue() does."""
    app = Celery("cairn-test", broker=settings.redis_url)
    app.conf.broker_transport_options = {"visibility_timeout": settings.visibility_timeout}

    def send(run_id: str) -> None:
        app.send_task("cairn.run", args=[run_id])

    yield send
    app.close()


@pytest.fixture
def create(store: PgStore, deps: loop.Deps, send: Callable[[str], None]) -> Callable[..., str]:
    """Create a run of a registered workflow (and, with queue=True, send it)."""
    from steps import registry

    def create(workflow: str, input: dict[str, Any], queue: bool = True) -> str:
        flow = registry.get(workflow)
        run_id = f"{workflow}-{uuid.uuid4().hex[:10]}"
        store.create_run(run_id, workflow, flow.validate(input), flow.first or "")
        if queue:
            send(run_id)
        return run_id

    return create


def holder_pid(leases: Leases, run_id: str) -> int | None:
    token = leases.holder(run_id)
    return int(token.split("|")[0].split(":")[1]) if token else None


def step_log(path: Path) -> list[tuple[str, int, int, str]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        cursor, visit, pid, event = line.split()
        rows.append((cursor, int(visit), int(pid), event))
    return rows


def starts(path: Path) -> list[str]:
    return [c for c, _, _, e in step_log(path) if e == "start"]
