"""The demo `oa_agent` workflow: an OpenAI Agents SDK support agent run by cairn (the
`openai-agents` extra: `pip install 'cairn[openai-agents]'`).

The agent "support" has two function tools, "lookup" and "notify", and hands billing
questions off to a second agent, "billing", which answers. agent_workflow makes each of
its model requests a journaled cairn model call (the OpenAI Responses API, through the
worker's OpenAI client: OPENAI_BASE_URL) and each tool call a journaled call
("tool:lookup", "tool:notify"). "notify" emails the customer with its call's own
idempotency key, so a tool call run again after a kill sends the same key and the mail API
delivers it once. `cairn chaos oa_agent` kills it before and after each of those calls and
at the step's boundaries, and pauses workers past their lease.

The prompt's "TOOLS: lookup, notify, transfer_to_billing" line is the script of the local
model stand-in (cairn.testing.standins): it calls those tools in order, one a turn (the
handoff is the tool `transfer_to_billing`), then answers in text. A real model reads it as
a hint.

Input: {"prompt": str, "email": str}. The run's state is agent_workflow's: the answer in
state["output"], the agent that gave it in state["agent"].
"""

from __future__ import annotations

import httpx
from agents import Agent, RunConfig, function_tool

from cairn.core.errors import Transient
from cairn.openai_agents import agent_workflow
from cairn.steps.context import Context, current

MODEL = "gpt-5-mini"
# The stand-in has no trace endpoint: the SDK's traces would go to api.openai.com.
CONFIG = RunConfig(tracing_disabled=True)


def _context() -> Context:
    ctx = current()
    if ctx is None:
        raise RuntimeError("oa_agent's tools run inside a cairn step")
    return ctx


@function_tool
def lookup(query: str) -> str:
    """Search the help pages."""
    return f"help page about {query}"


@function_tool
async def notify(note: str) -> str:
    """Email the customer a note."""
    ctx = _context()
    body = {
        "to": ctx.input.get("email", "customer@example.com"),
        "subject": "About your question",
        "body": note,
        "ref": ctx.run_id,
    }
    async with httpx.AsyncClient(timeout=30.0) as client:
        try:
            resp = await client.post(
                f"{ctx.config.mail_url}/v1/send",
                json=body,
                headers={"Idempotency-Key": ctx.idempotency_key()},  # this tool call's own key
            )
        except httpx.TransportError as exc:
            raise Transient(f"mail API unreachable: {exc}") from exc
    if resp.status_code >= 500:
        raise Transient(f"mail API answered {resp.status_code}")
    resp.raise_for_status()
    return str(resp.json()["id"])


billing = Agent(name="billing", instructions="Answer billing questions.", model=MODEL)
support = Agent(
    name="support",
    instructions="Look the question up, email the customer, hand billing questions to billing.",
    model=MODEL,
    tools=[lookup, notify],
    handoffs=[billing],
)
flow = agent_workflow("oa_agent", support, config=CONFIG)
