"""`cairn demo` and `cairn standin`: the quickstart's demo and the local stand-ins for the
mail API and the Messages API. Their code is cairn.testing's, imported only when they run."""

from __future__ import annotations

import enum
import json
import os
import sys
from typing import Annotated

import typer

from cairn.cli.common import DatabaseUrl, RedisUrl, can_listen, load_settings, need_server

app = typer.Typer()

StandIn = enum.Enum("StandIn", {"mail": "mail", "model": "model"}, type=str)


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
        need_server("cairn demo --serve")
    from cairn.testing.demo import run_demo

    settings = load_settings(database_url=database_url, redis_url=redis_url, web_port=port)
    summary = run_demo(
        settings,
        runs=runs,
        workers=workers,
        quiet=as_json,
        serve_port=settings.web_port if serve else None,
        # Printed before --serve goes on serving: a script reading it need not wait.
        on_summary=(lambda s: print(json.dumps(s), flush=True)) if as_json else None,
    )
    code = 0 if summary["ok"] else 1
    if serve:
        # Ctrl-C ended the serving and every process the demo started is gone: all that
        # is left is the interpreter taking apart each module loaded (Celery, Rich, the
        # store's drivers...), seconds of CPU on a busy host between the Ctrl-C and the
        # prompt. The output is flushed; nothing else is owed at exit.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code:
        raise typer.Exit(code)


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
    """Run a local stand-in: the mail API, or a model server speaking Anthropic's Messages
    API and OpenAI's Chat Completions and Responses (ANTHROPIC_BASE_URL, OPENAI_BASE_URL)."""
    from cairn.testing import standins

    if port:
        can_listen("127.0.0.1", port, "pick a free --port, or 0 for any")
    raise typer.Exit(standins.main([kind.value, "--port", str(port), "--delay-ms", str(delay_ms)]))
