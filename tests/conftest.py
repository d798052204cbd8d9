"""Real services for the tests: a fresh Postgres database per test (from a migrated
template), a flushed Redis database, loopback stand-ins, real Celery worker processes."""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis as redis_lib

from cairn.client.client import Client
from cairn.core.settings import Settings
from cairn.steps import registry
from cairn.steps.model import ModelClient
from cairn.store import Database, Leases, PgStore, upgrade
from cairn.testing import fleet
from cairn.testing.standins import MailServer, ModelServer
from cairn.workers import loop
from tests.helpers.runs import Server

# The servers' addresses are read before the CAIRN_* variables are cleared below.
from tests.helpers.services import (
    BASE_DB,
    BASE_REDIS,
    LEASE_TTL,
    PGBOUNCER_PORT,
    RABBITMQ,
    ROOT,
    via_pgbouncer,
    with_db,
)

# CAIRN_TEST_SLOT=k: this pytest process's own share of the servers (template database,
# Redis databases, RabbitMQ vhosts), so scripts/test can run groups of tests side by side.
SLOT = int(os.environ.get("CAIRN_TEST_SLOT", "0"))
# CAIRN_TEST_HALF=0 or 1: half of the slot (its own template, half its Redis databases and
# vhosts), for two processes that share one slot: pytest-xdist's two workers, gw0 and gw1
# (scripts/test --fast).
_XDIST = os.environ.get("PYTEST_XDIST_WORKER")
HALF = os.environ.get("CAIRN_TEST_HALF") or (_XDIST.removeprefix("gw") if _XDIST else None)
if HALF not in (None, "0", "1"):
    raise RuntimeError(f"a slot has two halves, not {HALF!r}: run pytest-xdist with -n 2 at most")
TEMPLATE = "cairn_test_template" + (f"_{SLOT}" if SLOT else "") + (f"_h{HALF}" if HALF else "")
_MINE = slice(None) if HALF is None else slice(6 * int(HALF), 6 * int(HALF) + 6)

# Clear our own prefix so a developer's shell settings cannot leak into a test; the
# ports stay, so scripts/services.sh (the outage tests) restarts the servers we use, and
# so do the tests' own (CAIRN_TEST_*: the slot, the servers' addresses): pytest-xdist
# starts its workers after this ran in the controller, and they read them again.
_KEEP = ("CAIRN_PG_PORT", "CAIRN_REDIS_PORT", "CAIRN_RABBITMQ_PORT")
# And the chaos mix's knobs (tests/mix/test_mix.py): a seed, a budget, a shrink budget.
_KEEP += ("CAIRN_MIX_SEED", "CAIRN_MIX_BUDGET", "CAIRN_MIX_SHRINK")
for _name in [n for n in os.environ if n.startswith("CAIRN_")]:
    if _name not in _KEEP and not _name.startswith("CAIRN_TEST_"):
        del os.environ[_name]
if PGBOUNCER_PORT:
    # Every process the tests start (the chaos crew, the CLI) turns prepared statements
    # off: PgBouncer 1.18 in transaction mode hands each transaction any server connection.
    os.environ["CAIRN_DATABASE_PREPARE"] = "0"


# -- tiers ---------------------------------------------------------------------------------
# A test's tier is its folder. tests/unit, tests/contract, tests/integration and tests/docs
# start no worker, beat or server process (`scripts/test --fast` runs them); tests/fleet,
# tests/outages and tests/mix (the chaos mix: one fleet for its session) do. A test
# elsewhere that starts one through cairn.testing.fleet (as every fixture and helper that
# starts one does) fails, so the inner loop cannot slow down unnoticed.
STARTS_PROCESSES = ("fleet", "outages", "mix")
TESTS = Path(__file__).resolve().parent
_running: list[pytest.Item] = []  # the test being run, for the guard below


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _running[:] = [item]
    try:
        return (yield)
    finally:
        _running.clear()


def pytest_configure(config: pytest.Config) -> None:
    start = fleet.Proc.__init__

    def guarded(self: fleet.Proc, cmd: list[str], *args: Any, **kwargs: Any) -> None:
        test = _running[0] if _running else None  # None: a session fixture's, or no test's
        if test and test.path.relative_to(TESTS).parts[0] not in STARTS_PROCESSES:
            pytest.fail(
                f"{test.nodeid} started {' '.join(cmd[:4])}...: a test that starts "
                "a worker, beat or server process belongs in tests/fleet (the tier "
                "`scripts/test --fast` leaves out); move it there",
                pytrace=False,
            )
        start(self, cmd, *args, **kwargs)

    fleet.Proc.__init__ = guarded  # type: ignore[method-assign]  # this process only


def _require_services() -> None:
    try:
        psycopg.connect(BASE_DB, connect_timeout=3).close()
        redis_lib.Redis.from_url(BASE_REDIS, socket_connect_timeout=3).ping()
    except Exception as exc:  # noqa: BLE001
        pytest.exit(
            f"Postgres/Redis not reachable ({exc}); run the tests with `bash scripts/test`", 2
        )


@pytest.fixture(scope="session")
def template_db() -> str:
    _require_services()
    with psycopg.connect(BASE_DB, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {TEMPLATE}")
    upgrade(with_db(BASE_DB, TEMPLATE))
    return TEMPLATE


class _Databases:
    """The tests' databases, each made from the template one ahead on a thread and dropped
    behind on another: a CREATE (the template copied and fsynced) and a DROP cost a test
    about 0.4 s together on this machine, which it no longer waits for."""

    AHEAD = 2

    def __init__(self, template: str) -> None:
        self.template = template
        self.names = (f"cairn_t{os.getpid()}_{i}" for i in itertools.count())
        self.ready: queue.Queue[str | Exception] = queue.Queue(self.AHEAD)
        self.dead: queue.Queue[str | None] = queue.Queue()
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._make, name="test-db-make", daemon=True),
            threading.Thread(target=self._drop, name="test-db-drop", daemon=True),
        ]
        for t in self.threads:
            t.start()

    @staticmethod
    def _execute(query: str) -> None:
        # A connection each time: the outage tests restart Postgres under the threads.
        with psycopg.connect(BASE_DB, autocommit=True) as conn:
            conn.execute(query)

    def _create(self) -> str | Exception:
        """A new database's name, or why none could be made: tried for a while, as an
        outage test restarts Postgres under this thread."""
        deadline = time.monotonic() + 30
        while True:
            name = next(self.names)
            try:
                self._execute(f"CREATE DATABASE {name} TEMPLATE {self.template}")
                return name
            except psycopg.Error as exc:
                if time.monotonic() > deadline or self.stop.wait(0.5):
                    return exc  # the test that takes it raises it

    def _make(self) -> None:
        while not self.stop.is_set():
            made = self._create()
            while not self.stop.is_set():
                try:
                    self.ready.put(made, timeout=0.2)
                    break
                except queue.Full:
                    continue
            else:
                if isinstance(made, str):
                    self.dead.put(made)

    def _drop(self) -> None:
        while (name := self.dead.get()) is not None or not self.stop.is_set():
            if name is not None:
                with contextlib.suppress(psycopg.Error):  # left for close() to retry
                    self._execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def take(self) -> str:
        made = self.ready.get(timeout=120)
        if isinstance(made, Exception):
            raise made
        return made

    def close(self) -> None:
        self.stop.set()
        self.threads[0].join()
        while not self.ready.empty():
            if isinstance(made := self.ready.get(), str):
                self.dead.put(made)
        self.dead.put(None)
        self.threads[1].join()
        # What a failed drop left behind (Postgres down at the time), this process's only.
        with psycopg.connect(BASE_DB, autocommit=True) as conn:
            left = conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s",
                (f"cairn\\_t{os.getpid()}\\_%",),
            ).fetchall()
            for (name,) in left:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def _databases(template_db: str) -> Iterator[_Databases]:
    made = _Databases(template_db)
    yield made
    made.close()


@pytest.fixture
def db_url(_databases: _Databases) -> Iterator[str]:
    name = _databases.take()
    yield with_db(BASE_DB, name)
    _databases.dead.put(name)


# 13, 14 and 15 are left to chaos, the demo and the bench, which may run beside the tests;
# slot k > 0 has 16k+1 .. 16k+12 (scripts/services.sh starts Redis with 48 databases).
_redis_dbs = itertools.cycle(range(16 * SLOT + 1, 16 * SLOT + 13)[_MINE])


@contextlib.contextmanager
def _flushed_redis() -> Iterator[str]:
    url = BASE_REDIS.rsplit("/", 1)[0] + f"/{next(_redis_dbs)}"
    client = redis_lib.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


@pytest.fixture
def redis_url() -> Iterator[str]:
    with _flushed_redis() as url:
        yield url


# Like the Redis databases: 13-15 are left over; slot k > 0 has 15k+1 .. 15k+12.
_vhosts = itertools.cycle(range(15 * SLOT + 1, 15 * SLOT + 13)[_MINE])


@pytest.fixture
def broker_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """None (the Redis URL is the broker), or with the parameter "amqp" a RabbitMQ vhost
    emptied of cairn's queues. RabbitMQ missing skips the test, except in CI."""
    from cairn.workers.broker import reset_broker

    if getattr(request, "param", "redis") == "redis":
        yield None
        return
    url = f"{RABBITMQ}/cairn-{next(_vhosts)}"
    try:
        reset_broker(url)
    except Exception as exc:  # kombu raises the transport's own errors
        if os.environ.get("CI"):
            raise
        pytest.skip(f"RabbitMQ not reachable at {url} ({exc}); `bash scripts/test` starts it")
    yield url
    reset_broker(url)


@pytest.fixture
def mail() -> Iterator[MailServer]:
    with MailServer() as server:
        yield server


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer() as server:
        yield server


@pytest.fixture
def settings(
    db_url: str, redis_url: str, broker_url: str | None, mail: MailServer, model: ModelServer
) -> Settings:
    return Settings(
        database_url=via_pgbouncer(db_url),
        database_prepare=not PGBOUNCER_PORT,
        redis_url=redis_url,
        broker_url=broker_url,
        lease_ttl=LEASE_TTL,
        mail_url=mail.url,
        anthropic_base_url=model.url,
        openai_base_url=model.openai_url,
        store_give_up_after=5.0,
    )


@pytest.fixture(scope="session")
def fresh_settings(
    _databases: _Databases,
) -> Callable[[], contextlib.AbstractContextManager[Settings]]:
    """Settings on a fresh database and a flushed Redis database for as long as a `with`
    lasts, no stand-ins: for a module-scoped fixture that does its whole module's work at
    once (tests/integration/test_cli_errors.py runs its commands side by side)."""

    @contextlib.contextmanager
    def fresh() -> Iterator[Settings]:
        name = _databases.take()
        try:
            with _flushed_redis() as redis_url:
                yield Settings(
                    database_url=via_pgbouncer(with_db(BASE_DB, name)),
                    database_prepare=not PGBOUNCER_PORT,
                    redis_url=redis_url,
                    lease_ttl=LEASE_TTL,
                    store_give_up_after=5.0,
                )
        finally:
            _databases.dead.put(name)

    return fresh


@pytest.fixture
def store(settings: Settings) -> Iterator[PgStore]:
    db = Database(
        settings.database_url,
        give_up_after=settings.store_give_up_after,
        prepare=settings.database_prepare,
    )
    yield PgStore(db)
    db.close()


@pytest.fixture
def leases(settings: Settings) -> Iterator[Leases]:
    leases = Leases.from_url(settings.redis)
    yield leases
    leases.client.close()


@pytest.fixture
def deps(settings: Settings, store: PgStore, leases: Leases) -> Iterator[loop.Deps]:
    import cairn.testing.demos.invoice  # noqa: F401
    import tests.helpers.flows  # noqa: F401  (registers probe, loop, bad)

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


@pytest.fixture
def worker_env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "ANTHROPIC_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        CAIRN_DATABASE_URL=settings.database_url,
        CAIRN_DATABASE_PREPARE="1" if settings.database_prepare else "0",
        CAIRN_REDIS_URL=settings.redis_url,
        CAIRN_MAIL_URL=settings.mail_url,
        ANTHROPIC_BASE_URL=settings.anthropic_base_url or "",
        CAIRN_LEASE_TTL=str(LEASE_TTL),
        CAIRN_REAPER_INTERVAL="0.5",
        CAIRN_DEFER_SECONDS="0.5",
        CAIRN_WORKFLOWS="tests.helpers.flows",
        CAIRN_STORE_GIVE_UP_AFTER="5",
    )
    if settings.broker_url:
        env["CAIRN_BROKER_URL"] = settings.broker_url
    return env


@pytest.fixture
def start_worker(worker_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., fleet.Proc]]:
    started: list[fleet.Proc] = []

    def start(concurrency: int = 1, **env: str) -> fleet.Proc:
        name = f"w{len(started)}"
        w = fleet.start_worker({**worker_env, **env}, tmp_path / f"{name}.log", name, concurrency)
        started.append(w)
        return w

    yield start
    for w in started:
        w.kill()


@pytest.fixture
def serve(worker_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(*args: str, token: str | None = "fresh", **env: str) -> Server:
        port = fleet.free_port()
        full = {**worker_env, **env}
        if token == "fresh":
            token = uuid.uuid4().hex
        if token:
            full["CAIRN_API_TOKEN"] = token
        proc = fleet.start_server(full, tmp_path / f"serve-{port}.log", port, *args)
        servers.append(Server(f"http://127.0.0.1:{port}", token, proc))
        return servers[-1]

    yield start
    for s in servers:
        s.proc.kill()


@pytest.fixture
def start_beat(worker_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[[], fleet.Proc]]:
    procs: list[fleet.Proc] = []

    def start() -> fleet.Proc:
        procs.append(
            fleet.start_beat(worker_env, tmp_path / "beat.log", tmp_path / "beat-schedule")
        )
        return procs[-1]

    yield start
    for p in procs:
        p.kill()


@pytest.fixture
def client(settings: Settings) -> Iterator[Client]:
    with Client(settings=settings) as client:
        yield client


@pytest.fixture
def send(client: Client) -> Callable[[str], None]:
    """Put a cairn.run message on the test broker, as enqueue() does."""
    return client.send


@pytest.fixture
def create(store: PgStore, deps: loop.Deps, client: Client) -> Callable[..., str]:
    """Create a run of a registered workflow (and, with queue=True, send it)."""

    def create(workflow: str, input: dict[str, Any], queue: bool = True) -> str:
        run_id = f"{workflow}-{uuid.uuid4().hex[:10]}"
        if queue:
            return client.enqueue(workflow, input, run_id=run_id)
        store.create_run(run_id, workflow, registry.get(workflow).validate(input))
        return run_id

    return create
