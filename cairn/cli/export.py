"""`cairn runs export`: runs with their checkpoints and journals to a JSON-lines file, which
`cairn deploy check --runs FILE` replays on new code with no database (in CI)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Annotated

import typer

from cairn.cli.common import DatabaseUrl, err, fail, load_settings, open_client
from cairn.core.status import RunStatus

app = typer.Typer()

LIVE = (RunStatus.RUNNING, RunStatus.PENDING, RunStatus.WAITING, RunStatus.QUEUED)


@app.command("export")
def export(
    file: Annotated[
        Path, typer.Argument(help="The JSON-lines file to write, one run a line (- for stdout).")
    ],
    runs: Annotated[
        list[str] | None, typer.Option("--run", help="Export this run (repeat for more).")
    ] = None,
    workflow: Annotated[
        str | None, typer.Option("--workflow", help="Only runs of this workflow.")
    ] = None,
    status: Annotated[
        list[RunStatus] | None,
        typer.Option("--status", help="Only runs in this status (repeat; default: the live ones)."),
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            min=1, max=10_000, help="At most this many runs of each status, newest first."
        ),
    ] = 10_000,
    sample: Annotated[
        int | None,
        typer.Option(min=1, help="A random sample of this many of the runs selected."),
    ] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Export runs, each with its checkpoint and the journal of its step.

    By id (--run), or by workflow and status (the live ones by default), or a
    random --sample of those. `cairn deploy check --runs FILE` replays them on
    new code with no database.
    """
    from cairn.core.records import RunFilter
    from cairn.workers.deploycheck import export_run

    to_stdout = str(file) == "-"
    # Written a run at a time (windows can be large), to a part file renamed when whole.
    part = file.with_name(f"{file.name}.part")
    try:
        out = sys.stdout if to_stdout else part.open("w")
    except OSError as exc:
        fail(f"cannot write {file}: {exc.strerror or exc}", 2)
    n, whole = 0, False
    try:
        with open_client(load_settings(database_url=database_url)) as client:
            store = client.store
            ids = list(runs or [])
            if not ids:
                for s in status or LIVE:
                    which = RunFilter(status=s, workflow=workflow, limit=limit)
                    ids += [r.run_id for r in store.list_runs(which)]
            if sample is not None and sample < len(ids):
                ids = random.sample(ids, sample)
            for run_id in ids:
                record = export_run(store, run_id)
                if record is None:
                    fail(f"no run {run_id!r}; `cairn runs` lists the runs", 2)
                out.write(json.dumps(record, separators=(",", ":")) + "\n")
                n += 1
        whole = True
    finally:
        if not to_stdout:
            out.close()
            if whole:
                part.replace(file)
            else:
                part.unlink(missing_ok=True)
    err.print(f"exported {n} run(s)" + ("" if to_stdout else f" to {file}"))
