"""OpenAI Agents SDK agents as cairn workflows, for the tests
(CAIRN_WORKFLOWS=tests.helpers.oa_flows).

`oa_support` is a triage agent with two tools, a lookup (counted here, per run) and a
keyed HTTP effect (the mail stand-in, Idempotency-Key = the tool call's own key), and a
handoff to `billing`, which answers. The model is the worker's OpenAI client pointed at the
stand-in (OPENAI_BASE_URL, or CAIRN_OPENAI_BASE_URL), which calls the tools the prompt's
"TOOLS:" line lists, one a turn, handoffs included (`transfer_to_billing`), then answers.
`oa_refunds` has a tool that needs approval; `oa_guarded` an input guardrail.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from typing import Any

import httpx
from agents import (
    Agent,
    AgentHooks,
    GuardrailFunctionOutput,
    RunConfig,
    RunContextWrapper,
    function_tool,
    input_guardrail,
    output_guardrail,
)

import cairn
from cairn.openai_agents import agent_workflow

MODEL = "gpt-5-mini"
PLAN = "lookup, notify, transfer_to_billing"  # two tools and a handoff: four requests a run
# The stand-in has no trace endpoint: the SDK's traces would go to api.openai.com.
CONFIG = RunConfig(tracing_disabled=True)

made: defaultdict[str, list[str]] = defaultdict(list)  # what really ran, per run id


@function_tool
def lookup(query: str) -> str:
    """Search the help pages."""
    ctx = cairn.current()
    _pause(ctx)
    made[ctx.run_id if ctx else "outside"].append(f"lookup {query}")
    return f"help page about {query}"


def _pause(ctx: cairn.Context | None) -> None:
    """The fleet test's pause: input {"pause": {"seconds": s, "marker": path}} sleeps in the
    first lookup of the first attempt (the marker says it started)."""
    pause = ctx.input.get("pause") if ctx is not None else None
    if pause and not os.path.exists(pause["marker"]):
        with open(pause["marker"], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(pause["seconds"])


@function_tool
async def notify(note: str) -> str:
    """Email the customer a note: the one external effect, keyed by this tool call."""
    ctx = cairn.current()
    assert ctx is not None
    async with httpx.AsyncClient(timeout=30.0) as client:
        try:
            resp = await client.post(
                f"{ctx.config.mail_url}/v1/send",
                json={"to": "customer@example.com", "subject": "note", "body": note},
                headers={"Idempotency-Key": ctx.idempotency_key()},
            )
        except httpx.TransportError as exc:
            raise cairn.Transient(f"mail API unreachable: {exc}") from exc
    if resp.status_code >= 500:
        raise cairn.Transient(f"mail API answered {resp.status_code}")
    resp.raise_for_status()
    made[ctx.run_id].append("notify")
    return str(resp.json()["id"])


billing = Agent(name="billing", instructions="Answer billing questions.", model=MODEL)
support = Agent(
    name="support",
    instructions="Help the customer; hand billing questions to billing.",
    model=MODEL,
    tools=[lookup, notify],
    handoffs=[billing],
)
flow = agent_workflow("oa_support", support, config=CONFIG)


# -- a tool that needs a person's approval ---------------------------------------------------
@function_tool(needs_approval=True)
def refund(order: str) -> str:
    """Refund an order (a person approves it first)."""
    ctx = cairn.current()
    made[ctx.run_id if ctx else "outside"].append(f"refund {order}")
    return f"refunded {order}"


refunder = Agent(name="refunds", instructions="Refund when asked.", model=MODEL, tools=[refund])
refunds = agent_workflow("oa_refunds", refunder, config=CONFIG)


# -- an input guardrail ----------------------------------------------------------------------
@input_guardrail
def no_secrets(
    context: RunContextWrapper[None], agent: Agent[None], text: object
) -> GuardrailFunctionOutput:
    """Trips on a prompt that asks for a secret."""
    ctx = cairn.current()
    made[ctx.run_id if ctx else "outside"].append("guardrail")
    asked = "secret" in str(text).lower()
    return GuardrailFunctionOutput(output_info={"secret": asked}, tripwire_triggered=asked)


guarded_agent = Agent(name="guarded", model=MODEL, tools=[lookup], input_guardrails=[no_secrets])
guarded = agent_workflow("oa_guarded", guarded_agent, config=CONFIG)

# The same support agent, its text streamed as token events.
streamed = agent_workflow("oa_streamed", support, config=CONFIG, stream=True)

# -- a chat: each run one turn of a conversation kept in cairn's Postgres (CairnSession) ----
chatter = Agent(name="chat", instructions="Chat with the customer.", model=MODEL, tools=[lookup])
chat = agent_workflow("oa_chat", chatter, config=CONFIG, session=True)
# The refunds agent as a chat: a turn that waits for approval keeps its items so far.
refund_chat = agent_workflow("oa_refund_chat", refunder, config=CONFIG, session=True)

# -- steering: the user adds to a running agent's conversation (Client.steer) ----------------
seen: defaultdict[str, list[list[str]]] = defaultdict(list)  # each request's user texts, per run
steer_clients: dict[str, cairn.Client] = {}  # the test's client, per run: a tool steers


class _SeenInput(AgentHooks[Any]):
    """Keeps what each model request of a run was sent (the SDK's on_llm_start gets the
    input as filtered, as the model gets it): its user messages' texts."""

    async def on_llm_start(
        self,
        context: RunContextWrapper[Any],
        agent: Agent[Any],
        system_prompt: Any,
        input_items: Any,
    ) -> None:
        ctx = cairn.current()
        users = [i["content"] for i in input_items if i.get("role") == "user"]
        seen[ctx.run_id if ctx else "outside"].append(users)


@function_tool
def consult(query: str) -> str:
    """Read a help page (while it runs, the user asks for French)."""
    ctx = cairn.current()
    assert ctx is not None
    steer_clients[ctx.run_id].steer(ctx.run_id, {"role": "user", "content": "in French"})
    return f"page about {query}"


steered_agent = Agent(name="steered", model=MODEL, tools=[consult], hooks=_SeenInput())
steered = agent_workflow("oa_steered", steered_agent, config=CONFIG, steer=True)
# The refunds agent, steered: a message taken before the wait for approval is in place after.
steered_refunder = Agent(name="steered_refunds", model=MODEL, tools=[refund], hooks=_SeenInput())
steered_refunds = agent_workflow("oa_steered_refunds", steered_refunder, config=CONFIG, steer=True)
# An agent its user cuts short: a message sent with interrupt=True while a model request is
# in flight cuts it, and the request is made again with the message in its input.
cut_agent = Agent(name="cut_short", model=MODEL)
cut_short = agent_workflow("oa_cut_short", cut_agent, config=CONFIG, steer=True)
# The same as a chat: the messages taken by a request, and by its cut, are in its session.
cut_chat = agent_workflow("oa_cut_chat", cut_agent, config=CONFIG, session=True, steer=True)
# Steered chats: the steer messages a turn took are in its session, for the next turn.
steered_chat = agent_workflow(
    "oa_steered_chat", steered_agent, config=CONFIG, session=True, steer=True
)
steered_refund_chat = agent_workflow(
    "oa_steered_refund_chat", steered_refunder, config=CONFIG, session=True, steer=True
)


# Guarded refunds: with an output guardrail and a tool_use_behavior not "run_llm_again", the
# SDK holds back a turn's session items when it waits for approval, and writes them on its
# resume before its next request (which takes the messages sent meanwhile).
@output_guardrail
def no_card_numbers(
    context: RunContextWrapper[Any], agent: Agent[Any], output: object
) -> GuardrailFunctionOutput:
    """Never trips: it only makes the SDK hold back a waiting turn's session items."""
    ctx = cairn.current()
    made[ctx.run_id if ctx else "outside"].append("output guardrail")
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered=False)


guarded_refunder = Agent(
    name="guarded_refunds",
    model=MODEL,
    tools=[refund, lookup],
    tool_use_behavior={"stop_at_tool_names": ["lookup"]},  # a refund runs the model again
    output_guardrails=[no_card_numbers],
    hooks=_SeenInput(),
)
guarded_refund_chat = agent_workflow(
    "oa_guarded_refund_chat", guarded_refunder, config=CONFIG, session=True, steer=True
)
