"""run_chaos: N runs of a workflow on K real workers, killed at step boundaries and from
outside; then what was recorded, as a report."""

from __future__ import annotations

import os
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cairn.core.status import ACTIVE, STOPPED, RunStatus
from cairn.testing import fleet
from cairn.testing.chaos import deploy as chaos_deploy
from cairn.testing.chaos import keys as chaos_keys
from cairn.testing.chaos import record as chaos_record
from cairn.testing.chaos import replay as chaos_replay
from cairn.testing.chaos.config import (
    SENTINEL,
    STATE,
    ChaosConfig,
    chaos_redis_url,
    fill,
)
from cairn.testing.chaos.history import (
    create_database,
    drop_database,
    read_history,
    read_journal_counts,
)
from cairn.testing.chaos.kills import OutsideKiller
from cairn.testing.chaos.lifecycle import Lifecycle
from cairn.testing.chaos.pauses import Pauser
from cairn.testing.chaos.report import build_report
from cairn.testing.chaos.rig import Crew, chaos_mail, faulted_env
from cairn.testing.faults import read_journal

if TYPE_CHECKING:
    from rich.console import Console

    from cairn.client.client import Client
    from cairn.steps.registry import Workflow
    from cairn.store import CheckpointStore


def run_chaos(
    workflow: str,
    *,
    runs: int = 20,
    workers: int = 2,
    input: dict[str, Any] | None = None,
    seed: int | None = None,
    rate: float = 0.03,
    kills: list[tuple[str, int, str]] | None = None,
    random_kills: int | None = None,
    pauses: int = 0,
    concurrency: int = 2,
    pool: str = "prefork",
    lease_ttl: float = 3.0,
    deadline: float = 300.0,
    pending_after: float | None = None,
    mail_delay_ms: int = 20,
    model_delay_ms: int = 5,
    database_url: str | None = None,
    redis_url: str | None = None,
    broker_url: str | None = None,
    workflows: str = "",
    keep: bool = False,
    signals: bool = False,
    cancel_rate: float = 0.0,
    keys: int = 0,
    key_limit: int = 1,
    replay_failed: bool = False,
    deploy: str | None = None,
    state_dir: Path | None = None,
    quiet: bool = False,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the chaos experiment and return its report (report["ok"] is the verdict).

    pauses: that many times, SIGSTOP a process holding a run's lease (a pool child, or
    now and then a whole worker) for longer than lease_ttl, then SIGCONT it.
    deploy: a module of the workflow's new code; the workers are swapped to it one at a
    time mid-run (cairn.testing.chaos.deploy)."""
    from cairn.core.settings import Settings

    if deploy is not None:
        _check_deploy(deploy, pool)
    defaults = Settings.from_env()
    db_name = f"chaos_{time.strftime('%Y%m%d_%H%M%S')}_{os.getpid()}"
    config = ChaosConfig(
        workflow=workflow,
        runs=runs,
        workers=workers,
        input=input,
        seed=random.SystemRandom().randrange(1, 10**6) if seed is None else seed,
        rate=rate,
        kills=kills,
        random_kills=max(2, runs // 25) if random_kills is None else random_kills,
        concurrency=concurrency,
        pool=pool,
        lease_ttl=lease_ttl,
        deadline=deadline,
        # The reaper re-enqueues a pending run untouched this long (its message may have
        # sat with a worker killed whole). Shorter than the deadline, but not so short that
        # runs merely waiting in a long queue get a second message each.
        pending_after=max(60.0, deadline / 2) if pending_after is None else pending_after,
        mail_delay_ms=mail_delay_ms,
        model_delay_ms=model_delay_ms,
        base_db=database_url or defaults.database_url,
        redis_url=redis_url or chaos_redis_url(defaults.redis_url),
        broker_url=broker_url,
        modules=_modules(workflow, workflows),
        keep=keep,
        signals=signals,
        cancel_rate=cancel_rate,
        keys=keys,
        key_limit=key_limit,
        replay_failed=replay_failed,
        pauses=pauses,
        deploy=deploy,
        db_name=db_name,
        state=state_dir or STATE / db_name,
        quiet=quiet,
    )
    return _run(config, log)


def _run(config: ChaosConfig, log: Callable[[str], None] | None) -> dict[str, Any]:
    """The experiment config sets up, from start to close: its report."""
    from rich.console import Console

    err = Console(stderr=True, quiet=config.quiet)
    say = log or (lambda text: err.print(text))
    flow, inputs = _load_workflow(config)
    config.state.mkdir(parents=True, exist_ok=True)
    experiment = _Experiment(config, err, say)
    try:
        experiment.start()
        return experiment.run(flow, inputs)
    finally:
        experiment.close()


def _check_deploy(module: str, pool: str) -> None:
    """A one-line error for a deploy chaos cannot run. The module is found, not imported:
    it registers the workflow's name, which the old code holds in this process."""
    import importlib.util

    from cairn.core.errors import CairnError

    if pool != "prefork":
        raise CairnError("--deploy swaps prefork workers: leave --pool out")
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise CairnError(f"--deploy: no module {module!r} to import (a dotted module path)")


def _modules(workflow: str, given: str) -> tuple[str, ...]:
    """The modules the workers import, imported here too: those given, then the demo
    module of a demo workflow none of them defines (`cairn chaos invoice` needs no
    --workflows, and a user's own `invoice` is the one tested)."""
    from cairn.core.errors import UnknownWorkflow
    from cairn.steps import registry
    from cairn.testing import demos

    modules = tuple(m.strip() for m in given.split(",") if m.strip())
    registry.import_modules(modules)
    demo = demos.WORKFLOWS.get(workflow)
    # The demo's module imported (here, by an earlier chaos run in this process) is what
    # says the name registered is the demo's: a module of theirs taking it would collide.
    if demo and demo not in modules and (registry.find(workflow) is None or demo in sys.modules):
        if (missing := demos.missing_extra(workflow)) is not None:
            raise UnknownWorkflow(missing)
        modules += (demo,)
        registry.import_modules((demo,))
    return modules


def _load_workflow(config: ChaosConfig) -> tuple[Workflow, list[dict[str, Any]]]:
    """The workflow (its modules imported by _modules) and each run's validated input."""
    from cairn.steps import registry

    flow = registry.get(config.workflow)
    assert flow.first is not None, f"workflow {config.workflow!r} has no steps"
    template = config.template()
    return flow, [flow.validate(fill(template, i)) for i in range(config.runs)]


class _Experiment:
    """The services and processes of one chaos run, from start() to close()."""

    def __init__(self, config: ChaosConfig, err: Console, say: Callable[[str], None]) -> None:
        from cairn.store.admin import RedisDatabase

        self.config, self._err, self._say = config, err, say
        self._redis = RedisDatabase(config.redis_url)
        self._amqp: Any = None  # a connection to the RabbitMQ broker, if that is the broker
        self._faults_dir = config.state / "faults"
        self._mail: Any = None
        self._model: Any = None
        self._client: Client | None = None
        self._leases: Any = None
        self._crew: Crew | None = None
        self._db_url: str | None = None
        self._replayed: tuple[list[str], list[str], list[str]] = ([], [], [])
        self._pauser = Pauser(config.seed, config.pauses, config.lease_ttl, say)
        self._deployer: chaos_deploy.Deployer | None = None
        self._new_env: dict[str, str] = {}  # the deploy's workers' environment
        self._unsent: list[tuple[int, str, dict[str, Any]]] = []  # runs held for the deploy
        self._life: Lifecycle | None = None

    def start(self) -> None:
        """A flushed Redis database, the chaos database, the stand-ins, the workers."""
        from cairn.testing.standins import ModelServer

        c = self.config
        self._redis.flush()
        if c.broker_url:
            from kombu import Connection

            from cairn.workers.broker import reset_broker

            reset_broker(c.broker_url)
            self._amqp = Connection(c.broker_url, connect_timeout=5)
        self._redis.set(SENTINEL)  # gone mid-run: someone else flushed this Redis database
        self._db_url = create_database(c.base_db, c.db_name)
        self._mail = chaos_mail(delay_ms=c.mail_delay_ms).start()
        self._model = ModelServer(delay_ms=c.model_delay_ms).start()
        urls = (self._mail.url, self._model.url, self._model.openai_url)
        env = faulted_env(c, self._faults_dir, self._db_url, *urls)
        if c.deploy:
            env["CAIRN_CODE_VERSION"] = chaos_deploy.OLD_VERSION
            self._new_env = {
                **env,
                "CAIRN_CODE_VERSION": chaos_deploy.NEW_VERSION,
                "CAIRN_WORKFLOWS": c.deploy,  # the new code alone
            }
        self._say(
            f"[bold]chaos[/]: {c.runs} {c.workflow} runs, {c.workers} workers x {c.concurrency}, "
            f"seed {c.seed}, rate {c.rate}, lease TTL {c.lease_ttl:g}s, database {c.db_name}"
        )
        self._crew = Crew(env, c.state, c.workers, c.concurrency, c.pool)
        self._crew.start()

    def run(self, flow: Workflow, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """Enqueue the runs, watch (and kill) until they finish or the deadline, report."""
        from cairn.client.client import Client
        from cairn.core.settings import Settings
        from cairn.store import Leases

        c, crew = self.config, self._crew
        assert crew is not None and self._db_url is not None, "start() first"
        self._client = Client(
            settings=Settings(
                database_url=self._db_url,
                redis_url=c.redis_url,
                broker_url=c.broker_url,
                # off behind PgBouncer in transaction mode, as for the workers
                database_prepare=Settings.from_env().database_prepare,
            )
        )
        self._leases = Leases.from_url(c.redis_url)
        store = self._client.store
        started_at = time.monotonic()
        ids = [f"chaos-{c.seed}-{i:04d}" for i in range(len(inputs))]
        life = Lifecycle(c.seed, ids, c.signals, c.cancel_rate)
        since = store.clock()
        if c.replay_failed:
            self._mail.refuse(True)
        runs = [(i, run_id, data) for i, (run_id, data) in enumerate(zip(ids, inputs, strict=True))]
        if c.deploy:
            # The second half comes once new code is up: some runs start on each version.
            self._unsent = runs[(len(runs) + 1) // 2 :]
            runs = runs[: (len(runs) + 1) // 2]
            self._deployer = chaos_deploy.Deployer(
                c.seed,
                crew,
                self._new_env,
                lambda: chaos_deploy.busy_pids(store, self._leases, crew.procs),
                self._db_url,
                self._say,
            )
        self._enqueue(runs)
        self._life = life
        life.start(self._client, [run_id for _, run_id, _ in runs])
        # Threads: every kill takes a whole worker, and _watch keeps the crew's number up.
        replace = crew.replace if c.pool == "prefork" else lambda: None
        killer = OutsideKiller(c.seed, c.random_kills, replace, self._say)
        depths, flushed = self._watch(store, killer, life)
        if c.replay_failed:  # every run failed; the cause fixed, they go on under kills
            failed = [r.run_id for r in self._client.list(RunStatus.FAILED, len(ids) + 1)]
            self._mail.refuse(False)
            replayed = [r.run_id for r in self._client.replay(c.workflow, since=since)]
            again = [r.run_id for r in self._client.replay(c.workflow, since=since)]
            self._say(f"replayed {len(replayed)} of {len(failed)} failed runs")
            more, flushed_later = self._watch(store, killer, life)
            depths, flushed = depths + more, flushed or flushed_later
            self._replayed = (failed, replayed, again)
        elapsed = time.monotonic() - started_at
        killer.join()
        if self._deployer is not None:
            self._deployer.join()
        self._pauser.settle()  # one the deadline cut short: its zombie acts before the verdict
        return self._report(flow, killer, elapsed, depths, flushed, life, ids)

    def _enqueue(self, runs: list[tuple[int, str, dict[str, Any]]]) -> None:
        c = self.config
        assert self._client is not None
        for i, run_id, data in runs:
            self._client.enqueue(
                c.workflow, data, run_id=run_id, concurrency_key=chaos_keys.key_of(i, c.keys),
                concurrency_limit=c.key_limit,
            )  # fmt: skip

    def _deploy_tick(self, finished: int) -> bool:
        """Begin the deploy once a third of the first half ended, send the second half
        once a new worker is up. Whether the deploy is over (True without one)."""
        deployer = self._deployer
        if deployer is None:
            return True
        sent = self.config.runs - len(self._unsent)
        if not deployer.started() and finished >= max(1, sent // 3):
            deployer.begin()
        if self._unsent and deployer.first_up.is_set():
            self._enqueue(self._unsent)
            assert self._client is not None and self._life is not None
            self._life.start(self._client, [run_id for _, run_id, _ in self._unsent])
            self._unsent = []
        return deployer.done() and not self._unsent

    def _watch(
        self, store: CheckpointStore, killer: OutsideKiller, life: Lifecycle
    ) -> tuple[list[int], bool]:
        """Until every run has finished or the deadline: show progress, sample the queue
        depth, kill from outside. Returns the depths and whether Redis was flushed."""

        c, broker = self.config, self._redis
        assert self._crew is not None
        depths: list[int] = []
        flushed = False
        with fleet.runs_progress(self._err, c.quiet) as progress:
            bar = progress.add_task("", total=c.runs)
            end = time.monotonic() + c.deadline
            while time.monotonic() < end:
                counts = {s: int(r["n"]) for s, r in store.counts().items()}
                depths.append(self._depth())
                # Every stop counts (a deploy's incompatible ones too): the report judges them.
                finished = sum(counts.get(s, 0) for s in STOPPED)
                progress.update(
                    bar,
                    completed=finished,
                    description=f"running {counts.get(RunStatus.RUNNING, 0)} · kills "
                    f"{len(os.listdir(self._faults_dir / 'killed')) + len(killer.kills)}"
                    f" · pauses {len(self._pauser.pauses)}",
                )
                if not flushed and not broker.exists(SENTINEL):
                    flushed = True
                    self._say(
                        f"[yellow]warning[/]: the Redis database {c.redis_url} was flushed by "
                        "another process during the run (queued messages and leases lost)"
                    )
                # Child runs count too: done when no run is left to work on.
                active = sum(counts.get(s, 0) for s in ACTIVE)
                # Not while a process is paused: the zombie's late writes are judged too.
                deployed = self._deploy_tick(finished)
                if finished >= c.runs and not active and self._pauser.idle() and deployed:
                    break
                killer.tick(store, self._leases, self._crew.procs)
                self._pauser.tick(store, self._leases, self._crew.procs)
                if c.pool != "prefork":
                    self._crew.revive()
                assert self._client is not None
                life.tick(self._client, store)
                time.sleep(0.1)
        return depths, flushed

    def _depth(self) -> int:
        """Messages waiting in Celery's default queue, the one new runs go to."""
        if self._amqp is None:
            return self._redis.queue_length("celery")
        from cairn.workers import broker

        try:
            declared = self._amqp.default_channel.queue_declare(broker.RUNS, passive=True)
            count: int = declared.message_count
            return count
        except self._amqp.channel_errors:  # not declared yet
            self._amqp.close()  # the failed declare closed its channel
            return 0

    def _report(
        self,
        flow: Workflow,
        killer: OutsideKiller,
        elapsed: float,
        depths: list[int],
        flushed: bool,
        life: Lifecycle,
        ids: list[str],
    ) -> dict[str, Any]:
        """Collect what the database, the workers' journal and the mail API recorded."""
        c, crew = self.config, self._crew
        assert crew is not None and self._mail is not None
        assert self._db_url is not None
        history, final = read_history(self._db_url)
        journal = read_journal(str(self._faults_dir))
        inside = [r for r in journal if r["e"] == "kill"]
        attempts: dict[str, int] = defaultdict(int)
        for r in journal:
            if r["e"] == "attempt":
                attempts[r["cursor"]] += 1
        flush_warning = f"the Redis database {c.redis_url} was flushed by another process"
        report = build_report(
            c,
            # A deploy's new code may have steps the old one lacks (a renamed one).
            flow_steps=[*flow.steps, *(s for s in attempts if c.deploy and s not in flow.steps)],
            elapsed=elapsed,
            final=final,
            history=history,
            kills=inside + killer.kills,
            attempts=attempts,
            events=self._mail.events(),
            queue_depths=depths,
            warnings=crew.warnings + ([flush_warning] if flushed else []),
            lifecycle=life,
            model_requests=int(self._model.stats()["requests"]),
            journaled=read_journal_counts(self._db_url),
            pauses=self._pauser.pauses,
        )
        # What Postgres and Redis hold, against each other: no graph thread forked, and
        # every run's live stream tells the steps its history saved.
        report["graph"], problems = chaos_record.forks(self._db_url)
        report["forks"] = report["graph"]["forks"]
        report["problems"] += problems
        report["stream"], problems, notes = chaos_record.streams(self._db_url, c.redis_url)
        report["stream_mismatches"] = report["stream"]["mismatches"]
        report["problems"] += problems
        report["warnings"] += notes
        if c.keys or c.deploy:  # a deploy's stops must leave no slot behind either
            report["keys"], problems = chaos_keys.verdict(self._db_url, c.key_limit)
            report["problems"] += problems
        if c.replay_failed:
            report["replay_failed"], problems = chaos_replay.verdict(ids, *self._replayed, history)
            report["problems"] += problems
        if self._deployer is not None:
            report["deploy"], problems = chaos_deploy.verdict(
                final, chaos_deploy.read_versions(self._db_url), self._deployer.swaps
            )
            report["deploy"]["module"] = c.deploy
            report["problems"] += problems
        report["ok"] = not report["problems"]
        return report

    def close(self) -> None:
        """Kill the processes, stop the stand-ins, close clients, drop the database."""
        from cairn.core.errors import CairnError

        self._pauser.resume()
        if self._crew is not None:
            self._crew.kill()
        for server in (self._mail, self._model):
            if server is not None:
                server.stop()
        if self._client is not None:
            self._client.close()
        if self._leases is not None:
            self._leases.client.close()
        self._redis.close()
        if self._amqp is not None:
            self._amqp.close()
        if self._db_url is not None and not self.config.keep:
            try:
                drop_database(self.config.base_db, self.config.db_name)
            except CairnError as exc:  # pragma: no cover
                self._say(f"could not drop {self.config.db_name}: {exc}")
