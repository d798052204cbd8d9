"""Workflows for the chaos tests (CAIRN_WORKFLOWS=tests.helpers.chaos_flows).

`unkeyed` is the invoice workflow with one bug: its email step sends WITHOUT an
idempotency key, so a replay after a kill between the send and the checkpoint delivers
the email again. `cairn chaos` must name send_email as the step that duplicates.
"""

from __future__ import annotations

from cairn.steps.context import Context
from cairn.steps.registry import StepResult, workflow
from cairn.testing.demos import invoice

flow = workflow("unkeyed", validate=invoice._validate)
flow.step("fetch")(invoice.fetch)
flow.step("validate")(invoice.validate)


@flow.step()
def send_email(ctx: Context) -> StepResult:
    return invoice.send_invoice_email(ctx, key=None)  # the bug: no idempotency key


flow.step("record")(invoice.record)
