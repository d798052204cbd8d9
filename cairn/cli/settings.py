"""`cairn settings`: the settings in effect, secrets masked, or the docs' table of them."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import typer
from rich.table import Table

from cairn.cli.common import AsJson, console, dumps, load_settings

app = typer.Typer()


@app.command("settings")
def settings_cmd(
    markdown: Annotated[
        bool, typer.Option("--markdown", help="The settings table of the docs.")
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Show the settings in effect (from CAIRN_* variables and defaults)."""
    from cairn.core.settings import markdown_table

    if markdown:
        print(markdown_table())
        return
    settings = load_settings()
    values = {
        f.metadata["env"]: _redacted(getattr(settings, f.name))
        for f in dataclasses.fields(settings)
    }
    for f in dataclasses.fields(settings):
        if not f.repr and getattr(settings, f.name):  # the secrets
            values[f.metadata["env"]] = "***"
    if as_json:
        print(dumps(values))
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
