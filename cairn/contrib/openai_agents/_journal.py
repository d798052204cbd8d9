"""An Agents SDK agent's function tools and guardrails as journaled calls of the step in
hand (ctx.acall), wrapped in place, and the SDK's errors around them read back as cairn's."""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    GuardrailFunctionOutput,
    InputGuardrail,
    OutputGuardrail,
    RunContextWrapper,
    RunHooks,
    ToolErrorFormatterArgs,
)
from agents.tool_context import ToolContext
from pydantic_core import to_jsonable_python

from cairn.core.errors import CairnError
from cairn.steps.context import current

_MARK = "__cairn_journaled__"  # on a wrapped invoker or guardrail function: wrap once

# The cairn errors a tool raised that the SDK's failure handler turned into a message for
# the model: the tool's journaled call raises them instead (see note_cairn_error).
_swallowed: contextvars.ContextVar[list[CairnError] | None] = contextvars.ContextVar(
    "cairn_agents_swallowed", default=None
)


def jsonable(value: Any) -> Any:
    """value as the journal keeps it: itself if JSON, else its JSON form by pydantic (a
    ToolOutputText is {"type": "text", ...}, which the SDK reads as it reads the model)."""
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError):
        return to_jsonable_python(value, fallback=str)


def journal_agents(agent: Agent[Any]) -> list[Agent[Any]]:
    """Wrap the function tools and guardrails of agent and of every Agent it hands off to
    (a Handoff object's agent is wrapped when the run hands off to it: CairnHooks). Returns
    the agents reached. Raises CairnError for what cairn cannot journal."""
    seen: dict[int, Agent[Any]] = {}
    todo = [agent]
    while todo:
        a = todo.pop()
        if id(a) in seen:
            continue
        seen[id(a)] = a
        journal_agent(a)
        todo.extend(h for h in a.handoffs if isinstance(h, Agent))
    return list(seen.values())


def journal_agent(agent: Agent[Any]) -> None:
    """Wrap agent's function tools and guardrails in place (idempotent). Outside a cairn
    step they run as before."""
    if agent.mcp_servers:
        raise CairnError(
            f"agent {agent.name!r} has MCP servers: their tools come per run and would not be "
            "journaled; give the agent function tools"
        )
    if agent.model is not None and not isinstance(agent.model, str):
        from cairn.contrib.openai_agents._model import CairnModel

        if not isinstance(agent.model, CairnModel):
            raise CairnError(
                f"agent {agent.name!r} has a Model object ({type(agent.model).__name__}): its "
                "requests would bypass cairn's journal; give it a model name"
            )
    for tool in agent.tools:
        if isinstance(tool, FunctionTool):
            journal_tool(tool)
    for g in agent.input_guardrails:
        journal_input_guardrail(g)
    for o in agent.output_guardrails:
        journal_guardrail(o)


def journal_tool(tool: FunctionTool) -> None:
    """The tool's every invocation one journaled call, "tool:<name>": a replay returns the
    recorded output and runs nothing. Inside the tool, cairn.current() is the step's
    Context and ctx.idempotency_key() the call's own key."""
    inner = tool.on_invoke_tool
    if getattr(inner, _MARK, False):
        return
    name = f"tool:{tool.name}"

    async def invoke(context: ToolContext[Any], arguments: str) -> Any:
        ctx = current()
        if ctx is None:
            return await inner(context, arguments)

        async def body() -> Any:
            swallowed: list[CairnError] = []
            token = _swallowed.set(swallowed)
            try:
                output = await inner(context, arguments)
            finally:
                _swallowed.reset(token)
            if swallowed:  # not the tool's answer: cairn's (retry the step, stop the run)
                raise swallowed[0]
            return jsonable(output)

        return await ctx.acall(name, body)

    setattr(invoke, _MARK, True)
    tool.on_invoke_tool = invoke


def journal_input_guardrail(guardrail: InputGuardrail[Any]) -> None:
    # Before the model call, not beside it: a replay finds the calls in the order they
    # were made, and a tripped guardrail costs no request.
    guardrail.run_in_parallel = False
    journal_guardrail(guardrail)


def journal_guardrail(guardrail: InputGuardrail[Any] | OutputGuardrail[Any]) -> None:
    """The guardrail's check one journaled call, "guardrail:<name>": a replay gets the
    verdict it had (a guardrail that asks a model is not asked again), with its output_info
    as JSON."""
    check: Callable[..., Any] = guardrail.guardrail_function
    if getattr(check, _MARK, False):
        return
    name = f"guardrail:{guardrail.get_name()}"

    @functools.wraps(check)  # its __name__ is the guardrail's default name
    async def journaled(context: RunContextWrapper[Any], agent: Agent[Any], value: Any) -> Any:
        ctx = current()
        if ctx is None:
            return await _maybe(check(context, agent, value))

        async def verdict() -> dict[str, Any]:
            out = await _maybe(check(context, agent, value))
            return {"tripwire_triggered": out.tripwire_triggered, "info": jsonable(out.output_info)}

        done = await ctx.acall(name, verdict)
        return GuardrailFunctionOutput(
            output_info=done["info"], tripwire_triggered=done["tripwire_triggered"]
        )

    setattr(journaled, _MARK, True)
    guardrail.guardrail_function = journaled


async def _maybe(value: Awaitable[Any] | Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def note_cairn_error(
    theirs: Callable[[ToolErrorFormatterArgs[Any]], Any] | None,
) -> Callable[[ToolErrorFormatterArgs[Any]], Awaitable[str | None]]:
    """A RunConfig.tool_error_formatter that notes a cairn error a tool raised (the SDK's
    default failure handler would send it to the model as the tool's output, and the
    journal would keep it), then formats as theirs does."""

    async def formatter(args: ToolErrorFormatterArgs[Any]) -> str | None:
        held = _swallowed.get()
        if held is not None and isinstance(args.error, CairnError):
            held.append(args.error)
        if theirs is None:
            return None
        return await _maybe(theirs(args))  # type: ignore[no-any-return]

    return formatter


class CairnHooks(RunHooks[Any]):
    """Wraps an agent the run reaches that agent_workflow could not see (the agent of a
    handoff() object) before its turn."""

    async def on_agent_start(self, context: Any, agent: Agent[Any]) -> None:
        journal_agent(agent)

    async def on_handoff(
        self, context: RunContextWrapper[Any], from_agent: Agent[Any], to_agent: Agent[Any]
    ) -> None:
        journal_agent(to_agent)


def cairn_cause(exc: BaseException) -> CairnError | None:
    """The cairn error under an SDK error (a tool's Transient inside the SDK's UserError,
    a model call's ModelUnavailable), so the loop sees it as from any step."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, CairnError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None
