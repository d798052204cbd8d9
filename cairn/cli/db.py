"""`cairn db`: apply the schema's migrations, and check a deploy's code against live runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from cairn.cli.common import (
    AsJson,
    DatabaseUrl,
    Workflows,
    console,
    dumps,
    err,
    fail,
    load_settings,
    open_client,
)

app = typer.Typer(help="Database schema.", no_args_is_help=True)


@app.command("check")
def db_check(
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    workflows: Workflows = None,
) -> None:
    """Before a deploy: does this code (CAIRN_WORKFLOWS) have every step live runs stand
    at? Exit 1, naming each missing step and its runs, if not."""
    from cairn.core.errors import CairnError
    from cairn.steps import registry

    settings = load_settings(database_url=database_url, workflows=workflows)
    try:
        registry.import_modules(settings.workflows)
    except CairnError as exc:
        fail(exc, 2)
    with open_client(settings) as client:
        rows = client.store.live_cursors()
    problems = _missing_steps(rows)
    if as_json:
        print(dumps({"ok": not problems, "problems": problems}))
    elif problems:
        _print_problems(problems)
    else:
        print(f"ok: every step {sum(r['runs'] for r in rows)} live run(s) stand at exists")
    if problems:
        raise typer.Exit(1)


def _missing_steps(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each (workflow, step) live runs stand at that this process's registry lacks."""
    from cairn.steps import registry

    problems = []
    for name in sorted({r["workflow"] for r in rows}):
        mine = [r for r in rows if r["workflow"] == name]
        flow = registry.find(name)
        missing = flow.missing(r["cursor"] for r in mine) if flow else None
        for r in mine:
            if missing is None or r["cursor"] in missing:
                what = "no such workflow" if flow is None else "no such step"
                problems.append(
                    {"workflow": name, "step": r["cursor"], "runs": r["runs"], "problem": what}
                )
    return problems


def _print_problems(problems: list[dict[str, Any]]) -> None:
    from rich.markup import escape

    for p in problems:
        fix = (
            "add its module to CAIRN_WORKFLOWS (--workflows)"
            if p["problem"] == "no such workflow"
            else f"keep it, or declare workflow({p['workflow']!r}, "
            f"renamed={{{p['step']!r}: 'new_name'}})"
        )
        at = f"{p['workflow']}.{p['step']}" if p["step"] else p["workflow"]  # not started
        err.print(  # soft_wrap: a problem per line, at any terminal width
            f"[bold red]{escape(at)}[/]: "
            + escape(f"{p['runs']} live run(s) stand there, and this code has ")
            + escape(f"{p['problem']}: {fix}"),
            soft_wrap=True,
        )


@app.command("upgrade")
def db_upgrade(
    migrations: Annotated[
        Path | None,
        typer.Option(
            "--migrations",
            help="Also apply your own NNNN_name.sql files from this folder (the tables your "
            "steps write through ctx.db), recorded apart from cairn's.",
        ),
    ] = None,
    wait: Annotated[
        float, typer.Option("--wait", help="Seconds to wait for Postgres to answer.", min=0)
    ] = 0,
    database_url: DatabaseUrl = None,
) -> None:
    """Apply pending schema migrations (cairn's, then yours with --migrations)."""
    import time

    from cairn.core.errors import StoreUnavailable
    from cairn.store import upgrade

    url = load_settings(database_url=database_url).database_url
    if migrations is not None and not migrations.is_dir():  # before any change is applied
        fail(f"--migrations {str(migrations)!r}: no such folder (of NNNN_name.sql files)", 2)
    deadline = time.monotonic() + wait
    while True:
        try:
            applied = upgrade(url)
            break
        except StoreUnavailable as exc:
            if time.monotonic() < deadline:
                time.sleep(1)
                continue
            fail(exc)
    console.print(f"applied migrations: {applied}" if applied else "schema is up to date")
    if migrations is not None:
        mine = upgrade(url, migrations)
        console.print(f"applied your migrations: {mine}" if mine else "your schema is up to date")


@app.command("new-key")
def db_new_key(
    key_id: Annotated[str, typer.Argument(help="The key's id, named in each value it seals.")],
) -> None:
    """Print a new payload key as CAIRN_PAYLOAD_KEYS takes it (`<id>:<key>`): put it first
    to seal with it, keep the older keys after it to open what they sealed."""
    from cairn.core.sealing import KeyRing, new_key

    entry = f"{key_id}:{new_key()}"
    try:
        KeyRing(entry)
    except ValueError as exc:
        fail(exc, 2)
    print(entry)


@app.command("rotate-key")
def db_rotate_key(
    batch: Annotated[int, typer.Option("--batch", help="Rows a transaction.", min=1)] = 500,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Seal every stored payload again under CAIRN_PAYLOAD_KEYS's first key (clear ones
    too), in batches, while the fleet runs. Afterwards the older keys can go."""
    from cairn.core.errors import CairnError
    from cairn.store.db import Database
    from cairn.store.sealed import reseal

    settings = load_settings(database_url=database_url)
    db = Database(settings.database_url, give_up_after=settings.store_give_up_after)
    try:
        done = reseal(db, batch, None if as_json else lambda what, n: err.print(f"{what}: {n:,}"))
    except (CairnError, ValueError) as exc:
        fail(exc, 2)
    finally:
        db.close()
    if as_json:
        print(dumps({"sealed": done}))
        return
    console.print(f"sealed {sum(done.values()):,} payloads under the first key")
