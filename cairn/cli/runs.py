"""`cairn runs`: list runs, and every operation on one: enqueue, show, events, signal, steer,
cancel, resolve (here), fork, rewind and replay (cairn.cli.forks), export
(cairn.cli.export).

`cairn enqueue`, `cairn show`, ... were these commands' names before they were gathered
here: `old_spellings` keeps them working, hidden, for one release."""

from __future__ import annotations

import dataclasses
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from cairn.cli import export, forks
from cairn.cli.common import (
    COLOURS,
    AsJson,
    DatabaseUrl,
    RedisUrl,
    Workflows,
    aware,
    console,
    dumps,
    fail,
    known,
    load_settings,
    open_client,
)
from cairn.cli.timeline import print_timeline
from cairn.core.status import CANCEL_REASON, RunStatus

if TYPE_CHECKING:
    from cairn.client.client import Client
    from cairn.core.records import Run

app = typer.Typer()

# `cairn runs` and `cairn runs list` take the same options.
Status = Annotated[RunStatus | None, typer.Option("--status", help="Only runs in this status.")]
OfWorkflow = Annotated[str | None, typer.Option("--workflow", help="Only runs of this workflow.")]
OfTenant = Annotated[str | None, typer.Option("--tenant", help="Only runs of this tenant.")]
Limit = Annotated[int, typer.Option("--limit", help="Rows to show.", min=1, max=10_000)]
After = Annotated[
    str | None,
    typer.Option("--after", help="The last run id of the previous page: show the next."),
]
Since = Annotated[
    datetime | None, typer.Option("--since", help="Only runs created at or after this.")
]
Until = Annotated[datetime | None, typer.Option("--until", help="Only runs created before this.")]
RunId = Annotated[str, typer.Argument(help="The run id.")]


@app.callback(invoke_without_command=True)
def runs(
    ctx: typer.Context,
    status: Status = None,
    workflow: OfWorkflow = None,
    limit: Limit = 30,
    after: After = None,
    since: Since = None,
    until: Until = None,
    tenant: OfTenant = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Runs: list (the default), enqueue, show, events, signal, steer, cancel, resolve, fork,
    rewind, replay.

    With no command, list runs newest first, a page at a time, with the totals by status
    (as `cairn runs list`)."""
    if ctx.invoked_subcommand is None:
        list_runs(status, workflow, limit, after, since, until, tenant, as_json, database_url)


@app.command("list")
def list_runs(
    status: Status = None,
    workflow: OfWorkflow = None,
    limit: Limit = 30,
    after: After = None,
    since: Since = None,
    until: Until = None,
    tenant: OfTenant = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """List runs, newest first, a page at a time, with the totals by status (a tenant's,
    with --tenant)."""
    from cairn.core.errors import InvalidInput

    with open_client(load_settings(database_url=database_url)) as client:
        try:
            found = client.list(
                status, limit, workflow=workflow, after=after, since=aware(since),
                until=aware(until), tenant=tenant,
            )  # fmt: skip
        except InvalidInput as exc:  # a tenant name that is none
            fail(exc, 2)
        totals = client.for_tenant(tenant).counts() if tenant else client.counts()
    following = found[-1].run_id if len(found) == limit else None
    if as_json:
        rows = [r.to_json() for r in found]
        print(dumps({"runs": rows, "totals": totals, "next_after": following}))
        return
    table = Table("workflow", "tenant", "status", "cursor", "seq", "cost $", "resumes", "updated")
    table.add_column("run", no_wrap=True)
    for r in found:
        table.add_row(
            r.workflow,
            r.tenant or "",
            _coloured(r.status),
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


def _coloured(status: RunStatus) -> str:
    colour = COLOURS.get(status, "")
    return f"[{colour}]{status}[/]" if colour else status


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
    debounce_key: Annotated[
        str | None,
        typer.Option(
            "--debounce-key",
            help="Enqueues of the workflow with this key collapse into one run (with --debounce).",
        ),
    ] = None,
    debounce: Annotated[
        float | None,
        typer.Option(
            "--debounce", help="Seconds without another enqueue of the key before the run starts."
        ),
    ] = None,
    max_wait: Annotated[
        float | None,
        typer.Option("--max-wait", help="Seconds after the first enqueue it starts at the latest."),
    ] = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    workflows: Workflows = None,
) -> None:
    """Enqueue a run and print its id (a debounced one: the key's run not started yet)."""
    settings = load_settings(database_url=database_url, redis_url=redis_url, workflows=workflows)
    data = _input(input, input_file)
    from cairn.core.errors import CairnError
    from cairn.steps import registry

    try:
        # At a terminal, a typo should fail here, not on a worker: the CLI knows the
        # workflows of --workflows (a web app's Client needs only the name).
        registry.import_modules(settings.workflows)
        known(workflow)
        with open_client(settings) as client:
            created = client.enqueue(
                workflow, data, run_id=run_id, concurrency_key=concurrency_key,
                concurrency_limit=concurrency_limit, priority=priority,
                debounce_key=debounce_key, debounce=debounce, max_wait=max_wait,
            )  # fmt: skip
        print(dumps({"run_id": created}) if as_json else created)
    except CairnError as exc:
        fail(exc, 2)


def _input(text: str | None, input_file: str | None) -> Any:
    """The run's input, from the argument or --input-file (- for stdin), as JSON."""
    if text is not None and input_file is not None:
        fail("give the input as an argument or with --input-file, not both", 2)
    if input_file is not None:
        try:
            text = sys.stdin.read() if input_file == "-" else Path(input_file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"cannot read the input: {exc}", 2)
    try:
        return json.loads(text if text is not None else "{}")
    except json.JSONDecodeError as exc:
        fail(f'input is not JSON ({exc}); pass an object like \'{{"customer": "acme"}}\'', 2)


@app.command()
def show(run_id: RunId, as_json: AsJson = False, database_url: DatabaseUrl = None) -> None:
    """Show one run: its checkpoint, its error, its window size and its step timeline."""
    from cairn.core.errors import CairnError

    with open_client(load_settings(database_url=database_url)) as client:
        if as_json:
            run = client.get(run_id)
            if run is None:
                fail(f"no run {run_id!r}; `cairn runs` lists the runs")
            kids = [k.to_json() for k in client.children(run_id)]
            timeline = [s.to_json() for s in client.history(run_id)]
            print(dumps({"run": run.to_json(), "steps": timeline, "children": kids}))
            return
        row = client.store.load_row(run_id)
        if row is None:
            fail(f"no run {run_id!r}; `cairn runs` lists the runs")
        _print_row(row)
        run = client.get(run_id)
        if run is not None and run.tenant is not None:
            console.print(f"[bold]{'tenant':>10}[/] {run.tenant}")
        if run is not None and run.cancelled_by is not None:
            console.print(f"[bold]{'cancelled':>10}[/] by {run.cancelled_by}")
        if run is not None and run.started_version is not None:
            console.print(f"[bold]{'started on':>10}[/] code version {run.started_version}")
        if run is not None and run.wakes_at is not None:  # a sleep, or a wait's timeout
            why = f" (or on a signal {row['wait_event']!r})" if row["wait_event"] else ""
            console.print(f"[bold]{'wakes':>10}[/] {run.wakes_at.isoformat()}{why}")
        try:
            client.store.load(run_id)
        except CairnError as exc:
            console.print(f"[bold red]{'unreadable':>10}[/] {exc}")
        steps = client.history(run_id)
        _print_children(run_id, client.children(run_id))
    print_timeline(console, steps)


_FIELDS = (
    "run_id", "workflow", "status", "cursor", "seq", "version", "epoch", "resumes",
    "attempts", "deliveries", "cost_usd", "updated_at",
)  # fmt: skip


def _print_row(row: dict[str, Any]) -> None:
    """The run's row as `cairn runs show` prints it: a field a line, the optional ones when set."""
    for key in _FIELDS:
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


def _print_children(run_id: str, kids: list[Run]) -> None:
    if not kids:
        return
    stopped = sum(1 for k in kids if k.status.stopped)
    console.print(f"[bold]{'children':>10}[/] {len(kids)} ({stopped} stopped)")
    for k in kids[:50]:
        console.print(f"{'':>11}{k.run_id}  {k.workflow}  {_coloured(k.status)}  {k.error or ''}")
    if len(kids) > 50:
        console.print(f"{'':>11}… and {len(kids) - 50} more (cairn runs show {run_id} --json)")


@app.command()
def events(
    run_id: RunId,
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
        fail(f"--after {after!r}: event ids look like 1733312345678-0 (0: from the start)", 2)
    settings = load_settings(database_url=database_url, redis_url=redis_url)
    try:
        with open_client(settings) as client:
            _follow(client, run_id, after, timeout, as_json)
    except CairnError as exc:
        fail(exc, 2)


def _follow(
    client: Client, run_id: str, after: str | None, timeout: float | None, as_json: bool
) -> None:
    """Print the run's events as they come: a JSON line each, or tokens as running text
    and every other event on a line of its own."""
    midline = False
    for event in client.events(run_id, after, timeout=timeout):
        if as_json:
            print(dumps(event.to_json()), flush=True)
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
            f"[dim]{event.id}[/] [bold]{event.kind}[/] {where} {data[:300]}", highlight=False
        )


@app.command()
def signal(
    run_id: RunId,
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
        fail(f"payload is not JSON ({exc})", 2)
    from cairn.core.errors import CairnError

    settings = load_settings(database_url=database_url, redis_url=redis_url)
    try:
        with open_client(settings) as client:
            stored = client.signal(run_id, event, data, signal_id=signal_id)
    except CairnError as exc:
        fail(exc, 2)
    if as_json:
        print(dumps({"run_id": run_id, "event": event, "stored": stored}))
        return
    console.print(f"{run_id}: {event} " + ("sent" if stored else "already sent (same --id)"))


@app.command()
def steer(
    run_id: RunId,
    message: Annotated[str, typer.Argument(help="The message: text, or JSON with --json-message.")],
    json_message: Annotated[
        bool, typer.Option("--json-message", help="Read MESSAGE as JSON (a chat message object).")
    ] = False,
    interrupt: Annotated[
        bool,
        typer.Option(
            "--interrupt",
            help="Also cut the run's interruptible call in flight (its answer dropped).",
        ),
    ] = False,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
) -> None:
    """Send a running agent a message: delivered once, in order, at its step's next
    ctx.messages(); with --interrupt its interruptible call in flight is cut first."""
    data: Any = message
    if json_message:
        try:
            data = json.loads(message)
        except json.JSONDecodeError as exc:
            fail(f"message is not JSON ({exc}); leave out --json-message to send it as text", 2)
    from cairn.core.errors import CairnError

    settings = load_settings(database_url=database_url, redis_url=redis_url)
    try:
        with open_client(settings) as client:
            n = client.steer(run_id, data, interrupt=interrupt)
    except CairnError as exc:
        fail(exc, 2)
    if as_json:
        print(dumps({"run_id": run_id, "n": n}))
        return
    console.print(f"{run_id}: message {n} stored; its step reads it at its next ctx.messages()")


@app.command()
def cancel(
    run_id: RunId,
    reason: Annotated[str, typer.Option("--reason", help="Recorded on the run.")] = CANCEL_REASON,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Cancel a run: a pending one at once, a running one at its next step boundary."""
    from cairn.core.errors import UnknownRun

    with open_client(load_settings(database_url=database_url)) as client:
        try:
            run = client.cancel(run_id, reason)
        except UnknownRun:
            fail(f"no run {run_id!r}; `cairn runs` lists the runs")
    if as_json:
        print(dumps({"run": run.to_json()}))
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
        fail(f"--result is not JSON: {exc}")
    with open_client(load_settings(database_url=database_url)) as client:
        open_keys = [i["key"] for i in client.store.open_intents(run_id)]
        run = client.resolve(run_id, done=done, result=value)
    if as_json:
        print(dumps({"run": run.to_json(), "resolved": open_keys}))
        return
    what = "done" if done else "not done (it runs again)"
    keys = ", ".join(open_keys) or "nothing open"
    console.print(f"{run_id}: {keys} settled as {what}; run {run.status}")


@app.command("raise-budget")
def raise_budget(
    run_id: Annotated[str, typer.Argument(help="The run enqueued with budget_usd=.")],
    usd: Annotated[
        float | None, typer.Option("--usd", help="The budget's new limit, in dollars.")
    ] = None,
    tokens: Annotated[
        int | None, typer.Option("--tokens", help="The budget's new limit, in model tokens.")
    ] = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Set the limits of a run tree's budget; its runs stopped as budget_exceeded go on."""
    with open_client(load_settings(database_url=database_url)) as client:
        budget = client.raise_budget(run_id, usd=usd, tokens=tokens)
    if as_json:
        print(dumps({"budget": dataclasses.asdict(budget)}))
        return
    usd_part = (
        f"limit ${budget.limit_usd:.6f}, spent ${budget.spent_usd:.6f}, "
        f"in flight ${budget.reserved_usd:.6f}"
    )
    token_part = (
        f"limit {budget.limit_tokens} tokens, spent {budget.spent_tokens}, "
        f"in flight {budget.reserved_tokens}"
    )
    shown = [
        usd_part if budget.limit_usd is not None else "",
        token_part if budget.limit_tokens is not None else "",
    ]
    console.print(f"{budget.scope}: " + "; ".join(p for p in shown if p))


app.add_typer(forks.app)  # fork, rewind, replay
app.add_typer(export.app)  # export

# The top-level names these commands had before `cairn runs` gathered them: same options,
# same output, left out of `cairn --help`. For one release; the docs say `cairn runs ...`.
old_spellings = typer.Typer()
for _command in (enqueue, show, events, signal, cancel, resolve):
    old_spellings.command(hidden=True)(_command)
