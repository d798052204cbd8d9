"""`cairn`: run workers, enqueue and inspect runs, upgrade the schema, run the demo."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="Durable multi-step LLM agent runs on Celery + Postgres + Redis.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals could hold URLs with passwords
)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")
console = Console()
err = Console(stderr=True)

DatabaseUrl = Annotated[
    str,
    typer.Option(
        "--database-url", envvar="CAIRN_DATABASE_URL", help="Postgres URL of the checkpoint store."
    ),
]
RedisUrl = Annotated[
    str, typer.Option("--redis-url", envvar="CAIRN_REDIS_URL", help="Redis URL (leases, broker).")
]
Workflows = Annotated[
    str,
    typer.Option(
        "--workflows",
        envvar="CAIRN_WORKFLOWS",
        help="Comma-separated modules to import so their workflows register.",
    ),
]
_DB_DEFAULT = "postgresql://postgres@127.0.0.1:54329/cairn"
_REDIS_DEFAULT = "redis://127.0.0.1:63790/0"


def _env(
    database_url: str | None = None, redis_url: str | None = None, workflows: str | None = None
) -> None:
    """Options win over the environment; workers.app reads the environment once."""
    for name, value in (
        ("CAIRN_DATABASE_URL", database_url),
        ("CAIRN_REDIS_URL", redis_url),
        ("CAIRN_WORKFLOWS", workflows),
    ):
        if value:
            os.environ[name] = value


def _fail(message: str, code: int = 1) -> None:
    err.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


@app.command()
def worker(
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency", "-c", envvar="CAIRN_CONCURRENCY", help="Processes in the pool."
        ),
    ] = 2,
    beat: Annotated[
        bool,
        typer.Option(
            "--beat", help="Also run the reaper/sweep schedule (run it on one worker only)."
        ),
    ] = False,
    loglevel: Annotated[
        str, typer.Option("--loglevel", envvar="CAIRN_LOGLEVEL", help="Log level.")
    ] = "INFO",
    name: Annotated[str, typer.Option("--name", "-n", help="Celery node name.")] = "cairn@%h",
    metrics_port: Annotated[
        int,
        typer.Option(
            "--metrics-port",
            envvar="CAIRN_METRICS_PORT",
            help="Serve Prometheus metrics on this port (0: off).",
        ),
    ] = 0,
    database_url: DatabaseUrl = _DB_DEFAULT,
    redis_url: RedisUrl = _REDIS_DEFAULT,
    workflows: Workflows = "",
) -> None:
    """Start a Celery worker that runs cairn runs (start as many as you like)."""
    _env(database_url, redis_url, workflows)
    if metrics_port:
        # Multiprocess mode must be chosen before prometheus_client is first imported.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="cairn-metrics-")
    from workers import metrics
    from workers.app import app as celery_app

    if metrics_port:
        metrics.serve(metrics_port)
    argv = ["worker", f"--concurrency={concurrency}", f"--loglevel={loglevel}", "-n", name]
    celery_app.worker_main([*argv, *(["--beat"] if beat else [])])


@app.command("beat")
def beat_cmd(
    loglevel: Annotated[
        str, typer.Option("--loglevel", envvar="CAIRN_LOGLEVEL", help="Log level.")
    ] = "INFO",
    schedule: Annotated[
        str, typer.Option("--schedule", help="Beat's schedule file.")
    ] = ".cairn/beat-schedule",
    database_url: DatabaseUrl = _DB_DEFAULT,
    redis_url: RedisUrl = _REDIS_DEFAULT,
) -> None:
    """Run the schedule: the reaper (every CAIRN_REAPER_INTERVAL s) and the hourly sweep."""
    _env(database_url, redis_url)
    from workers.app import app as celery_app

    os.makedirs(os.path.dirname(schedule) or ".", exist_ok=True)
    celery_app.start(["beat", f"--loglevel={loglevel}", f"--schedule={schedule}"])


@app.command()
def enqueue(
    workflow: Annotated[str, typer.Argument(help="Registered workflow name, e.g. invoice.")],
    input: Annotated[str, typer.Argument(help="The run's input as a JSON object.")] = "{}",
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="Explicit run id; an existing one resumes.")
    ] = None,
    database_url: DatabaseUrl = _DB_DEFAULT,
    redis_url: RedisUrl = _REDIS_DEFAULT,
    workflows: Workflows = "",
) -> None:
    """Enqueue a run and print its id."""
    _env(database_url, redis_url, workflows)
    try:
        data = json.loads(input)
    except json.JSONDecodeError as exc:
        _fail(f'input is not JSON ({exc}); pass an object like \'{{"customer": "acme"}}\'', 2)
    from store import CairnError
    from workers.client import enqueue as do_enqueue

    try:
        console.print(do_enqueue(workflow, data, run_id=run_id))
    except CairnError as exc:
        _fail(str(exc), 2)


def _store() -> Any:
    from workers.client import store

    return store()


@app.command()
def runs(
    status: Annotated[
        str | None, typer.Option("--status", help="pending, running, done or failed.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="Rows to show.")] = 30,
    database_url: DatabaseUrl = _DB_DEFAULT,
) -> None:
    """List runs, newest first."""
    _env(database_url)
    table = Table("workflow", "status", "cursor", "seq", "cost $", "resumes", "updated")
    table.add_column("run", no_wrap=True)
    for r in _store().list_runs(status, limit):
        colour = {"done": "green", "failed": "red", "running": "yellow"}.get(r["status"], "")
        table.add_row(
            r["workflow"],
            f"[{colour}]{r['status']}[/]" if colour else r["status"],
            r["cursor"],
            str(r["seq"]),
            f"{r['cost_usd']:.6f}",
            str(r["resumes"]),
            r["updated_at"].strftime("%H:%M:%S"),
            r["run_id"],
        )
    console.print(table)


@app.command()
def show(
    run_id: Annotated[str, typer.Argument(help="The run id.")],
    database_url: DatabaseUrl = _DB_DEFAULT,
) -> None:
    """Show one run's checkpoint, its error if it failed, and its window size."""
    _env(database_url)
    from store import CairnError

    row = _store().load_row(run_id)
    if row is None:
        _fail(f"no run {run_id!r}")
    for key in (
        "run_id",
        "workflow",
        "status",
        "cursor",
        "seq",
        "version",
        "epoch",
        "resumes",
        "cost_usd",
        "updated_at",
    ):
        console.print(f"[bold]{key:>10}[/] {row[key]}")
    if row["error"]:
        console.print(f"[bold red]{'error':>10}[/] {row['error']}")
    console.print(
        f"[bold]{'window':>10}[/] {len(row['window'])} messages (from index {row['win_start']})"
    )
    console.print(f"[bold]{'input':>10}[/] {json.dumps(row['input'])}")
    console.print(f"[bold]{'state':>10}[/] {json.dumps(row['state'], default=str)}")
    try:
        _store().load(run_id)
    except CairnError as exc:
        console.print(f"[bold red]{'unreadable':>10}[/] {exc}")


@db_app.command("upgrade")
def db_upgrade(database_url: DatabaseUrl = _DB_DEFAULT) -> None:
    """Apply pending schema migrations."""
    from store import StoreUnavailable, upgrade

    try:
        applied = upgrade(database_url)
    except StoreUnavailable as exc:
        _fail(f"{exc}\nIs Postgres running? `bash scripts/services.sh up` starts the local one.")
    console.print(f"applied migrations: {applied}" if applied else "schema is up to date")


@app.command()
def demo(
    runs: Annotated[int, typer.Option("--runs", help="Invoice runs to enqueue.")] = 20,
    workers: Annotated[int, typer.Option("--workers", help="Worker processes to start.")] = 2,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the summary as one JSON object.")
    ] = False,
    database_url: DatabaseUrl = _DB_DEFAULT,
    redis_url: RedisUrl = _REDIS_DEFAULT,
) -> None:
    """A fleet of workers doing invoice runs; workers are SIGKILLed mid-run; effects counted."""
    _env(database_url, redis_url)
    from workers.demo import run_demo

    summary = run_demo(runs=runs, workers=workers, quiet=as_json)
    if as_json:
        print(json.dumps(summary))
    if not summary["ok"]:
        raise typer.Exit(1)


@app.command()
def standin(
    kind: Annotated[str, typer.Argument(help="mail or model.")],
    port: Annotated[int, typer.Option("--port", help="Port on 127.0.0.1.")] = 0,
    delay_ms: Annotated[
        int, typer.Option("--delay-ms", help="Latency to add to each request.")
    ] = 0,
) -> None:
    """Run a local stand-in: the mail API, or a server speaking the Anthropic Messages API."""
    from steps import standins

    raise typer.Exit(standins.main([kind, "--port", str(port), "--delay-ms", str(delay_ms)]))


@app.command(
    context_settings={
        "allow_extra_args": True,
        "ignore_unknown_options": True,
        "help_option_names": [],
    }
)
def bench(ctx: typer.Context) -> None:
    """Benchmarks against the floor and the peers (`cairn bench --help` for options)."""
    from bench import main as bench_main

    raise typer.Exit(bench_main(list(ctx.args)))


def _register_plugins() -> None:
    from workers import chaos  # light at import: its heavy imports wait for the command

    chaos.register(app)


def main() -> None:
    from store import CairnError

    _register_plugins()
    try:
        app()
    except CairnError as exc:  # a domain error is the user's to act on, not a traceback
        err.print(f"[bold red]error:[/] {exc}")
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
