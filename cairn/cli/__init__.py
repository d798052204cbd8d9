"""`cairn`: run workers, enqueue and inspect runs, upgrade the schema, run the demo.

The root app and its error handling; each command group is a module of its own
(worker, serve, runs and forks, schedules, approvals, budgets, db, tokens, deploy, settings,
tools, chaos), and what they share is cairn.cli.common."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from cairn.cli import (
    approvals,
    budgets,
    db,
    deploy,
    runs,
    schedules,
    serve,
    settings,
    tokens,
    tools,
    worker,
)
from cairn.cli.common import fail

app = typer.Typer(
    help="Durable multi-step LLM agent runs on Celery + Postgres + Redis.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals could hold URLs with passwords
)


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


# Without a name, a module's commands are the root's own (`cairn worker`, `cairn beat`).
app.add_typer(worker.app)
app.add_typer(serve.app)
app.add_typer(runs.app, name="runs")
app.add_typer(schedules.app, name="schedules")
app.add_typer(approvals.app, name="approvals")
app.add_typer(budgets.app, name="budgets")
app.add_typer(db.app, name="db")
app.add_typer(tokens.app, name="tokens")
app.add_typer(deploy.app, name="deploy")
app.add_typer(settings.app)
app.add_typer(tools.app)
app.add_typer(runs.old_spellings)  # `cairn show` ...: hidden, for one release


def _names(group: typer.Typer) -> set[str]:
    """The names group answers to: its commands, its named groups, and the commands of
    the groups merged into it without a name."""
    names = set()
    for c in group.registered_commands:
        if c.callback is not None:
            names.add(c.name or c.callback.__name__.lower().replace("_", "-"))  # typer's default
    for g in group.registered_groups:
        # An unnamed group's name is typer's placeholder for None, not a str.
        if isinstance(g.name, str):
            names.add(g.name)
        elif g.typer_instance is not None:
            names |= _names(g.typer_instance)
    return names


def _register_plugins(argv: list[str] | None = None) -> None:
    """Add `cairn chaos`, unless argv asks for another command: the chaos package imports
    psycopg and redis (a third of a second), which `cairn serve` refusing for want of its
    extra, or `cairn worker --help`, need not wait for."""
    first = next((a for a in argv or [] if not a.startswith("-")), None)
    names = _names(app)
    if first in names or "chaos" in names:  # another command's, or added already
        return
    from cairn.cli import chaos

    plugins = typer.Typer()  # merged as the groups above: listed after them
    chaos.register(plugins)
    app.add_typer(plugins)


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
    a missing argument) and a domain error are each one line by fail, as a command's own
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
        fail(f"{said}{see}", exc.exit_code)  # type: ignore[attr-defined]
    except typer.Abort:
        fail("interrupted", 130)
    except CairnError as exc:  # a domain error is the user's to act on, not a traceback
        fail(exc)
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    main()
