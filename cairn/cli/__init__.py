"""`cairn`: run workers, enqueue and inspect runs, upgrade the schema, run the demo."""

from __future__ import annotations

import enum
import json
import os
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from cairn.core.status import CANCEL_REASON, RunStatus

app = typer.Typer(
    help="Durable multi-step LLM agent runs on Celery + Postgres + Redis.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals could hold URLs with passwords
)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")
# `cairn runs` lists runs; `cairn runs fork` and `cairn runs rewind` go back to a step.
runs_app = typer.Typer()
app.add_typer(runs_app, name="runs")

AsJson = Annotated[
    bool, typer.Option("--json", help="Print one JSON document (stable keys) instead of tables.")
]


def _version(value: bool) -> None:
    if value:
        from cairn import __version__

        print(f"cairn {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", callback=_version, is_eager=True
        ),
    ] = False,
) -> None:
    """Durable multi-step LLM agent runs on Celery + Postgres + Redis."""


def _aware(when: datetime | None) -> datetime | None:
    """A time given without a zone is local time."""
    return when.astimezone() if when is not None and when.tzinfo is None else when


def _dumps(value: Any) -> str:
    return json.dumps(value, default=lambda o: o.isoformat() if hasattr(o, "isoformat") else str(o))


console = Console()
err = Console(stderr=True)

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="CAIRN_DATABASE_URL",
        help="Postgres URL of the checkpoint store.",
        show_default=False,
    ),
]
RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        envvar="CAIRN_REDIS_URL",
        help="Redis URL (leases; the broker unless CAIRN_BROKER_URL is set).",
        show_default=False,
    ),
]
Workflows = Annotated[
    str | None,
    typer.Option(
        "--workflows",
        envvar="CAIRN_WORKFLOWS",
        help="Comma-separated modules to import so their workflows register.",
        show_default=False,
    ),
]
LogLevel = Annotated[
    str | None, typer.Option("--loglevel", envvar="CAIRN_LOGLEVEL", help="Log level [INFO].")
]


COLOURS = {RunStatus.DONE: "green", RunStatus.FAILED: "red", RunStatus.RUNNING: "yellow"}
Pool = enum.Enum("Pool", {"prefork": "prefork", "threads": "threads"}, type=str)


def _settings(**options: Any) -> Any:
    """Settings.from_env() with the options that were given on top."""
    from cairn.core.settings import Settings

    workflows = options.pop("workflows", None)
    if workflows is not None:
        options["workflows"] = tuple(m.strip() for m in workflows.split(",") if m.strip())
    try:
        return Settings.from_env().with_options(**options)
    except SystemExit as exc:  # from_env: a CAIRN_* value that does not parse
        _fail(str(exc.code), 2)
    except ValueError as exc:  # a value that parses and means nothing
        _fail(exc, 2)


def _client(settings: Any) -> Any:
    from cairn.client.client import Client

    return Client(settings=settings)


def _fail(problem: str | Exception, code: int = 1) -> NoReturn:
    """The one way a command reports an error: one line on stderr saying what is wrong and
    what to do (never a traceback), then exit with code. An error raised gets the next
    step for its kind."""
    from rich.markup import escape

    message = str(problem) + (_next_step(problem) if isinstance(problem, Exception) else "")
    line = "; ".join(part.strip() for part in message.splitlines() if part.strip())
    # Escaped: an error's text is not markup. soft_wrap: one line at any terminal width.
    err.print(f"[bold red]error:[/] {escape(line)}", soft_wrap=True)
    raise typer.Exit(code)


_UNREACHABLE = "; check CAIRN_DATABASE_URL and CAIRN_REDIS_URL (or --database-url, --redis-url)"


def _next_step(exc: Exception) -> str:
    """What to do about an error of this kind, when its message does not say."""
    from cairn.core.errors import StoreUnavailable, UnknownRun
    from cairn.workers.schedules import UnknownSchedule

    if isinstance(exc, StoreUnavailable):
        return _UNREACHABLE
    if isinstance(exc, UnknownRun):
        return "; `cairn runs` lists the runs"
    if isinstance(exc, UnknownSchedule):
        return "; `cairn schedules list` lists them"
    return ""


def _known(workflow: str) -> None:
    """UnknownWorkflow unless workflow is registered in this process. For the name of one
    of cairn's demos, the message names its module: no process loads them unless told."""
    from cairn.core.errors import UnknownWorkflow
    from cairn.steps import registry
    from cairn.testing import demos

    try:
        registry.get(workflow)
    except UnknownWorkflow as exc:
        if workflow not in demos.WORKFLOWS:
            raise
        hint = f"cairn's demo {workflow!r} is the module {demos.WORKFLOWS[workflow]}"
        raise UnknownWorkflow(f"{exc} ({hint})") from None


def _need_server(command: str) -> None:
    """Fail, naming the extra, when the HTTP server's packages are not installed: a plain
    `pip install cairn` (a web app's Client, a worker) leaves them out."""
    from importlib.util import find_spec

    from rich.markup import escape

    missing = [m for m in ("fastapi", "uvicorn", "jinja2") if find_spec(m) is None]
    if missing:
        said = escape(f"{command} needs {', '.join(missing)}: pip install 'cairn[server]'")
        err.print(f"[bold red]error:[/] {said}", soft_wrap=True)  # the command on one line
        raise typer.Exit(1)


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
    settings = _settings(
        pool=pool.value if pool else None,
        concurrency=concurrency,
        loglevel=loglevel,
        metrics_port=metrics_port,
        database_url=database_url,
        redis_url=redis_url,
        workflows=workflows,
    )
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
    celery_app.worker_main([*argv, *(["--beat"] if beat else [])])


def _celery_app(settings: Any, who: str) -> Any:
    """The worker's Celery app, once Postgres, Redis and the broker answer; else one line
    saying what is down (a beat would otherwise retry the broker for ever)."""
    from cairn.core.errors import CairnError
    from cairn.workers import health
    from cairn.workers.app import create_app

    down = health.problems(settings)
    if down:
        _fail(f"{who} cannot start: " + "; ".join(down) + _UNREACHABLE)
    try:
        return create_app(settings)
    except (CairnError, ValueError, TypeError) as exc:  # CAIRN_WORKFLOWS, CAIRN_MIDDLEWARE
        _fail(f"{who} cannot start: {exc}")


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
    settings = _settings(loglevel=loglevel, database_url=database_url, redis_url=redis_url)
    try:
        os.makedirs(os.path.dirname(schedule) or ".", exist_ok=True)
    except OSError as exc:
        _fail(f"--schedule {schedule!r}: cannot make its folder ({exc.strerror})", 2)
    celery_app = _celery_app(settings, "the beat")
    quiet = ["--quiet"] if settings.log_format == "json" else []  # no banner (cf. worker)
    celery_app.start([*quiet, "beat", f"--loglevel={settings.loglevel}", f"--schedule={schedule}"])


@app.command()
def enqueue(
    workflow: Annotated[str, typer.Argument(help="Registered workflow name, e.g. invoice.")],
    input: Annotated[
        str | None, typer.Argument(help="The run's input as a JSON object [{}].")
    ] = None,
    input_file: Annotated[
        str | None,
        typer.Option("--input-file", help="Read the input from this file, or - for stdin."),
    ] = None,
    run_id: Annotated[
        str | None,
        typer.Option(
            "--run-id", help="Explicit run id (letters, digits, ._:@+=/-); an existing one resumes."
        ),
    ] = None,
    concurrency_key: Annotated[
        str | None,
        typer.Option(
            "--concurrency-key",
            help="At most --concurrency-limit runs of the workflow with this key at a time.",
        ),
    ] = None,
    concurrency_limit: Annotated[
        int | None,
        typer.Option("--concurrency-limit", help="Runs per key at a time [the workflow's, or 1]."),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option("--priority", help="-100..100, higher starts first [the workflow's, or 0]."),
    ] = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    workflows: Workflows = None,
) -> None:
    """Enqueue a run and print its id."""
    settings = _settings(database_url=database_url, redis_url=redis_url, workflows=workflows)
    if input is not None and input_file is not None:
        _fail("give the input as an argument or with --input-file, not both", 2)
    if input_file is not None:
        try:
            input = sys.stdin.read() if input_file == "-" else Path(input_file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            _fail(f"cannot read the input: {exc}", 2)
    try:
        data = json.loads(input if input is not None else "{}")
    except json.JSONDecodeError as exc:
        _fail(f'input is not JSON ({exc}); pass an object like \'{{"customer": "acme"}}\'', 2)
    from cairn.core.errors import CairnError
    from cairn.steps import registry

    try:
        # At a terminal, a typo should fail here, not on a worker: the CLI knows the
        # workflows of --workflows (a web app's Client needs only the name).
        registry.import_modules(settings.workflows)
        _known(workflow)
        with _client(settings) as client:
            created = client.enqueue(
                workflow, data, run_id=run_id, concurrency_key=concurrency_key,
                concurrency_limit=concurrency_limit, priority=priority,
            )  # fmt: skip
        print(_dumps({"run_id": created}) if as_json else created)
    except CairnError as exc:
        _fail(exc, 2)


@runs_app.callback(invoke_without_command=True)
def runs(
    ctx: typer.Context,
    status: Annotated[
        RunStatus | None, typer.Option("--status", help="Only runs in this status.")
    ] = None,
    workflow: Annotated[
        str | None, typer.Option("--workflow", help="Only runs of this workflow.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="Rows to show.", min=1, max=10_000)] = 30,
    after: Annotated[
        str | None,
        typer.Option("--after", help="The last run id of the previous page: show the next."),
    ] = None,
    since: Annotated[
        datetime | None, typer.Option("--since", help="Only runs created at or after this.")
    ] = None,
    until: Annotated[
        datetime | None, typer.Option("--until", help="Only runs created before this.")
    ] = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """List runs, newest first, a page at a time, with the totals by status."""
    if ctx.invoked_subcommand is not None:
        return
    with _client(_settings(database_url=database_url)) as client:
        found = client.list(
            status,
            limit,
            workflow=workflow,
            after=after,
            since=_aware(since),
            until=_aware(until),
        )
        totals = client.counts()
    following = found[-1].run_id if len(found) == limit else None
    if as_json:
        print(
            _dumps(
                {"runs": [r.to_json() for r in found], "totals": totals, "next_after": following}
            )
        )
        return
    table = Table("workflow", "status", "cursor", "seq", "cost $", "resumes", "updated")
    table.add_column("run", no_wrap=True)
    for r in found:
        colour = COLOURS.get(r.status, "")
        table.add_row(
            r.workflow,
            f"[{colour}]{r.status}[/]" if colour else r.status,
            r.cursor,
            str(r.seq),
            f"{r.cost_usd:.6f}",
            str(r.resumes),
            r.updated_at.strftime("%Y-%m-%d %H:%M:%S"),
            r.run_id,
        )
    console.print(table)
    console.print(
        "totals: " + " · ".join(f"{s} {n}" for s, n in sorted(totals.items()))
        if totals
        else "no runs yet"
    )
    if following:
        console.print(f"next page: cairn runs --after {following}")


@runs_app.command("fork")
def fork_cmd(
    run_id: Annotated[str, typer.Argument(help="The run to fork.")],
    at: Annotated[
        int,
        typer.Option(
            "--at",
            min=1,
            help="The checkpoint to go on from: the one the step `cairn show` lists at seq N-1 saved.",
        ),
    ],
    new_run_id: Annotated[
        str | None, typer.Option("--run-id", help="The new run's id [a new one].")
    ] = None,
    input_patch: Annotated[
        str | None,
        typer.Option("--input-patch", help="JSON object merged into the run's input."),
    ] = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Start a new run from a step another run saved (the original is not touched)."""
    from cairn.core.errors import CairnError

    try:
        patch = json.loads(input_patch) if input_patch is not None else None
    except json.JSONDecodeError as exc:
        _fail(f"--input-patch is not JSON ({exc})", 2)
    try:
        with _client(_settings(database_url=database_url)) as client:
            new = client.fork(run_id, at_seq=at, new_run_id=new_run_id, input_patch=patch)
    except CairnError as exc:
        _fail(exc, 2)
    print(_dumps({"run_id": new, "forked_from": run_id, "forked_at": at}) if as_json else new)


@runs_app.command("rewind")
def rewind_cmd(
    run_id: Annotated[str, typer.Argument(help="The stopped run to move back.")],
    to: Annotated[
        int,
        typer.Option(
            "--to",
            min=1,
            help="The checkpoint to go back to: the one the step `cairn show` lists at seq N-1 saved.",
        ),
    ],
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Move a stopped run back to a step it saved, in place, and send it on."""
    from cairn.core.errors import CairnError

    try:
        with _client(_settings(database_url=database_url)) as client:
            run = client.rewind(run_id, to_seq=to)
    except CairnError as exc:
        _fail(exc, 2)
    if as_json:
        print(_dumps(run.to_json()))
    else:
        print(f"{run_id}: rewound to seq {to}, now {run.status} at {run.cursor!r} (seq {run.seq})")


class Replayable(enum.StrEnum):
    failed = "failed"
    incompatible = "incompatible"


@runs_app.command("replay")
def replay_cmd(
    workflow: Annotated[str, typer.Argument(help="Whose runs to replay.")],
    since: Annotated[
        datetime,
        typer.Option("--since", help="Runs that stopped at or after this (local time if no zone)."),
    ],
    until: Annotated[
        datetime | None,
        typer.Option("--until", help="And before this (default: now)."),
    ] = None,
    status: Annotated[
        list[Replayable] | None,
        typer.Option("--status", help="Which stopped runs, repeat for both (default: failed)."),
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="At most N runs.")] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only list what would be replayed.")
    ] = False,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Replay a workflow's failed runs: each goes on from its last saved step."""
    from rich.progress import Progress

    from cairn.core.errors import CairnError

    statuses = tuple(status or [Replayable.failed])
    try:
        with (
            _client(_settings(database_url=database_url)) as client,
            # Off unless at a terminal: elsewhere its one frame is a stray blank line.
            Progress(
                console=err, transient=True, disable=as_json or dry_run or not err.is_terminal
            ) as bar,
        ):
            task = bar.add_task("replaying", total=limit)
            runs = client.replay(
                workflow, since=_aware(since), until=_aware(until), status=statuses,
                limit=limit, dry_run=dry_run, progress=lambda n: bar.update(task, completed=n),
            )  # fmt: skip
    except CairnError as exc:
        _fail(exc, 2)
    if as_json:
        print(
            _dumps({"workflow": workflow, "dry_run": dry_run, "runs": [r.to_json() for r in runs]})
        )
        return
    for r in runs:
        error = (r.error or "").splitlines()[0][:80] if r.error else ""
        console.print(f"{r.run_id}  {r.status} at {r.cursor!r}  {error}", markup=False)
    verb = "would replay" if dry_run else "replayed"
    console.print(f"{verb} {len(runs)} {workflow} run(s)", markup=False)


@app.command()
def show(
    run_id: Annotated[str, typer.Argument(help="The run id.")],
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Show one run: its checkpoint, its error, its window size and its step timeline."""
    from cairn.core.errors import CairnError

    client = _client(_settings(database_url=database_url))
    if as_json:
        with client:
            run = client.get(run_id)
            if run is None:
                _fail(f"no run {run_id!r}; `cairn runs` lists the runs")
            kids = [k.to_json() for k in client.children(run_id)]
            print(_dumps({"run": run.to_json(), "steps": client.history(run_id), "children": kids}))
        return
    row = client.store.load_row(run_id)
    if row is None:
        client.close()
        _fail(f"no run {run_id!r}; `cairn runs` lists the runs")
    for key in (
        "run_id",
        "workflow",
        "status",
        "cursor",
        "seq",
        "version",
        "epoch",
        "resumes",
        "attempts",
        "deliveries",
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
    if row["cancel_reason"]:
        console.print(f"[bold]{'cancel':>10}[/] {row['cancel_reason']}")
    if row["parent_id"]:
        console.print(f"[bold]{'parent':>10}[/] {row['parent_id']}")
    if row["forked_from"]:
        console.print(
            f"[bold]{'forked':>10}[/] from {row['forked_from']} at seq {row['forked_at']}"
        )
    if row["concurrency_key"]:
        console.print(f"[bold]{'key':>10}[/] {row['concurrency_key']}")
    if row["priority"]:
        console.print(f"[bold]{'priority':>10}[/] {row['priority']}")
    try:
        client.store.load(run_id)
    except CairnError as exc:
        console.print(f"[bold red]{'unreadable':>10}[/] {exc}")
    try:
        steps = client.history(run_id)
        kids = client.children(run_id)
    finally:
        client.close()
    if kids:
        stopped = sum(1 for k in kids if k.status.stopped)
        console.print(f"[bold]{'children':>10}[/] {len(kids)} ({stopped} stopped)")
        for k in kids[:50]:
            colour = COLOURS.get(k.status, "")
            status = f"[{colour}]{k.status}[/]" if colour else k.status
            console.print(f"{'':>11}{k.run_id}  {k.workflow}  {status}  {k.error or ''}")
        if len(kids) > 50:
            console.print(f"{'':>11}… and {len(kids) - 50} more (cairn show {run_id} --json)")
    timeline = Table("seq", "step", "visit", "outcome", "started", "seconds", "worker", "cost $")
    timeline.add_column("effect key / error", overflow="fold")
    colours = {"saved": "green", "retry": "yellow"}
    previous_worker = None
    for s in steps:
        colour = colours.get(s["outcome"], "red")
        worker = s["worker"]
        # A new owner (a resume after a kill, a hand-off) shows as the worker changing.
        moved = previous_worker is not None and worker != previous_worker
        previous_worker = worker
        timeline.add_row(
            str(s["seq"]),
            s["cursor"],
            str(s["visit"]),
            f"[{colour}]{s['outcome']}[/]",
            s["started_at"].strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
            f"{(s['ended_at'] - s['started_at']).total_seconds():.3f}",
            f"[bold]{worker}[/]" if moved else worker,
            f"{s['cost_usd']:.6f}",
            s["error"] or s["effect_key"] or "",
        )
    console.print(timeline)


@app.command()
def events(
    run_id: Annotated[str, typer.Argument(help="The run id.")],
    after: Annotated[
        str | None, typer.Option("--after", help="Go on after this event id (no duplicate).")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Stop after this many seconds.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per event per line.")
    ] = False,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
) -> None:
    """Follow a run's events live until it ends: model tokens as they are written, steps,
    retries, waits, what ctx.emit sent (see docs/guides/live-output.md)."""
    from cairn.client.events import EVENT_ID
    from cairn.core.errors import CairnError

    if after is not None and not EVENT_ID.fullmatch(after):
        _fail(f"--after {after!r}: event ids look like 1733312345678-0 (0: from the start)", 2)
    settings = _settings(database_url=database_url, redis_url=redis_url)
    try:
        with _client(settings) as client:
            midline = False
            for event in client.events(run_id, after, timeout=timeout):
                if as_json:
                    print(_dumps(event.to_json()), flush=True)
                    continue
                if event.kind == "token":
                    console.print(event.data["text"], end="", markup=False, highlight=False)
                    midline = True
                    continue
                if midline:
                    console.print()
                    midline = False
                where = f"{event.cursor}#{event.visit}" if event.cursor else ""
                data = "" if event.data in (None, {}) else json.dumps(event.data, default=str)
                console.print(
                    f"[dim]{event.id}[/] [bold]{event.kind}[/] {where} {data[:300]}",
                    highlight=False,
                )
    except CairnError as exc:
        _fail(exc, 2)


@app.command()
def signal(
    run_id: Annotated[str, typer.Argument(help="The run id.")],
    event: Annotated[str, typer.Argument(help="The event the run waits for, e.g. payment.")],
    payload: Annotated[str, typer.Argument(help="The signal's payload as JSON.")] = "null",
    signal_id: Annotated[
        str | None, typer.Option("--id", help="Signal id: the same id twice is one signal.")
    ] = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
) -> None:
    """Send a run a signal (StepResult.wait): stored durably, delivered once per id."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        _fail(f"payload is not JSON ({exc})", 2)
    from cairn.core.errors import CairnError

    settings = _settings(database_url=database_url, redis_url=redis_url)
    try:
        with _client(settings) as client:
            stored = client.signal(run_id, event, data, signal_id=signal_id)
    except CairnError as exc:
        _fail(exc, 2)
    if as_json:
        print(_dumps({"run_id": run_id, "event": event, "stored": stored}))
        return
    console.print(f"{run_id}: {event} " + ("sent" if stored else "already sent (same --id)"))


@app.command()
def cancel(
    run_id: Annotated[str, typer.Argument(help="The run id.")],
    reason: Annotated[str, typer.Option("--reason", help="Recorded on the run.")] = CANCEL_REASON,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Cancel a run: a pending one at once, a running one at its next step boundary."""
    with _client(_settings(database_url=database_url)) as client:
        run = client.cancel(run_id, reason)
    if run is None:
        _fail(f"no run {run_id!r}; `cairn runs` lists the runs")
    if as_json:
        print(_dumps({"run": run.to_json()}))
        return
    console.print(
        f"{run_id}: {run.status}" + ("" if run.status == RunStatus.CANCELLED else " (cancel asked)")
    )


@app.command()
def resolve(
    run_id: Annotated[str, typer.Argument(help="The run id (stopped as unknown).")],
    done: Annotated[
        bool,
        typer.Option(
            "--done/--not-done",
            help="Whether the effect whose outcome was unknown happened (--not-done: the "
            "run's replay runs it).",
        ),
    ],
    result: Annotated[
        str, typer.Option("--result", help="With --done: the effect's result, as JSON.")
    ] = "null",
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Settle a run stopped as unknown (an at-most-once effect lost its outcome); it goes on."""
    try:
        value = json.loads(result)
    except ValueError as exc:
        _fail(f"--result is not JSON: {exc}")
    with _client(_settings(database_url=database_url)) as client:
        open_keys = [i["key"] for i in client.store.open_intents(run_id)]
        run = client.resolve(run_id, done=done, result=value)
    if as_json:
        print(_dumps({"run": run.to_json(), "resolved": open_keys}))
        return
    what = "done" if done else "not done (it runs again)"
    keys = ", ".join(open_keys) or "nothing open"
    console.print(f"{run_id}: {keys} settled as {what}; run {run.status}")


@app.command("settings")
def settings_cmd(
    markdown: Annotated[
        bool, typer.Option("--markdown", help="The settings table of the docs.")
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Show the settings in effect (from CAIRN_* variables and defaults)."""
    import dataclasses

    from cairn.core.settings import markdown_table

    if markdown:
        print(markdown_table())
        return
    settings = _settings()
    values = {
        f.metadata["env"]: _redacted(getattr(settings, f.name))
        for f in dataclasses.fields(settings)
    }
    if settings.api_token:
        values["CAIRN_API_TOKEN"] = "***"
    if as_json:
        print(_dumps(values))
        return
    table = Table("variable", "value")
    for name, value in values.items():
        table.add_row(name, "" if value is None else str(value))
    console.print(table)


def _redacted(value: Any) -> Any:
    """A URL's password as ***: settings are shown, secrets never."""
    if isinstance(value, str) and "://" in value:
        from urllib.parse import urlsplit

        parts = urlsplit(value)
        if parts.password:
            netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
            return parts._replace(netloc=netloc).geturl()
    return value


@db_app.command("check")
def db_check(
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    workflows: Workflows = None,
) -> None:
    """Before a deploy: does this code (CAIRN_WORKFLOWS) have every step live runs stand
    at? Exit 1, naming each missing step and its runs, if not."""
    from cairn.core.errors import CairnError
    from cairn.steps import registry

    settings = _settings(database_url=database_url, workflows=workflows)
    try:
        registry.import_modules(settings.workflows)
    except CairnError as exc:
        _fail(exc, 2)
    with _client(settings) as client:
        rows = client.store.db.all("live_cursors")
    problems = []
    for name in sorted({r["workflow"] for r in rows}):
        mine = [r for r in rows if r["workflow"] == name]
        flow = registry.find(name)
        missing = flow.missing(r["cursor"] for r in mine) if flow else None
        for r in mine:
            if missing is None or r["cursor"] in missing:
                what = "no such workflow" if flow is None else "no such step"
                problems.append(
                    {"workflow": name, "step": r["cursor"], "runs": r["runs"], "problem": what}
                )
    if as_json:
        print(_dumps({"ok": not problems, "problems": problems}))
    elif problems:
        from rich.markup import escape

        for p in problems:
            fix = (
                "add its module to CAIRN_WORKFLOWS (--workflows)"
                if p["problem"] == "no such workflow"
                else f"keep it, or declare workflow({p['workflow']!r}, "
                f"renamed={{{p['step']!r}: 'new_name'}})"
            )
            at = f"{p['workflow']}.{p['step']}" if p["step"] else p["workflow"]  # not started
            err.print(  # soft_wrap: a problem per line, at any terminal width
                f"[bold red]{escape(at)}[/]: "
                + escape(f"{p['runs']} live run(s) stand there, and this code has ")
                + escape(f"{p['problem']}: {fix}"),
                soft_wrap=True,
            )
    else:
        print(f"ok: every step {sum(r['runs'] for r in rows)} live run(s) stand at exists")
    if problems:
        raise typer.Exit(1)


@db_app.command("upgrade")
def db_upgrade(
    migrations: Annotated[
        Path | None,
        typer.Option(
            "--migrations",
            help="Also apply your own NNNN_name.sql files from this folder (the tables your "
            "steps write through ctx.db), recorded apart from cairn's.",
        ),
    ] = None,
    wait: Annotated[
        float, typer.Option("--wait", help="Seconds to wait for Postgres to answer.", min=0)
    ] = 0,
    database_url: DatabaseUrl = None,
) -> None:
    """Apply pending schema migrations (cairn's, then yours with --migrations)."""
    import time

    from cairn.core.errors import StoreUnavailable
    from cairn.store import upgrade

    url = _settings(database_url=database_url).database_url
    if migrations is not None and not migrations.is_dir():  # before any change is applied
        _fail(f"--migrations {str(migrations)!r}: no such folder (of NNNN_name.sql files)", 2)
    deadline = time.monotonic() + wait
    while True:
        try:
            applied = upgrade(url)
            break
        except StoreUnavailable as exc:
            if time.monotonic() < deadline:
                time.sleep(1)
                continue
            _fail(exc)
    console.print(f"applied migrations: {applied}" if applied else "schema is up to date")
    if migrations is not None:
        mine = upgrade(url, migrations)
        console.print(f"applied your migrations: {mine}" if mine else "your schema is up to date")


@app.command()
def serve(
    host: Annotated[
        str | None,
        typer.Option("--host", envvar="CAIRN_WEB_HOST", help="Address to listen on [127.0.0.1]."),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port", envvar="CAIRN_WEB_PORT", min=1, max=65535, help="Port to listen on [8000]."
        ),
    ] = None,
    insecure_no_auth: Annotated[
        bool,
        typer.Option(
            "--insecure-no-auth",
            help="Serve without CAIRN_API_TOKEN: anyone who reaches the port can start and "
            "cancel runs. For a laptop only.",
        ),
    ] = False,
    workflows: Workflows = None,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    loglevel: LogLevel = None,
) -> None:
    """The HTTP API and the web pages of runs (token from CAIRN_API_TOKEN)."""
    _need_server("cairn serve")
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    from cairn.web.api import create_app

    settings = _settings(
        web_host=host,
        web_port=port,
        workflows=workflows,
        database_url=database_url,
        redis_url=redis_url,
        loglevel=loglevel,
    )
    log_config: Any = LOGGING_CONFIG
    if settings.log_format == "json":
        import logging

        from cairn.core import logs

        # One JSON handler on the root; uvicorn's loggers, left unconfigured, propagate to it.
        logging.basicConfig(level=settings.loglevel.upper(), force=True)
        logs.use_json(logging.getLogger())
        log_config = None
    web = create_app(settings, insecure_no_auth=insecure_no_auth)
    _can_listen(
        settings.web_host,
        settings.web_port,
        "pick a free --port (CAIRN_WEB_PORT), or another --host (CAIRN_WEB_HOST)",
    )
    where = f"http://{settings.web_host}:{settings.web_port}"
    if not settings.api_token:
        err.print("[bold yellow]warning:[/] no CAIRN_API_TOKEN: serving without auth")
    err.print(f"cairn serve: runs at {where}/ui/runs, API docs at {where}/docs", soft_wrap=True)
    uvicorn.run(
        web,
        host=settings.web_host,
        port=settings.web_port,
        log_level=settings.loglevel.lower(),
        log_config=log_config,
        access_log=False,  # the request counter is on /metrics; a line per request is noise
    )


def _can_listen(host: str, port: int, what_to_do: str) -> None:
    """Fail now, in one line, if host:port cannot be listened on: a server would say so
    among its start-up log lines."""
    import socket

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
            sock.bind((host, port))
    except OSError as exc:
        _fail(f"cannot listen on {host}:{port} ({exc.strerror or exc}); {what_to_do}", 2)


@app.command()
def demo(
    runs: Annotated[int, typer.Option("--runs", min=1, help="Invoice runs to enqueue.")] = 20,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Worker processes to start.")
    ] = 2,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the summary as one JSON object.")
    ] = False,
    serve: Annotated[
        bool,
        typer.Option(
            "--serve",
            help="Serve the runs' pages on 127.0.0.1 while they run, and after until Ctrl-C.",
        ),
    ] = False,
    port: Annotated[
        int | None,
        typer.Option(
            "--port", envvar="CAIRN_WEB_PORT", min=1, max=65535, help="--serve's port [8000]."
        ),
    ] = None,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
) -> None:
    """A fleet of workers doing invoice runs; workers are SIGKILLed mid-run; effects counted."""
    if serve:
        _need_server("cairn demo --serve")
    from cairn.testing.demo import run_demo

    settings = _settings(database_url=database_url, redis_url=redis_url, web_port=port)
    summary = run_demo(
        settings,
        runs=runs,
        workers=workers,
        quiet=as_json,
        serve_port=settings.web_port if serve else None,
        # Printed before --serve goes on serving: a script reading it need not wait.
        on_summary=(lambda s: print(json.dumps(s), flush=True)) if as_json else None,
    )
    if not summary["ok"]:
        raise typer.Exit(1)


StandIn = enum.Enum("StandIn", {"mail": "mail", "model": "model"}, type=str)


@app.command()
def standin(
    kind: Annotated[StandIn, typer.Argument(help="mail or model.")],
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Port on 127.0.0.1 (0: a free one).")
    ] = 0,
    delay_ms: Annotated[
        int, typer.Option("--delay-ms", min=0, help="Latency to add to each request.")
    ] = 0,
) -> None:
    """Run a local stand-in: the mail API, or a server speaking the Anthropic Messages API."""
    from cairn.testing import standins

    if port:
        _can_listen("127.0.0.1", port, "pick a free --port, or 0 for any")
    raise typer.Exit(standins.main([kind.value, "--port", str(port), "--delay-ms", str(delay_ms)]))


schedules_app = typer.Typer(
    help="Schedules: a workflow started on a clock (cron or every N seconds), one run per tick.",
    no_args_is_help=True,
)
app.add_typer(schedules_app, name="schedules")


def _schedule_call(settings: Any, call: Any) -> Any:
    """call(client), with a domain error as one line and exit status 2."""
    from cairn.core.errors import CairnError

    try:
        with _client(settings) as client:
            return call(client)
    except CairnError as exc:
        _fail(exc, 2)


def _print_schedule(schedule: Any, as_json: bool, said: str) -> None:
    if as_json:
        print(_dumps({"schedule": schedule.to_json()}))
        return
    state = "paused" if schedule.paused else f"next run at {schedule.next_at:%Y-%m-%d %H:%M:%S}Z"
    console.print(f"{schedule.name}: {said}; {state}")


@schedules_app.command("add")
def schedules_add(
    name: Annotated[str, typer.Argument(help="The schedule's name (letters, digits, . _ -).")],
    workflow: Annotated[str, typer.Argument(help="Registered workflow name, e.g. invoice.")],
    cron: Annotated[
        str | None,
        typer.Option(
            "--cron", help="A cron expression in UTC, e.g. '0 3 * * *'.", show_default=False
        ),
    ] = None,
    every: Annotated[
        int | None, typer.Option("--every", help="Seconds between ticks.", show_default=False)
    ] = None,
    input: Annotated[
        str, typer.Option("--input", help="Each run's input as a JSON object.")
    ] = "{}",
    catch_up: Annotated[
        str,
        typer.Option(
            "--catch-up",
            help="Ticks missed while no beat ran: latest (fire the most recent), all (each), "
            "skip (none).",
        ),
    ] = "latest",
    replace: Annotated[
        bool, typer.Option("--replace", help="Overwrite a schedule of that name.")
    ] = False,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    workflows: Workflows = None,
) -> None:
    """Add a schedule: each tick starts one run, sched:NAME:<UTC tick>, once (`cairn beat`)."""
    try:
        data = json.loads(input)
    except json.JSONDecodeError as exc:
        _fail(f'--input is not JSON ({exc}); pass an object like \'{{"customer": "acme"}}\'', 2)
    settings = _settings(database_url=database_url, workflows=workflows)
    from cairn.core.errors import CairnError
    from cairn.steps import registry

    try:  # a typo fails here, not at every tick (as `cairn enqueue`)
        registry.import_modules(settings.workflows)
        _known(workflow)
    except CairnError as exc:
        _fail(exc, 2)
    schedule = _schedule_call(
        settings,
        lambda c: c.add_schedule(
            name, workflow, data, cron=cron, every=every, catch_up=catch_up, replace=replace
        ),
    )
    _print_schedule(schedule, as_json, "added")


@schedules_app.command("list")
def schedules_list(as_json: AsJson = False, database_url: DatabaseUrl = None) -> None:
    """List the schedules: timing, catch-up policy, next tick and the last one fired."""
    found = _schedule_call(_settings(database_url=database_url), lambda c: c.schedules())
    if as_json:
        print(_dumps({"schedules": [s.to_json() for s in found]}))
        return
    table = Table("name", "workflow", "timing", "catch-up", "next (UTC)", "last fired (UTC)")
    for s in found:
        table.add_row(
            s.name,
            s.workflow,
            f"cron {s.cron}" if s.cron else f"every {s.every}s",
            s.catch_up,
            "[yellow]paused[/]" if s.paused else f"{s.next_at:%Y-%m-%d %H:%M:%S}",
            f"{s.last_fired_at:%Y-%m-%d %H:%M:%S}" if s.last_fired_at else "",
        )
    console.print(table if found else "no schedules yet")


ScheduleName = Annotated[str, typer.Argument(help="The schedule's name.")]


@schedules_app.command("pause")
def schedules_pause(
    name: ScheduleName, as_json: AsJson = False, database_url: DatabaseUrl = None
) -> None:
    """Stop firing a schedule until it is resumed."""
    found = _schedule_call(_settings(database_url=database_url), lambda c: c.pause_schedule(name))
    _print_schedule(found, as_json, "paused")


@schedules_app.command("resume")
def schedules_resume(
    name: ScheduleName, as_json: AsJson = False, database_url: DatabaseUrl = None
) -> None:
    """Fire a paused schedule again, from its next tick (ticks while paused are not fired)."""
    found = _schedule_call(_settings(database_url=database_url), lambda c: c.resume_schedule(name))
    _print_schedule(found, as_json, "resumed")


@schedules_app.command("remove")
def schedules_remove(
    name: ScheduleName, as_json: AsJson = False, database_url: DatabaseUrl = None
) -> None:
    """Delete a schedule (the runs it started stay)."""
    if not _schedule_call(_settings(database_url=database_url), lambda c: c.remove_schedule(name)):
        _fail(f"no schedule {name!r}; `cairn schedules list` lists them", 2)
    print(_dumps({"removed": name}) if as_json else f"{name}: removed")


def _register_plugins(argv: list[str] | None = None) -> None:
    """Add `cairn chaos`, unless argv asks for another command: the chaos package imports
    psycopg and redis (a third of a second), which `cairn serve` refusing for want of its
    extra, or `cairn worker --help`, need not wait for."""
    first = next((a for a in argv or [] if not a.startswith("-")), None)
    ours = {g.name for g in app.registered_groups} | {
        c.name or c.callback.__name__.lower().replace("_", "-")  # typer's default name
        for c in app.registered_commands
        if c.callback is not None
    }
    if first in ours:
        return
    from cairn.cli import chaos

    chaos.register(app)


def main() -> None:
    import logging

    # One clear line per failure, not the pool's own warning per reconnect attempt.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

    _register_plugins(sys.argv[1:])
    try:
        code = _invoke()
    except typer.Exit as exc:
        code = exc.exit_code
    raise SystemExit(code)


def _invoke() -> int:
    """Run the command line's command: its exit code. A usage error (a bad option value,
    a missing argument) and a domain error are each one line by _fail, as a command's own
    errors are: not click's boxed usage, not a traceback."""
    import click

    from cairn.core.errors import CairnError

    # typer raises its own copy of click's exceptions since it vendored click; before, click's.
    usage: tuple[type[Exception], ...] = (
        getattr(typer, "TyperException", click.ClickException),
        click.ClickException,
    )
    try:
        code = app(prog_name="cairn", standalone_mode=False)
    except usage as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # as typer tells it (no public name)
            return 2  # a bare `cairn` or `cairn db`: the help is printed already
        ctx = getattr(exc, "ctx", None)
        see = f"; see `{ctx.command_path} --help`" if ctx is not None else ""
        said = exc.format_message().rstrip(".")  # type: ignore[attr-defined]
        _fail(f"{said}{see}", exc.exit_code)  # type: ignore[attr-defined]
    except typer.Abort:
        _fail("interrupted", 130)
    except CairnError as exc:  # a domain error is the user's to act on, not a traceback
        _fail(exc)
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    main()
