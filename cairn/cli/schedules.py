"""`cairn schedules`: a workflow started on a clock (cron or every N seconds), one run
per tick, fired by `cairn beat`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.table import Table

from cairn.cli.common import (
    AsJson,
    DatabaseUrl,
    Workflows,
    console,
    dumps,
    fail,
    known,
    load_settings,
    open_client,
)

if TYPE_CHECKING:
    from cairn.client.client import Client
    from cairn.core.settings import Settings
    from cairn.store.schedules import Schedule

app = typer.Typer(
    help="Schedules: a workflow started on a clock (cron or every N seconds), one run per tick.",
    no_args_is_help=True,
)


T = TypeVar("T")


def _schedule_call(settings: Settings, call: Callable[[Client], T]) -> T:
    """call(client), with a domain error as one line and exit status 2."""
    from cairn.core.errors import CairnError

    try:
        with open_client(settings) as client:
            return call(client)
    except CairnError as exc:
        fail(exc, 2)


def _print_schedule(schedule: Schedule, as_json: bool, said: str) -> None:
    if as_json:
        print(dumps({"schedule": schedule.to_json()}))
        return
    state = "paused" if schedule.paused else f"next run at {schedule.next_at:%Y-%m-%d %H:%M:%S}Z"
    console.print(f"{schedule.name}: {said}; {state}")


@app.command("add")
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
        fail(f'--input is not JSON ({exc}); pass an object like \'{{"customer": "acme"}}\'', 2)
    settings = load_settings(database_url=database_url, workflows=workflows)
    from cairn.core.errors import CairnError
    from cairn.steps import registry

    try:  # a typo fails here, not at every tick (as `cairn enqueue`)
        registry.import_modules(settings.workflows)
        known(workflow)
    except CairnError as exc:
        fail(exc, 2)
    schedule = _schedule_call(
        settings,
        lambda c: c.add_schedule(
            name, workflow, data, cron=cron, every=every, catch_up=catch_up, replace=replace
        ),
    )
    _print_schedule(schedule, as_json, "added")


@app.command("list")
def schedules_list(as_json: AsJson = False, database_url: DatabaseUrl = None) -> None:
    """List the schedules: timing, catch-up policy, next tick and the last one fired."""
    found = _schedule_call(load_settings(database_url=database_url), lambda c: c.schedules())
    if as_json:
        print(dumps({"schedules": [s.to_json() for s in found]}))
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


@app.command("pause")
def schedules_pause(
    name: ScheduleName, as_json: AsJson = False, database_url: DatabaseUrl = None
) -> None:
    """Stop firing a schedule until it is resumed."""
    found = _schedule_call(
        load_settings(database_url=database_url), lambda c: c.pause_schedule(name)
    )
    _print_schedule(found, as_json, "paused")


@app.command("resume")
def schedules_resume(
    name: ScheduleName, as_json: AsJson = False, database_url: DatabaseUrl = None
) -> None:
    """Fire a paused schedule again, from its next tick (ticks while paused are not fired)."""
    found = _schedule_call(
        load_settings(database_url=database_url), lambda c: c.resume_schedule(name)
    )
    _print_schedule(found, as_json, "resumed")


@app.command("remove")
def schedules_remove(
    name: ScheduleName, as_json: AsJson = False, database_url: DatabaseUrl = None
) -> None:
    """Delete a schedule (the runs it started stay)."""
    if not _schedule_call(
        load_settings(database_url=database_url), lambda c: c.remove_schedule(name)
    ):
        fail(f"no schedule {name!r}; `cairn schedules list` lists them", 2)
    print(dumps({"removed": name}) if as_json else f"{name}: removed")
