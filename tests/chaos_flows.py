"""Workflows for the chaos tests (CAIRN_WORKFLOWS=tests.chaos_flows).

`unkeyed` is the invoice workflow with one bug: its email step sends WITHOUT an
idempotency key, so a replay after a kill between the send and the checkpoint delivers
the email again. `cairn chaos` must name send_email as the step that duplicates.
"""

from __future__ import annotations

import httpx

from steps import invoice
from steps.context import Context
from steps.registry import DONE, StepResult, workflow
from store.errors import Transient

flow = workflow("unkeyed", validate=invoice._validate)
flow.step("fetch")(invoice.fetch)
flow.step("validate")(invoice.validate)


@flow.step()
def send_email(ctx: Context) -> StepResult:
    if not ctx.state["validated"]:
        return StepResult(cursor=DONE, state={"outcome": "rejected by validation"})
    total = sum(i["amount_cents"] for i in ctx.state["invoices"])
    body = {
        "to": ctx.input["email"],
        "subject": f"Your invoices ({len(ctx.state['invoices'])})",
        "body": f"Total due: {total / 100:.2f}",
        "ref": ctx.run_id,
    }
    try:
        resp = httpx.post(f"{ctx.config.mail_url}/v1/send", json=body, timeout=30.0)  # no key
    except httpx.TransportError as exc:
        raise Transient(f"mail API unreachable: {exc}") from exc
    if resp.status_code >= 500:
        raise Transient(f"mail API answered {resp.status_code}")
    resp.raise_for_status()
    return StepResult(cursor="record", state={"email_id": resp.json()["id"], "total_cents": total})


flow.step("record")(invoice.record)
