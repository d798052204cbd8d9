"""`cairn approvals`: the runs waiting on a person across runs (the inbox), a decision on
one (approve, deny, edit), and the standing rules that decide a request at once."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.table import Table

from cairn.cli.common import AsJson, DatabaseUrl, console, dumps, fail, load_settings, open_client

if TYPE_CHECKING:
    from cairn.client.client import Client
    from cairn.core.records import Approval
    from cairn.core.settings import Settings

app = typer.Typer(
    help="Approvals: the runs waiting on a person, across runs; decide them, or set rules.",
    no_args_is_help=True,
)
rule_app = typer.Typer(
    help="Standing rules: a request of a workflow for a tool is approved at once.",
    no_args_is_help=True,
)
app.add_typer(rule_app, name="rule")

T = TypeVar("T")
ApprovalId = Annotated[int, typer.Argument(help="The approval's id (`cairn approvals list`).")]
Note = Annotated[
    str | None, typer.Option("--note", help="Why, for the run and the audit.", show_default=False)
]
By = Annotated[str, typer.Option("--by", help="Who decides, as the audit row keeps it.")]


def _call(settings: Settings, call: Callable[[Client], T]) -> T:
    """call(client), with a domain error as one line and exit status 2."""
    from cairn.core.errors import CairnError

    try:
        with open_client(settings) as client:
            return call(client)
    except CairnError as exc:
        fail(exc, 2)


def _asks(a: Approval) -> str:
    args = a.request.get("args")
    said = [str(a.request["prompt"])] if a.request.get("prompt") else []
    if args is not None:
        said.append(json.dumps(args, separators=(",", ":"))[:80])
    return " ".join(said)


@app.command("list")
def approvals_list(
    workflow: Annotated[
        str | None, typer.Option("--workflow", help="Only this workflow's.", show_default=False)
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--name", help="Only waits of this event name.", show_default=False),
    ] = None,
    oldest: Annotated[bool, typer.Option("--oldest", help="Oldest first.")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 50,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """List the approvals still waiting, newest first: what each run asks."""
    found = _call(
        load_settings(database_url=database_url),
        lambda c: c.approvals(workflow=workflow, name=name, limit=limit, oldest_first=oldest),
    )
    if as_json:
        print(dumps({"approvals": [a.to_json() for a in found]}))
        return
    table = Table("id", "run", "workflow", "event", "tool", "asks", "since (UTC)")
    for a in found:
        table.add_row(str(a.approval_id), a.run_id, a.workflow, a.event, a.tool or "",
                      _asks(a), f"{a.created_at:%Y-%m-%d %H:%M:%S}")  # fmt: skip
    console.print(table if found else "no approvals waiting")


def _decide(
    approval_id: int,
    decision: str,
    args: dict[str, Any] | None,
    note: str | None,
    by: str,
    as_json: bool,
    database_url: str | None,
) -> None:
    decided = _call(
        load_settings(database_url=database_url),
        lambda c: c.decide(approval_id, decision, args=args, note=note, by=by),
    )
    if as_json:
        print(dumps({"approval": decided.to_json()}))
        return
    console.print(f"approval {approval_id}: {decision} sent to run {decided.run_id}")


@app.command("approve")
def approvals_approve(
    approval_id: ApprovalId,
    note: Note = None,
    by: By = "admin",
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Approve: the run gets the signal it waits on and goes on."""
    _decide(approval_id, "approve", None, note, by, as_json, database_url)


@app.command("deny")
def approvals_deny(
    approval_id: ApprovalId,
    note: Note = None,
    by: By = "admin",
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Deny: the run gets the signal it waits on, saying no."""
    _decide(approval_id, "deny", None, note, by, as_json, database_url)


@app.command("edit")
def approvals_edit(
    approval_id: ApprovalId,
    args: Annotated[str, typer.Option("--args", help="The tool's edited arguments, JSON.")],
    note: Note = None,
    by: By = "admin",
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Approve with edited arguments."""
    try:
        edited = json.loads(args)
    except json.JSONDecodeError as exc:
        fail(f"--args is not JSON ({exc}); pass an object like '{{\"amount\": 4}}'", 2)
    if not isinstance(edited, dict):
        fail(f"--args is a JSON object of the tool's arguments, not {args!r}", 2)
    _decide(approval_id, "edit", edited, note, by, as_json, database_url)


@rule_app.command("add")
def rule_add(
    workflow: Annotated[str, typer.Option("--workflow", help="The workflow whose requests.")],
    tool: Annotated[str, typer.Option("--tool", help="For this tool.")],
    by: By = "admin",
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Always allow TOOL for WORKFLOW: its requests are approved as the run saves its wait."""
    rule = _call(
        load_settings(database_url=database_url), lambda c: c.add_rule(workflow, tool, by=by)
    )
    if as_json:
        print(dumps({"rule": rule.to_json()}))
        return
    console.print(f"rule {rule.rule_id}: always allow {tool} for {workflow}")


@rule_app.command("list")
def rule_list(as_json: AsJson = False, database_url: DatabaseUrl = None) -> None:
    """List the standing rules."""
    found = _call(load_settings(database_url=database_url), lambda c: c.rules())
    if as_json:
        print(dumps({"rules": [r.to_json() for r in found]}))
        return
    table = Table("id", "workflow", "tool", "by", "since (UTC)")
    for r in found:
        table.add_row(str(r.rule_id), r.workflow, r.tool, r.created_by,
                      f"{r.created_at:%Y-%m-%d %H:%M:%S}")  # fmt: skip
    console.print(table if found else "no rules")


@rule_app.command("remove")
def rule_remove(
    rule_id: Annotated[int, typer.Argument(help="The rule's id.")],
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Delete a standing rule (the decisions it made stay in the audit)."""
    if not _call(load_settings(database_url=database_url), lambda c: c.remove_rule(rule_id)):
        fail(f"no rule {rule_id}; `cairn approvals rule list` lists them", 2)
    print(dumps({"removed": rule_id}) if as_json else f"rule {rule_id}: removed")
