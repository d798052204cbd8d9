"""The `cairn chaos WORKFLOW` command: its options, errors as exit code 2, and the verdict
as exit code 1 when not OK; and the group it is the default command of, beside `cairn
chaos mix` (cairn.cli.mix)."""

from __future__ import annotations

import enum
import json
import re
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from cairn.cli.common import fail
from cairn.testing.chaos.config import CHAOS_REDIS_DB
from cairn.testing.chaos.report import print_report
from cairn.testing.chaos.runner import run_chaos
from cairn.testing.faults import BOUNDARIES, CALL_BOUNDARIES

Pool = enum.Enum("Pool", {"prefork": "prefork", "threads": "threads"}, type=str)


# A step boundary, or a call point: a boundary around a journaled call and its position.
_KILL = re.compile(
    rf"(?P<run>.+):(?P<seq>\d+):(?P<point>{'|'.join(BOUNDARIES)}|(?:{'|'.join(CALL_BOUNDARIES)}):\d+)"
)


def _parse_kill(text: str) -> tuple[str, int, str]:
    """RUN_ID:SEQ:BOUNDARY or RUN_ID:SEQ:CALL_BOUNDARY:POS (a run id may contain colons)."""
    m = _KILL.fullmatch(text)
    if m is None:
        raise ValueError(
            f"--kill wants RUN_ID:SEQ:BOUNDARY with BOUNDARY in {BOUNDARIES}, or "
            f"RUN_ID:SEQ:{CALL_BOUNDARIES[0]}:POS ({CALL_BOUNDARIES[1]} too) for a journaled call"
        )
    return m["run"], int(m["seq"]), m["point"]


# The options of `cairn chaos`. Its --json, --database-url and --redis-url are its own, not
# cairn.cli.common's: a report, a server to make a database on, a Redis it flushes.
Workflow = Annotated[str, typer.Argument(help="Registered workflow name, e.g. invoice.")]
Runs = Annotated[int, typer.Option("--runs", help="Runs to enqueue.")]
Workers = Annotated[int, typer.Option("--workers", help="Worker processes to start.")]
Input = Annotated[
    str | None,
    typer.Option(
        "--input",
        help='Each run\'s input as a JSON object; "{i}" in a string becomes the '
        "run's index. Default for invoice: a customer and email per run.",
    ),
]
Seed = Annotated[
    int | None,
    typer.Option("--seed", help="Seed of the kill schedule (random if unset; printed for replay)."),
]
Rate = Annotated[
    float,
    typer.Option("--rate", help="Probability that a given step boundary of a run is killed."),
]
Kill = Annotated[
    list[str] | None,
    typer.Option(
        "--kill",
        help="Also kill at RUN_ID:SEQ:BOUNDARY, or RUN_ID:SEQ:before_call:POS "
        "(after_call too) around a step's POS-th journaled call (repeatable).",
    ),
]
RandomKills = Annotated[
    int | None,
    typer.Option(
        "--random-kills",
        help="Kills from outside (a busy pool child; every 4th or so a "
        "whole worker). Default: runs/25, at least 2.",
    ),
]
Pauses = Annotated[
    int,
    typer.Option(
        "--pauses",
        min=0,
        help="Also SIGSTOP this many times a process holding a run's lease (a pool "
        "child; every 3rd or so a whole worker) for 1.5-2.5 lease TTLs, then SIGCONT "
        "it: a zombie that wakes after another worker took its run over.",
    ),
]
Concurrency = Annotated[
    int, typer.Option("--concurrency", help="Pool processes (or threads) per worker.")
]
PoolOption = Annotated[
    Pool,
    typer.Option(
        "--pool",
        help="The workers' pool. threads: a kill takes the whole worker with all "
        "its runs, and a new worker is started.",
    ),
]
LeaseTtl = Annotated[
    float,
    typer.Option(
        "--lease-ttl",
        help="CAIRN_LEASE_TTL for the workers (shorter than the usual 10s so recovery is quick).",
    ),
]
Deadline = Annotated[
    float,
    typer.Option("--deadline", help="Seconds after which an unfinished run counts as lost."),
]
Signals = Annotated[
    bool,
    typer.Option(
        "--signals",
        help="Invoice runs wait for a payment signal, sent by chaos (some before the "
        "run waits, some twice with one id); a signal lost fails the verdict.",
    ),
]
CancelRate = Annotated[
    float,
    typer.Option(
        "--cancel-rate",
        help="Share of runs cancelled while they run; a send after a cancel fails the verdict.",
    ),
]
Keys = Annotated[
    int,
    typer.Option(
        "--keys",
        min=0,
        help="Spread the runs over this many concurrency keys (0: none); a key with "
        "more runs at once than --key-limit, or a slot left held, fails the verdict.",
    ),
]
KeyLimit = Annotated[int, typer.Option("--key-limit", min=1, help="Each key's runs at a time.")]
ReplayFailed = Annotated[
    bool,
    typer.Option(
        "--replay-failed",
        help="The mail API refuses every send until all runs failed, then "
        "`Client.replay` replays them (under the same kills); a run not done, replayed "
        "twice, or an email sent twice fails the verdict.",
    ),
]
Deploy = Annotated[
    str | None,
    typer.Option(
        "--deploy",
        metavar="NEW_MODULE",
        help="A rolling deploy mid-run: the workers start as CAIRN_CODE_VERSION v1, "
        "then are swapped one at a time (SIGTERM or SIGKILL) for v2 workers that import "
        "NEW_MODULE alone, under the usual kills; half the runs are enqueued once v2 is "
        "up. A run must end done, or incompatible with its reason.",
        show_default=False,
    ),
]
Keep = Annotated[bool, typer.Option("--keep", help="Keep the chaos_* database for inspection.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the report as JSON.")]
DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="CAIRN_DATABASE_URL",
        help="Postgres server to create the fresh chaos_* database on.",
        show_default=False,
    ),
]
RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        help="Redis database for broker and leases; FLUSHED at start. "
        f"Default: CAIRN_REDIS_URL's server, database {CHAOS_REDIS_DB}.",
    ),
]
BrokerUrl = Annotated[
    str | None,
    typer.Option(
        "--broker-url",
        help="A RabbitMQ vhost (amqp://) to use as the broker instead of Redis; "
        "cairn's queues there are DELETED at start.",
        show_default=False,
    ),
]
WorkflowModules = Annotated[
    str,
    typer.Option(
        "--workflows",
        envvar="CAIRN_WORKFLOWS",
        help="Comma-separated modules to import so their workflows register.",
    ),
]


def chaos(
    workflow: Workflow,
    runs: Runs = 20,
    workers: Workers = 2,
    input: Input = None,
    seed: Seed = None,
    rate: Rate = 0.03,
    kill: Kill = None,
    random_kills: RandomKills = None,
    pauses: Pauses = 0,
    concurrency: Concurrency = 2,
    pool: PoolOption = Pool.prefork,
    lease_ttl: LeaseTtl = 3.0,
    deadline: Deadline = 300.0,
    signals: Signals = False,
    cancel_rate: CancelRate = 0.0,
    keys: Keys = 0,
    key_limit: KeyLimit = 1,
    replay_failed: ReplayFailed = False,
    deploy: Deploy = None,
    keep: Keep = False,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
    workflows: WorkflowModules = "",
) -> None:
    """Kill workers at every step boundary while N runs work; report what broke."""
    from cairn.core.errors import CairnError

    try:
        data = None if input is None else json.loads(input)
    except json.JSONDecodeError as exc:
        fail(f'--input is not JSON ({exc}); pass an object like \'{{"topic": "t{{i}}"}}\'', 2)
    try:
        points = [_parse_kill(k) for k in kill or []]
    except ValueError as exc:
        fail(exc, 2)
    try:
        report = run_chaos(
            workflow,
            runs=runs,
            workers=workers,
            input=data,
            seed=seed,
            rate=rate,
            kills=points,
            random_kills=random_kills,
            pauses=pauses,
            concurrency=concurrency,
            pool=pool.value,
            lease_ttl=lease_ttl,
            deadline=deadline,
            keep=keep,
            signals=signals,
            cancel_rate=cancel_rate,
            keys=keys,
            key_limit=key_limit,
            replay_failed=replay_failed,
            deploy=deploy,
            database_url=database_url,
            redis_url=redis_url,
            broker_url=broker_url,
            workflows=workflows,
            quiet=as_json,
        )
    except CairnError as exc:
        fail(exc, 2)
    if as_json:
        print(json.dumps(report, default=str))
    else:
        print_report(report)
    if not report["ok"]:
        raise typer.Exit(1)


class _Chaos(TyperGroup):
    """`cairn chaos mix ...` is the mix; `cairn chaos WORKFLOW ...` (anything else but the
    group's --help) the chaos run of that workflow, its hidden `run` command (a workflow
    named mix: `cairn chaos run mix`)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # typer's own click Context
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


def register(app: typer.Typer) -> None:
    """Add the `chaos` group (`cairn chaos WORKFLOW`, `cairn chaos mix`) to the cairn app."""
    from cairn.cli.mix import mix

    group = typer.Typer(
        cls=_Chaos,
        no_args_is_help=True,
        help="Kill workers at every step boundary while N runs work (cairn chaos WORKFLOW), "
        "or mix operations and faults in generated programs (cairn chaos mix).",
    )
    group.command("run", hidden=True)(chaos)
    group.command("mix")(mix)
    app.add_typer(group, name="chaos")
