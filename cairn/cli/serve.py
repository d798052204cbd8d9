"""`cairn serve`: the HTTP API and the web pages. The one command that imports the server
extra (FastAPI, uvicorn, Jinja2), and only once it runs."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from cairn.cli.common import (
    DatabaseUrl,
    LogLevel,
    RedisUrl,
    Workflows,
    can_listen,
    err,
    load_settings,
    need_server,
)

app = typer.Typer()


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
    need_server("cairn serve")
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    from cairn.web.api import create_app

    settings = load_settings(
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
    can_listen(
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
        # X-Forwarded-Proto is believed from CAIRN_WEB_TRUSTED_PROXIES only, by the app
        # (cairn.web.headers); uvicorn's own reading would believe any local peer.
        proxy_headers=False,
    )
