"""pydantic-ai agents as cairn workflows, for the tests (CAIRN_WORKFLOWS=tests.helpers.pai_flows).

`pai_support` is an Agent on pydantic-ai's own Anthropic model, through the real anthropic
SDK, pointed at the Messages-API stand-in (ANTHROPIC_BASE_URL), with three tools: a lookup,
a keyed HTTP effect (the mail stand-in, Idempotency-Key = the tool call's own key) and a
ctx.db write (a ledger row that commits with the call's journal record). The stand-in
calls the tools the prompt's "TOOLS:" line lists, one a turn, then answers in text.
"""

from __future__ import annotations

import functools
import os
import time

import httpx
from anthropic import AsyncAnthropic
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.providers.anthropic import AnthropicProvider

import cairn
from cairn.pydantic_ai import CairnDurability, agent_workflow

PLAN = "lookup, notify, remember, lookup"  # four tools, five model requests a run
REAL_API = "https://api.anthropic.com"


class StandIn(AnthropicProvider):
    """The SDK's client for ANTHROPIC_BASE_URL as it is at each request, not as it was
    when this module was imported: a test points it at its stand-in after another test
    (or a CAIRN_WORKFLOWS import) loaded the module, and must never reach the real API."""

    def __init__(self) -> None:
        super().__init__(anthropic_client=_client(REAL_API))

    @property
    def client(self) -> AsyncAnthropic:
        url = os.environ.get("ANTHROPIC_BASE_URL")
        if not url and not os.environ.get("ANTHROPIC_API_KEY"):
            raise RuntimeError(
                "tests.helpers.pai_flows talks to a Messages-API stand-in: set ANTHROPIC_BASE_URL "
                "(or ANTHROPIC_API_KEY for the real API)"
            )
        return _client(url or REAL_API)

    @property
    def base_url(self) -> str:
        return str(self.client.base_url)


@functools.cache
def _client(base_url: str) -> AsyncAnthropic:
    # One client per address: its connection pool outlives a request.
    return AsyncAnthropic(
        api_key=os.environ.get("ANTHROPIC_API_KEY") or "local-stand-in",
        base_url=base_url,
        max_retries=2,
    )


def _model() -> AnthropicModel:
    return AnthropicModel("claude-haiku-4-5", provider=StandIn())


agent = Agent(
    _model(),
    name="pai_support",
    instructions="Answer the customer; use the tools.",
    model_settings={"max_tokens": 256},
    capabilities=[CairnDurability()],
)


@agent.tool_plain
def lookup(query: str) -> str:
    """Search the help pages."""
    _pause(cairn.current())
    return f"help page about {query}"


def _pause(ctx: cairn.Context | None) -> None:
    """The zombie test's pause: input {"pause": {"seconds": s, "marker": path}} sleeps in
    the first lookup of the first attempt (the marker says it started)."""
    pause = ctx.input.get("pause") if ctx is not None else None
    if pause and not os.path.exists(pause["marker"]):
        with open(pause["marker"], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(pause["seconds"])


@agent.tool_plain
async def notify(note: str) -> str:
    """Email the customer a note: the one external effect, keyed by this tool call."""
    ctx = cairn.current()
    assert ctx is not None
    mail = ctx.config.mail_url
    async with httpx.AsyncClient(timeout=30.0) as client:
        try:
            resp = await client.post(
                f"{mail}/v1/send",
                json={
                    "to": "customer@example.com",
                    "subject": "note",
                    "body": note,
                    "ref": ctx.run_id,
                },
                headers={"Idempotency-Key": ctx.idempotency_key()},
            )
        except httpx.TransportError as exc:
            raise cairn.Transient(f"mail API unreachable: {exc}") from exc
    if resp.status_code >= 500:
        raise cairn.Transient(f"mail API answered {resp.status_code}")
    resp.raise_for_status()
    return str(resp.json()["id"])


@agent.tool_plain
def remember(fact: str) -> str:
    """Write a ledger row in our own Postgres, committed with this call's journal record."""
    ctx = cairn.current()
    assert ctx is not None
    key = ctx.idempotency_key()
    # No ON CONFLICT: a row written twice would fail the run, a row lost would be missing.
    ctx.db.execute(
        "INSERT INTO invoice_ledger (idempotency_key, run_id, customer, amount_cents)"
        " VALUES (%s, %s, %s, %s)",
        (key, ctx.run_id, fact[:100], 1),
    )
    return key


flow = agent_workflow("pai_support", agent)


# A refund needs a person's approval: the run waits for the "approval" signal.
approver = Agent(
    _model(),
    name="pai_refunds",
    instructions="Refund the customer when asked.",
    model_settings={"max_tokens": 256},
    output_type=[str, DeferredToolRequests],
    capabilities=[CairnDurability()],
)


@approver.tool_plain(requires_approval=True)
def refund(order: str) -> str:
    """Refund an order (a person approves it first)."""
    return f"refunded {order}"


refunds = agent_workflow("pai_refunds", approver)


# An agent its user cuts short: a message sent with interrupt=True while a model request is
# in flight cuts it, and the request is made again with the message in it.
cut_short = Agent(
    _model(),
    name="pai_cut_short",
    model_settings={"max_tokens": 64},
    capabilities=[CairnDurability(steer=True)],
)
agent_workflow("pai_cut_short", cut_short)
