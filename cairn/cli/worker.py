"""`cairn worker` and `cairn beat`: the fleet's processes."""

from __future__ import annotations

import enum
import os
import tempfile
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cairn.cli.common import (
    UNREACHABLE,
    DatabaseUrl,
    LogLevel,
    RedisUrl,
    Workflows,
    console,
    fail,
    load_settings,
)

if TYPE_CHECKING:
    from cairn.core.settings import Settings

app = typer.Typer()

Pool = enum.Enum("Pool", {"prefork": "prefork", "threads": "threads"}, type=str)


@app.command()
def worker(
    pool: Annotated[
        Pool | None,
        typer.Option(
            "--pool",
            "-P",
            envvar="CAIRN_POOL",
            help="prefork: a process per run. threads: many runs per process, for runs "
            "that wait on the model [prefork].",
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            "-c",
            envvar="CAIRN_CONCURRENCY",
            min=1,
            help="Runs at once: processes (prefork) or threads [2].",
        ),
    ] = None,
    beat: Annotated[
        bool,
        typer.Option(
            "--beat", help="Also run the reaper/sweep schedule (run it on one worker only)."
        ),
    ] = False,
    drain: Annotated[
        bool,
        typer.Option(
            "--drain",
            help="Take no new run: consume only this code version's queue, where the runs "
            'pinned to it (versions="pin") come back, to finish them.',
        ),
    ] = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Check instead of starting: Postgres, Redis and the broker answer, and no "
            "payload key a worker lacked lately is missing from CAIRN_PAYLOAD_KEYS here. "
            "Prints ok (exit 0) or what is wrong (exit 1): a probe for a worker's container.",
        ),
    ] = False,
    loglevel: LogLevel = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name", "-n", help="Celery node name [cairn-<pid>@<host>: unique per worker]."
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            envvar="CAIRN_METRICS_PORT",
            help="Serve Prometheus metrics on this port (0: off) [0].",
        ),
    ] = None,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    workflows: Workflows = None,
) -> None:
    """Start a Celery worker that runs cairn runs (start as many as you like)."""
    settings = load_settings(
        pool=pool.value if pool else None,
        concurrency=concurrency,
        loglevel=loglevel,
        metrics_port=metrics_port,
        database_url=database_url,
        redis_url=redis_url,
        workflows=workflows,
    )
    if check:
        from cairn.workers import health

        down = health.problems(settings)
        if down:
            fail("the worker is not healthy: " + "; ".join(down))
        console.print("ok")
        return
    if settings.metrics_port:
        # prometheus_client's multiprocess mode is chosen by this variable, read when it
        # is first imported: set it before the app (and its metrics module) loads.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="cairn-metrics-")
    from cairn.workers import metrics

    celery_app = _celery_app(settings, "the worker")
    if settings.metrics_port:
        metrics.serve(settings.metrics_port)
    argv = [
        # JSON logs: no banner, for a collector that reads only JSON lines.
        *(["--quiet"] if settings.log_format == "json" else []),
        "worker",
        f"--pool={settings.pool}",
        f"--concurrency={settings.concurrency}",
        f"--loglevel={settings.loglevel}",
        "-n",
        name or f"cairn-{os.getpid()}@%h",
    ]
    if drain:
        from cairn.workers import broker

        version = celery_app.cairn.settings.code_version
        argv += ["-Q", f"{broker.CONTROL},{broker.pinned_queue(version)}"]
    celery_app.worker_main([*argv, *(["--beat"] if beat else [])])


@app.command("beat")
def beat_cmd(
    loglevel: LogLevel = None,
    schedule: Annotated[
        str, typer.Option("--schedule", envvar="CAIRN_BEAT_SCHEDULE", help="Beat's schedule file.")
    ] = ".cairn/beat-schedule",
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
) -> None:
    """Run the schedule: the reaper (every CAIRN_REAPER_INTERVAL s) and the hourly sweep."""
    settings = load_settings(loglevel=loglevel, database_url=database_url, redis_url=redis_url)
    try:
        os.makedirs(os.path.dirname(schedule) or ".", exist_ok=True)
    except OSError as exc:
        fail(f"--schedule {schedule!r}: cannot make its folder ({exc.strerror})", 2)
    celery_app = _celery_app(settings, "the beat")
    quiet = ["--quiet"] if settings.log_format == "json" else []  # no banner (cf. worker)
    celery_app.start([*quiet, "beat", f"--loglevel={settings.loglevel}", f"--schedule={schedule}"])


def _celery_app(settings: Settings, who: str) -> Any:
    """The worker's Celery app, once Postgres, Redis and the broker answer; else one line
    saying what is down (a beat would otherwise retry the broker for ever)."""
    from cairn.core.errors import CairnError
    from cairn.workers import health
    from cairn.workers.app import create_app

    down = health.problems(settings)
    if down:
        fail(f"{who} cannot start: " + "; ".join(down) + UNREACHABLE)
    try:
        return create_app(settings)
    except (CairnError, ValueError, TypeError) as exc:  # CAIRN_WORKFLOWS, CAIRN_MIDDLEWARE
        fail(f"{who} cannot start: {exc}")
