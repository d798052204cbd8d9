"""`cairn deploy`: check new code against the runs in flight before deploying it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from cairn.cli.common import (
    AsJson,
    DatabaseUrl,
    Workflows,
    dumps,
    err,
    fail,
    load_settings,
    open_client,
)

app = typer.Typer(help="Deploys: new code against the runs in flight.", no_args_is_help=True)

LIVE = ("running", "pending", "waiting", "queued")


@app.command("check")
def deploy_check(
    runs: Annotated[
        list[str] | None,
        typer.Option("--run", help="Check this run only (repeat for more)."),
    ] = None,
    exported: Annotated[
        Path | None,
        typer.Option(
            "--runs",
            help="Check the runs of this file (`cairn runs export`), with no database.",
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option(min=1, help="At most this many live runs of each status, newest first.")
    ] = 10_000,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    workflows: Workflows = None,
) -> None:
    """Replay the live runs on this code: exit 1 naming any it would break.

    Steps, state and input are checked, and each step replayed on its
    journal: a run at a step's start (pending, or waiting for a signal,
    an approval or a sleep) on its upgraded state, up to its first call.
    Nothing is sent or written: the replay serves recorded calls and
    stops before any call, effect or ctx.db its record lacks. With
    --runs FILE the runs are those `cairn runs export` wrote there, and no
    database is needed (CI).
    """
    from cairn.core.errors import CairnError
    from cairn.core.records import RunFilter
    from cairn.core.status import RunStatus
    from cairn.steps import registry
    from cairn.workers.deploycheck import Exported, check_row, read_export

    settings = load_settings(database_url=database_url, workflows=workflows)
    try:
        registry.import_modules(settings.workflows)
    except CairnError as exc:
        fail(exc, 2)
    findings = []
    if exported is not None:
        try:
            with exported.open() as lines:
                records = list(read_export(lines, str(exported)))
        except OSError as exc:
            fail(f"cannot read {exported}: {exc.strerror or exc}", 2)
        except CairnError as exc:  # BadExport
            fail(exc, 2)
        if runs:
            records = [r for r in records if r["run_id"] in runs]
            missing = set(runs) - {r["run_id"] for r in records}
            if missing:
                fail(f"no run {min(missing)!r} in {exported}", 2)
        store = Exported(records)
        findings = [check_row(store, r["checkpoint"]) for r in records]
    else:
        with open_client(settings) as client:
            live = client.store
            ids = list(runs or [])
            if not ids:
                for status in LIVE:
                    which = RunFilter(status=RunStatus(status), limit=limit)
                    ids += [r.run_id for r in live.list_runs(which)]
            for run_id in ids:
                row = live.load_row(run_id)
                if row is None:
                    fail(f"no run {run_id!r}", 2)
                findings.append(check_row(live, row))
    broken = [f for f in findings if not f.ok]
    if as_json:
        print(
            dumps(
                {
                    "ok": not broken,
                    "checked": len(findings),
                    "broken": len(broken),
                    "runs": [dataclasses.asdict(f) for f in findings],
                }
            )
        )
    else:
        from rich.markup import escape

        for f in broken:
            err.print(
                f"[bold red]{escape(f.run_id)}[/] {escape(f.workflow)}.{escape(f.step)}: "
                + escape(f.problem),
                soft_wrap=True,
            )
        calls = sum(f.replayed for f in findings)
        if broken:
            print(f"{len(broken)} of {len(findings)} live run(s) would break on this code")
        else:
            print(
                f"ok: {len(findings)} live run(s) go on with this code "
                f"({calls} recorded call(s) replayed)"
            )
    if broken:
        raise typer.Exit(1)


@app.command("status")
def deploy_status(as_json: AsJson = False, database_url: DatabaseUrl = None) -> None:
    """The code versions in the fleet: live workers, and runs pinned to each.

    A version whose pinned runs (versions="pin") have had no live worker
    for over CAIRN_PIN_ORPHAN_AFTER is marked orphaned: start a worker of
    it (CAIRN_CODE_VERSION), or cancel those runs. Exits 1 when one is.
    """
    from cairn.core.errors import CairnError
    from cairn.store.fleet import fleet_versions

    settings = load_settings(database_url=database_url)
    with open_client(settings) as client:
        try:
            versions = fleet_versions(client.store, settings.redis, settings.pin_orphan_after)
        except CairnError as exc:
            fail(exc)
    if as_json:
        print(dumps({"versions": [dataclasses.asdict(v) for v in versions]}))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table("version", "live workers", "pinned runs", "waiting", "")
        for v in versions:
            table.add_row(
                v.version,
                str(len(v.workers)),
                str(v.pinned),
                str(v.waiting),
                "[bold red]orphaned[/]" if v.orphaned else "",
            )
        Console(soft_wrap=True).print(table)
    if any(v.orphaned for v in versions):
        raise typer.Exit(1)


@app.command("drain")
def deploy_drain(
    version: Annotated[str, typer.Argument(help="The code version (CAIRN_CODE_VERSION).")],
    wait: Annotated[
        float,
        typer.Option(
            min=0, help="Wait up to this many seconds for its pinned runs to end (0: no wait)."
        ),
    ] = 0.0,
    database_url: DatabaseUrl = None,
) -> None:
    """Drain the workers of VERSION: they take no new run and finish theirs.

    They stop consuming the shared queues and keep their version's, where
    the runs pinned to it come back. Stop them once no pinned run of the
    version is left (--wait waits for that; exit 1 if the time runs out).
    """
    import time

    from celery import Celery

    from cairn.core.errors import CairnError
    from cairn.workers import broker
    from cairn.workers.fleet import DRAIN_COMMAND

    settings = load_settings(database_url=database_url)
    control = Celery("cairn-drain")
    control.conf.update(broker.conf(settings))
    try:
        replies = control.control.broadcast(
            DRAIN_COMMAND, arguments={"version": version}, reply=True, timeout=1.0
        )
    except Exception as exc:  # noqa: BLE001 (kombu raises the transport's own errors)
        fail(f"the broker is unreachable: {exc}")
    finally:
        control.close()
    draining = sorted(
        node for reply in replies for node, said in reply.items() if said.get("ok") == "draining"
    )
    if not draining:
        fail(f"no live worker of version {version!r} answered; `cairn deploy status` lists them")
    print(f"draining {len(draining)} worker(s) of version {version}: {', '.join(draining)}")
    deadline = time.monotonic() + wait
    with open_client(settings) as client:
        while True:
            try:
                left, _ = client.store.pinned_runs().get(version, (0, 0))
            except CairnError as exc:
                fail(exc)
            if not left:
                print(f"version {version} drained: no pinned run left; stop its workers")
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(1.0)
    print(f"{left} run(s) pinned to version {version} still under way")
    if wait:
        raise typer.Exit(1)
