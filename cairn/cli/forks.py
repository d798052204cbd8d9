"""`cairn runs fork`, `rewind` and `replay`: go on from a step a run saved, as a new run,
in place, or for each of a workflow's failed runs (docs/guides/fork-rewind.md)."""

from __future__ import annotations

import enum
import json
from datetime import datetime
from typing import Annotated

import typer

from cairn.cli.common import (
    AsJson,
    DatabaseUrl,
    aware,
    console,
    dumps,
    err,
    fail,
    load_settings,
    open_client,
)

app = typer.Typer()


class Replayable(enum.StrEnum):
    failed = "failed"
    incompatible = "incompatible"


@app.command("fork")
def fork_cmd(
    run_id: Annotated[str, typer.Argument(help="The run to fork.")],
    at: Annotated[
        int,
        typer.Option(
            "--at",
            min=1,
            help="The checkpoint to go on from: the one the step `cairn runs show` lists at "
            "seq N-1 saved.",
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
        fail(f"--input-patch is not JSON ({exc})", 2)
    try:
        with open_client(load_settings(database_url=database_url)) as client:
            new = client.fork(run_id, at_seq=at, new_run_id=new_run_id, input_patch=patch)
    except CairnError as exc:
        fail(exc, 2)
    print(dumps({"run_id": new, "forked_from": run_id, "forked_at": at}) if as_json else new)


@app.command("rewind")
def rewind_cmd(
    run_id: Annotated[str, typer.Argument(help="The stopped run to move back.")],
    to: Annotated[
        int,
        typer.Option(
            "--to",
            min=1,
            help="The checkpoint to go back to: the one the step `cairn runs show` lists at "
            "seq N-1 saved.",
        ),
    ],
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Move a stopped run back to a step it saved, in place, and send it on."""
    from cairn.core.errors import CairnError

    try:
        with open_client(load_settings(database_url=database_url)) as client:
            run = client.rewind(run_id, to_seq=to)
    except CairnError as exc:
        fail(exc, 2)
    if as_json:
        print(dumps(run.to_json()))
    else:
        print(f"{run_id}: rewound to seq {to}, now {run.status} at {run.cursor!r} (seq {run.seq})")


@app.command("replay")
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
            open_client(load_settings(database_url=database_url)) as client,
            # Off unless at a terminal: elsewhere its one frame is a stray blank line.
            Progress(
                console=err, transient=True, disable=as_json or dry_run or not err.is_terminal
            ) as bar,
        ):
            task = bar.add_task("replaying", total=limit)
            runs = client.replay(
                workflow, since=aware(since), until=aware(until), status=statuses,
                limit=limit, dry_run=dry_run, progress=lambda n: bar.update(task, completed=n),
            )  # fmt: skip
    except CairnError as exc:
        fail(exc, 2)
    if as_json:
        print(
            dumps({"workflow": workflow, "dry_run": dry_run, "runs": [r.to_json() for r in runs]})
        )
        return
    for r in runs:
        error = (r.error or "").splitlines()[0][:80] if r.error else ""
        console.print(f"{r.run_id}  {r.status} at {r.cursor!r}  {error}", markup=False)
    verb = "would replay" if dry_run else "replayed"
    console.print(f"{verb} {len(runs)} {workflow} run(s)", markup=False)
