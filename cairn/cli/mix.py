"""The `cairn chaos mix` command: programs of operations with faults mixed in, on a fleet
of its own, until its budget is spent; exit 1 with the shrunk program of what it found."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cairn.cli.common import fail

Seed = Annotated[
    int | None,
    typer.Option(
        "--seed",
        envvar="CAIRN_MIX_SEED",
        help="Seed of the programs (random if unset; printed, to replay them).",
        show_default=False,
    ),
]
Budget = Annotated[
    float,
    typer.Option(
        "--budget",
        envvar="CAIRN_MIX_BUDGET",
        min=1.0,
        help="Seconds of programs (the fleet's start and the shrinking not counted).",
    ),
]
Long = Annotated[bool, typer.Option("--long", help="An hour of programs (--budget 3600).")]
Workflows = Annotated[
    str,
    typer.Option(
        "--workflows",
        envvar="CAIRN_WORKFLOWS",
        help="Your workflow modules: the programs enqueue their workflows (with --input) "
        "instead of the mix's own, and act on them with the operations any run takes.",
    ),
]
Input = Annotated[
    str | None,
    typer.Option(
        "--input",
        help='Your workflows\' input as a JSON object; "{i}" in a string becomes a '
        "marker the mix looks for in clear in Postgres and Redis. Default: {}.",
        show_default=False,
    ),
]
Replay = Annotated[
    Path | None,
    typer.Option(
        "--replay",
        help="Run this program (a file the mix wrote when it found something) once again.",
        show_default=False,
    ),
]
KeepGoing = Annotated[
    bool,
    typer.Option(
        "--keep-going",
        help="After a finding, shrink it and go on looking for other kinds until the budget "
        "is spent.",
    ),
]
ShrinkBudget = Annotated[
    float, typer.Option("--shrink-budget", min=0.0, help="Seconds at most to shrink a finding.")
]
Workers = Annotated[int, typer.Option("--workers", min=2, help="Worker processes.")]
Concurrency = Annotated[int, typer.Option("--concurrency", min=1, help="Pool processes each.")]
LeaseTtl = Annotated[float, typer.Option("--lease-ttl", min=1.0, help="CAIRN_LEASE_TTL.")]
Keep = Annotated[bool, typer.Option("--keep", help="Keep the mix_* database for inspection.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the report as JSON.")]
DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="CAIRN_DATABASE_URL",
        help="Postgres server to create the fresh mix_* database on.",
        show_default=False,
    ),
]
RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        help="Redis database for the broker and the leases; FLUSHED at start. Default: "
        "CAIRN_REDIS_URL's server, database 13 (the one `cairn chaos` uses).",
        show_default=False,
    ),
]


def mix(
    seed: Seed = None,
    budget: Budget = 300.0,
    long: Long = False,
    workflows: Workflows = "",
    input: Input = None,
    replay: Replay = None,
    keep_going: KeepGoing = False,
    shrink_budget: ShrinkBudget = 180.0,
    workers: Workers = 2,
    concurrency: Concurrency = 2,
    lease_ttl: LeaseTtl = 2.0,
    keep: Keep = False,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
) -> None:
    """Programs of operations and faults on a fleet, checked against invariants."""
    from rich.console import Console

    from cairn.core.errors import CairnError
    from cairn.testing.mix.report import print_report
    from cairn.testing.mix.runner import fleet_options, run_mix

    try:
        template = json.loads(input) if input is not None else {}
    except json.JSONDecodeError as exc:
        fail(
            f'--input is not JSON ({exc}); pass an object like \'{{"email": "u{{i}}@example.com"}}\'',
            2,
        )
    if not isinstance(template, dict):
        fail("--input must be a JSON object", 2)
    if replay is not None and not replay.is_file():
        fail(f"--replay {replay}: no such file (the mix writes one per finding)", 2)
    err = Console(stderr=True, quiet=as_json)
    try:
        options = fleet_options(
            database_url=database_url, redis_url=redis_url, workflows=workflows,
            workers=workers, concurrency=concurrency, lease_ttl=lease_ttl, keep=keep,
        )  # fmt: skip
        report = run_mix(
            options, seed=seed, budget=3600.0 if long else budget, shrink_budget=shrink_budget,
            keep_going=keep_going, replay=replay, template=template, say=err.print,
        )  # fmt: skip
    except (CairnError, ValueError) as exc:
        fail(exc, 2)
    if as_json:
        print(json.dumps(report, default=str))
    else:
        print_report(report)
    if not report["ok"]:
        raise typer.Exit(1)
