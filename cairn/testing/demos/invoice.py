"""The demo `invoice` workflow, after the seed article.

fetch → validate (model call) → send_email (HTTP mail API, idempotency key) →
record (our own Postgres, same transaction as the checkpoint) → done; with
"await_payment": true, record → await_payment (the run waits, holding no worker, for
a "payment" signal or payment_timeout_s) → settle → done.
"""

from __future__ import annotations

import hashlib
from typing import Any

import httpx

from cairn.core.errors import InvalidInput, Transient
from cairn.steps.context import Context
from cairn.steps.model import text_of
from cairn.steps.registry import DONE, StepResult, workflow


def _validate(data: dict[str, Any]) -> dict[str, Any]:
    customer, email = data.get("customer"), data.get("email")
    if not isinstance(customer, str) or not customer.strip():
        raise InvalidInput("invoice: 'customer' must be a non-empty string")
    if not isinstance(email, str) or "@" not in email:
        raise InvalidInput("invoice: 'email' must be an email address")
    invoices = data.get("invoices", 2)
    # bool is an int to Python: "invoices": true is not 1
    if isinstance(invoices, bool) or not isinstance(invoices, int) or not 1 <= invoices <= 50:
        raise InvalidInput("invoice: 'invoices' must be a whole number from 1 to 50")
    out = {"customer": customer, "email": email, "invoices": invoices}
    if "await_payment" in data:
        if not isinstance(data["await_payment"], bool):
            raise InvalidInput("invoice: 'await_payment' must be true or false")
        timeout = data.get("payment_timeout_s", 7 * 24 * 3600)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise InvalidInput("invoice: 'payment_timeout_s' must be a positive number")
        out.update(await_payment=data["await_payment"], payment_timeout_s=timeout)
    return out


flow = workflow("invoice", validate=_validate)


@flow.step()
def fetch(ctx: Context) -> StepResult:
    """Fetch the customer's open invoices (derived from the input: no outside call)."""
    seed = hashlib.sha256(ctx.input["customer"].encode()).digest()
    invoices = [
        {"id": f"inv-{seed[i]:03d}-{i}", "amount_cents": 1000 + 137 * seed[i]}
        for i in range(ctx.input["invoices"])
    ]
    return StepResult(cursor="validate", state={"invoices": invoices})


@flow.step()
def validate(ctx: Context) -> StepResult:
    """Ask the model to check the invoices; its answer joins the window."""
    question = {
        "role": "user",
        "content": f"VALIDATE these invoices for {ctx.input['customer']}: {ctx.state['invoices']}",
    }
    reply = ctx.model(messages=[*ctx.window, question], max_tokens=64)
    answer = text_of(reply).strip()
    window = [*ctx.window, question, {"role": "assistant", "content": answer}]
    return StepResult(
        cursor="send_email", state={"validated": answer.startswith("VALID")}, window=window
    )


@flow.step()
def send_email(ctx: Context) -> StepResult:
    """The one external effect, keyed by run + cursor + visit: a replay is deduped."""
    return send_invoice_email(ctx, ctx.idempotency_key())


def send_invoice_email(ctx: Context, key: str | None) -> StepResult:
    """POST the invoice email; with key=None the mail API cannot dedupe a replay."""
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
        resp = httpx.post(
            f"{ctx.config.mail_url}/v1/send",
            json=body,
            headers={"Idempotency-Key": key} if key else {},
            timeout=30.0,
        )
    except httpx.TransportError as exc:
        raise Transient(f"mail API unreachable: {exc}") from exc
    if resp.status_code >= 500:
        raise Transient(f"mail API answered {resp.status_code}")
    resp.raise_for_status()
    return StepResult(cursor="record", state={"email_id": resp.json()["id"], "total_cents": total})


@flow.step()
def record(ctx: Context) -> StepResult:
    """Ledger entry in our own Postgres: commits with the checkpoint, or not at all."""
    ctx.db.execute(
        "INSERT INTO invoice_ledger (idempotency_key, run_id, customer, amount_cents)"
        " VALUES (%s, %s, %s, %s) ON CONFLICT (idempotency_key) DO NOTHING",
        (ctx.idempotency_key(), ctx.run_id, ctx.input["customer"], ctx.state["total_cents"]),
    )
    nxt = "await_payment" if ctx.input.get("await_payment") else DONE
    return StepResult(cursor=nxt, state={"outcome": "sent"})


@flow.step()
def await_payment(ctx: Context) -> StepResult:
    """Wait for the "payment" signal without holding a worker (or give up at the timeout)."""
    return StepResult.wait("payment", cursor="settle", timeout=ctx.input["payment_timeout_s"])


@flow.step()
def settle(ctx: Context) -> StepResult:
    """Woken by the payment signal (its payload in ctx.signal), or by the timeout (None)."""
    if ctx.signal is None:
        return StepResult(cursor=DONE, state={"outcome": "unpaid"})
    return StepResult(cursor=DONE, state={"outcome": "paid", "payment": ctx.signal})
