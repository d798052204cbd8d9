"""What every `cairn` command uses: the one way an error is printed, the options that come
from CAIRN_* variables, the settings and the Client they make, JSON and time helpers.

Imports here stay light (typer, rich, cairn.core.status): `cairn --help` loads this module,
so the store, the fleet and the server are imported inside the functions that need them.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, overload

import typer
from rich.console import Console

from cairn.core.status import RunStatus

if TYPE_CHECKING:
    from cairn.client.client import Client
    from cairn.core.settings import Settings

console = Console()
err = Console(stderr=True)

AsJson = Annotated[
    bool, typer.Option("--json", help="Print one JSON document (stable keys) instead of tables.")
]
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

UNREACHABLE = "; check CAIRN_DATABASE_URL and CAIRN_REDIS_URL (or --database-url, --redis-url)"


def fail(problem: str | Exception, code: int = 1) -> NoReturn:
    """The one way a command reports an error: one line on stderr saying what is wrong and
    what to do (never a traceback), then exit with code. An error raised gets the next
    step for its kind."""
    from rich.markup import escape

    message = str(problem) + (next_step(problem) if isinstance(problem, Exception) else "")
    line = "; ".join(part.strip() for part in message.splitlines() if part.strip())
    # Escaped: an error's text is not markup. soft_wrap: one line at any terminal width.
    err.print(f"[bold red]error:[/] {escape(line)}", soft_wrap=True)
    raise typer.Exit(code)


def next_step(exc: Exception) -> str:
    """What to do about an error of this kind, when its message does not say."""
    from cairn.core.errors import StoreUnavailable, UnknownRun
    from cairn.workers.schedules import UnknownSchedule

    if isinstance(exc, StoreUnavailable):
        return UNREACHABLE
    if isinstance(exc, UnknownRun):
        return "; `cairn runs` lists the runs"
    if isinstance(exc, UnknownSchedule):
        return "; `cairn schedules list` lists them"
    return ""


def load_settings(**options: Any) -> Settings:
    """Settings.from_env() with the options that were given on top."""
    from cairn.core.settings import Settings

    workflows = options.pop("workflows", None)
    if workflows is not None:
        options["workflows"] = tuple(m.strip() for m in workflows.split(",") if m.strip())
    try:
        return Settings.from_env().with_options(**options)
    except SystemExit as exc:  # from_env: a CAIRN_* value that does not parse
        fail(str(exc.code), 2)
    except ValueError as exc:  # a value that parses and means nothing
        fail(exc, 2)


def open_client(settings: Settings) -> Client:
    """A Client on settings (close it: `with open_client(settings) as client`)."""
    from cairn.client.client import Client

    return Client(settings=settings)


def dumps(value: Any) -> str:
    return json.dumps(value, default=lambda o: o.isoformat() if hasattr(o, "isoformat") else str(o))


@overload
def aware(when: datetime) -> datetime: ...
@overload
def aware(when: datetime | None) -> datetime | None: ...
def aware(when: datetime | None) -> datetime | None:
    """A time given without a zone is local time."""
    return when.astimezone() if when is not None and when.tzinfo is None else when


def known(workflow: str) -> None:
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


def need_server(command: str) -> None:
    """Fail, naming the extra, when the HTTP server's packages are not installed: a plain
    `pip install cairn` (a web app's Client, a worker) leaves them out."""
    from importlib.util import find_spec

    from rich.markup import escape

    missing = [m for m in ("fastapi", "uvicorn", "jinja2") if find_spec(m) is None]
    if missing:
        said = escape(f"{command} needs {', '.join(missing)}: pip install 'cairn[server]'")
        err.print(f"[bold red]error:[/] {said}", soft_wrap=True)  # the command on one line
        raise typer.Exit(1)


def can_listen(host: str, port: int, what_to_do: str) -> None:
    """Fail now, in one line, if host:port cannot be listened on: a server would say so
    among its start-up log lines."""
    import socket

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
            sock.bind((host, port))
    except OSError as exc:
        fail(f"cannot listen on {host}:{port} ({exc.strerror or exc}); {what_to_do}", 2)
