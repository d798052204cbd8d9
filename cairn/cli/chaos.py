"""The `cairn chaos WORKFLOW` command: its options, errors as exit code 2, and the verdict
as exit code 1 when not OK."""

from __future__ import annotations

import enum
import json
import re
from typing import Annotated

import typer

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


def register(app: typer.Typer) -> None:
    """Add the `chaos` command to the cairn Typer app."""

    @app.command("chaos")
    def chaos(
        workflow: Annotated[str, typer.Argument(help="Registered workflow name, e.g. invoice.")],
        runs: Annotated[int, typer.Option("--runs", help="Runs to enqueue.")] = 20,
        workers: Annotated[int, typer.Option("--workers", help="Worker processes to start.")] = 2,
        input: Annotated[
            str | None,
            typer.Option(
                "--input",
                help='Each run\'s input as a JSON object; "{i}" in a string becomes the '
                "run's index. Default for invoice: a customer and email per run.",
            ),
        ] = None,
        seed: Annotated[
            int | None,
            typer.Option(
                "--seed", help="Seed of the kill schedule (random if unset; printed for replay)."
            ),
        ] = None,
        rate: Annotated[
            float,
            typer.Option(
                "--rate", help="Probability that a given step boundary of a run is killed."
            ),
        ] = 0.03,
        kill: Annotated[
            list[str] | None,
            typer.Option(
                "--kill",
                help="Also kill at RUN_ID:SEQ:BOUNDARY, or RUN_ID:SEQ:before_call:POS "
                "(after_call too) around a step's POS-th journaled call (repeatable).",
            ),
        ] = None,
        random_kills: Annotated[
            int | None,
            typer.Option(
                "--random-kills",
                help="Kills from outside (a busy pool child; every 4th or so a "
                "whole worker). Default: runs/25, at least 2.",
            ),
        ] = None,
        pauses: Annotated[
            int,
            typer.Option(
                "--pauses",
                min=0,
                help="Also SIGSTOP this many times a process holding a run's lease (a pool "
                "child; every 3rd or so a whole worker) for 1.5-2.5 lease TTLs, then SIGCONT "
                "it: a zombie that wakes after another worker took its run over.",
            ),
        ] = 0,
        concurrency: Annotated[
            int, typer.Option("--concurrency", help="Pool processes (or threads) per worker.")
        ] = 2,
        pool: Annotated[
            Pool,
            typer.Option(
                "--pool",
                help="The workers' pool. threads: a kill takes the whole worker with all "
                "its runs, and a new worker is started.",
            ),
        ] = Pool.prefork,
        lease_ttl: Annotated[
            float,
            typer.Option(
                "--lease-ttl",
                help="CAIRN_LEASE_TTL for the workers (shorter than the usual 10s "
                "so recovery is quick).",
            ),
        ] = 3.0,
        deadline: Annotated[
            float,
            typer.Option(
                "--deadline", help="Seconds after which an unfinished run counts as lost."
            ),
        ] = 300.0,
        signals: Annotated[
            bool,
            typer.Option(
                "--signals",
                help="Invoice runs wait for a payment signal, sent by chaos (some before the "
                "run waits, some twice with one id); a signal lost fails the verdict.",
            ),
        ] = False,
        cancel_rate: Annotated[
            float,
            typer.Option(
                "--cancel-rate",
                help="Share of runs cancelled while they run; a send after a cancel fails "
                "the verdict.",
            ),
        ] = 0.0,
        keys: Annotated[
            int,
            typer.Option(
                "--keys",
                min=0,
                help="Spread the runs over this many concurrency keys (0: none); a key with "
                "more runs at once than --key-limit, or a slot left held, fails the verdict.",
            ),
        ] = 0,
        key_limit: Annotated[
            int, typer.Option("--key-limit", min=1, help="Each key's runs at a time.")
        ] = 1,
        replay_failed: Annotated[
            bool,
            typer.Option(
                "--replay-failed",
                help="The mail API refuses every send until all runs failed, then "
                "`Client.replay` replays them (under the same kills); a run not done, replayed "
                "twice, or an email sent twice fails the verdict.",
            ),
        ] = False,
        keep: Annotated[
            bool, typer.Option("--keep", help="Keep the chaos_* database for inspection.")
        ] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
        database_url: Annotated[
            str | None,
            typer.Option(
                "--database-url",
                envvar="CAIRN_DATABASE_URL",
                help="Postgres server to create the fresh chaos_* database on.",
                show_default=False,
            ),
        ] = None,
        redis_url: Annotated[
            str | None,
            typer.Option(
                "--redis-url",
                help="Redis database for broker and leases; FLUSHED at start. "
                f"Default: CAIRN_REDIS_URL's server, database {CHAOS_REDIS_DB}.",
            ),
        ] = None,
        broker_url: Annotated[
            str | None,
            typer.Option(
                "--broker-url",
                help="A RabbitMQ vhost (amqp://) to use as the broker instead of Redis; "
                "cairn's queues there are DELETED at start.",
                show_default=False,
            ),
        ] = None,
        workflows: Annotated[
            str,
            typer.Option(
                "--workflows",
                envvar="CAIRN_WORKFLOWS",
                help="Comma-separated modules to import so their workflows register.",
            ),
        ] = "",
    ) -> None:
        """Kill workers at every step boundary while N runs work; report what broke."""
        from cairn.cli import _fail  # the one way cairn's commands report an error
        from cairn.core.errors import CairnError

        try:
            data = None if input is None else json.loads(input)
        except json.JSONDecodeError as exc:
            _fail(f'--input is not JSON ({exc}); pass an object like \'{{"topic": "t{{i}}"}}\'', 2)
        try:
            points = [_parse_kill(k) for k in kill or []]
        except ValueError as exc:
            _fail(exc, 2)
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
                database_url=database_url,
                redis_url=redis_url,
                broker_url=broker_url,
                workflows=workflows,
                quiet=as_json,
            )
        except CairnError as exc:
            _fail(exc, 2)
        if as_json:
            print(json.dumps(report, default=str))
        else:
            print_report(report)
        if not report["ok"]:
            raise typer.Exit(1)
