"""OpenAI Agents SDK agents as cairn runs, on the SDK's public model, tool and run-state
interfaces.

    from agents import Agent, function_tool
    from cairn.openai_agents import agent_workflow

    agent = Agent(name="support", model="gpt-5-mini", tools=[lookup])
    flow = agent_workflow("support", agent)    # enqueue "support" with {"prompt": "..."}

Inside the workflow's step, every model request of the agent is a cairn model call
(ctx.amodel through CairnModelProvider: journaled, fenced by the run's epoch, under the
fleet's rate limit, priced against the run's budget), and every function tool call and
guardrail check a journaled call (ctx.acall), so a run killed anywhere resumes on another
worker without asking or acting again. A tool that needs approval parks the run, holding no
worker, until the signal "approval". With session=True the run is one turn of a chat
whose items live in cairn's Postgres (CairnSession), committed with the step's
checkpoint. Needs the extra: `pip install 'cairn[openai-agents]'`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

try:
    from agents import (
        Agent,
        AgentsException,
        InputGuardrailTripwireTriggered,
        OutputGuardrailTripwireTriggered,
        RunConfig,
        Runner,
        RunState,
        ToolApprovalItem,
        ToolExecutionConfig,
    )
    from agents.run import DEFAULT_MAX_TURNS
    from pydantic_core import to_jsonable_python
except ImportError as exc:  # the optional extra is missing
    raise ImportError(
        f"cairn.openai_agents needs openai-agents ({exc}); install it with "
        "pip install 'cairn[openai-agents]'"
    ) from exc

from cairn.contrib.openai_agents._journal import (
    CairnHooks,
    cairn_cause,
    journal_agent,
    journal_agents,
    journal_guardrail,
    journal_input_guardrail,
    jsonable,
    note_cairn_error,
)
from cairn.contrib.openai_agents._model import CairnModel, CairnModelProvider
from cairn.contrib.openai_agents._session import CairnSession, session_items
from cairn.contrib.openai_agents._steer import Steering, steered
from cairn.core.errors import CairnError, InvalidInput
from cairn.core.records import decision_in
from cairn.steps.context import Context
from cairn.steps.registry import DONE, Retry, StepResult, Workflow
from cairn.steps.registry import workflow as cairn_workflow

__all__ = [
    "APPROVAL",
    "CairnModel",
    "CairnModelProvider",
    "CairnSession",
    "GuardrailTripped",
    "agent_workflow",
    "run_config",
    "session_items",
]

APPROVAL = "approval"
"""The signal a run of `agent_workflow()` waits for when a tool call needs approval."""

_HOOKS = CairnHooks()


class GuardrailTripped(CairnError):
    """An input or output guardrail of the agent tripped: the run fails with its name and
    output_info (not retried: the journal would give the same verdict)."""

    def __init__(self, kind: str, name: str, info: Any) -> None:
        super().__init__(f"{kind} guardrail {name!r} tripped: {jsonable(info)!r:.500}")
        self.kind, self.name, self.info = kind, name, info


def run_config(base: RunConfig | None = None, *, stream: bool = False) -> RunConfig:
    """The RunConfig a cairn step runs an agent with: base's, with cairn's model provider
    (stream: each text delta a `token` event), function tools one at a time (a replay finds
    its calls in the journal's order), its guardrails journaled, and a tool's cairn errors
    (a Transient, a lost lease) raised rather than told to the model."""
    base = base or RunConfig()
    if base.model is not None and not isinstance(base.model, str | CairnModel):
        raise CairnError("RunConfig.model is a Model object: give a model name")
    for g in base.input_guardrails or ():
        journal_input_guardrail(g)
    for o in base.output_guardrails or ():
        journal_guardrail(o)
    tools = base.tool_execution or ToolExecutionConfig()
    return dataclasses.replace(
        base,
        model_provider=CairnModelProvider(stream=stream),
        tool_execution=dataclasses.replace(tools, max_function_tool_concurrency=1),
        tool_error_formatter=note_cairn_error(base.tool_error_formatter),
    )


def _validated(data: dict[str, Any]) -> dict[str, Any]:
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidInput("an Agents SDK run wants {'prompt': a non-empty string}")
    return data


def _validated_turn(data: dict[str, Any]) -> dict[str, Any]:
    session_id = data.get("session_id")
    if not isinstance(session_id, str) or not session_id.strip():
        raise InvalidInput(
            "an Agents SDK run with a session wants {'prompt': ..., 'session_id': a non-empty "
            "string}"
        )
    return _validated(data)


def _pending(items: list[ToolApprovalItem]) -> list[dict[str, Any]]:
    return [
        {"call_id": i.call_id, "tool": i.name, "agent": i.agent.name, "arguments": i.arguments}
        for i in items
    ]


def _request(pending: list[dict[str, Any]]) -> dict[str, Any]:
    """What the run asks the approvals inbox: the first pending call's tool and arguments
    (the SDK's JSON text, parsed when it parses), and every pending call."""
    first = pending[0]
    try:
        args = json.loads(first["arguments"])
    except (TypeError, ValueError):
        args = first["arguments"]
    names = ", ".join(sorted({str(p["tool"]) for p in pending}))
    return {"tool": first["tool"], "args": args, "calls": pending,
            "prompt": f"{first['agent']} asks to call {names}"}  # fmt: skip


def _decisions(payload: Any, pending: list[dict[str, Any]]) -> dict[str, bool]:
    """The approval signal's payload, {"approvals": {call_id: true | false}}, one decision
    for each pending call; or an inbox decision (Client.decide), one for them all."""
    wanted = {p["call_id"] for p in pending}
    found = decision_in(payload)
    if found is not None:
        if found[0] == "edit":  # the SDK runs an approved call with the model's arguments
            raise ValueError("an OpenAI Agents SDK tool call is approved or denied, not edited")
        return dict.fromkeys(wanted, found[0] == "approve")
    approvals = payload.get("approvals") if isinstance(payload, dict) else None
    if (
        not isinstance(approvals, dict)
        or set(approvals) != wanted
        or not all(isinstance(v, bool) for v in approvals.values())
    ):
        raise ValueError(
            "an approval signal wants {'approvals': {call_id: true|false}} for the calls "
            f"{sorted(wanted)}, not {payload!r:.200}"
        )
    return approvals


def _usage(before: Mapping[str, Any] | None, usage: Any) -> dict[str, int]:
    total = dict(before or {})
    for field in ("requests", "input_tokens", "output_tokens"):
        total[field] = int(total.get(field, 0)) + int(getattr(usage, field, 0) or 0)
    return total


def agent_workflow(
    name: str,
    agent: Agent[Any],
    *,
    context: Callable[[Context], Any] | None = None,
    config: RunConfig | None = None,
    max_turns: int = DEFAULT_MAX_TURNS,
    stream: bool = False,
    session: bool = False,
    steer: bool = False,
    retry: Retry | None = None,
    **options: Any,
) -> Workflow:
    """Register agent as the cairn workflow name: enqueue it with {"prompt": "..."}.

    One step, "agent", awaits Runner.run(agent, prompt) with run_config(config). The run's
    state is {"output": the final output as JSON, "agent": the agent that gave it, "usage":
    ...} when done, and its window the conversation (the SDK's input items). When a tool
    call needs approval (needs_approval), the run waits for the signal "approval" holding no
    worker, the pending calls in state["pending"] and the SDK's RunState in
    state["run_state"]; the payload {"approvals": {call_id: true|false}} resumes it (a
    malformed one is refused, the reason in state["rejected"]). The pending calls are in
    the approvals inbox (Client.approvals), whose decision (Client.decide: approve or deny)
    is one for them all. A tripped guardrail fails
    the run with GuardrailTripped. context(ctx): the agent's context object for this step.

    session=True: each run is a turn of the conversation input["session_id"] (enqueue with
    {"prompt": ..., "session_id": ...}), its history read from and its new items written to
    a CairnSession in the step's transaction, so they commit with the step's checkpoint:
    a killed or fenced step leaves no item, and the next turn sees this one's.

    steer=True: before each model request the agent takes in the run's steer messages
    (Client.steer; ctx.messages(), a journaled read) as user messages at the end of its
    input (the SDK's RunConfig.call_model_input_filter, before config's own), each once,
    in order, and kept in the later requests and the run's window (and, with session=True,
    written to the session at its place for the next turn). A message sent with
    interrupt=True (Client.steer) while a model request is in flight cuts it: its answer is
    discarded (the journal records the cut, its worst case counted as its cost) and the
    request is made again at once with the messages sent meanwhile at the end of its input.

    Wraps the function tools and guardrails of agent and of the agents it hands off to in
    place (journal_agents); outside a cairn step they run as before.
    """
    journal_agents(agent)
    settings = run_config(config, stream=stream)
    flow = cairn_workflow(name, validate=_validated_turn if session else _validated, **options)

    @flow.step("agent", retry=retry)
    async def run_agent(ctx: Context) -> StepResult:
        given = context(ctx) if context is not None else None
        start = await _start(ctx, agent, given)
        if isinstance(start, StepResult):  # a bad approval: wait for a good one
            return start
        memory = CairnSession(ctx.input["session_id"]) if session else None
        # One filter per step: what it took so far (kept in the state across a wait).
        steering = Steering(
            settings.call_model_input_filter, ctx.state.get("steered") or (), session=memory
        )
        try:
            with steering.steering() if steer else contextlib.nullcontext():
                result = await Runner.run(
                    agent,
                    start,
                    context=given,
                    max_turns=max_turns,
                    hooks=_HOOKS,
                    run_config=steering.config(settings) if steer else settings,
                    session=memory,
                )
        except AgentsException as exc:
            error = _cairn_error(exc)
            if error is exc:
                raise
            raise error from exc
        return _outcome(ctx, result, steering.taken)

    return flow


async def _start(
    ctx: Context, agent: Agent[Any], given: Any
) -> str | RunState[Any, Any] | StepResult:
    """Where the step's Runner.run starts: the prompt, or, after an approval signal, the
    SDK's RunState with each pending call approved or rejected; a malformed signal loses
    nothing: the step waits again, the reason in state["rejected"]."""
    pending = ctx.state.get("pending")
    if not pending:
        prompt: str = ctx.input["prompt"]  # or the SDK's input items, as validated
        return prompt
    try:
        decisions = _decisions(ctx.signal, pending)
    except ValueError as exc:
        return StepResult.wait(
            APPROVAL,
            cursor="agent",
            state={"pending": pending, "rejected": str(exc)},
            request=_request(pending),
        )
    start = await RunState.from_json(agent, ctx.state["run_state"], context_override=given)
    for item in start.get_interruptions():
        journal_agent(item.agent)  # a handoff() agent this process has not met
        if decisions[str(item.call_id)]:
            start.approve(item)
        else:
            start.reject(item)
    return start


def _cairn_error(exc: AgentsException) -> BaseException:
    """What the step raises for the SDK's exception: a tripped guardrail as GuardrailTripped
    (the run fails), a tool's cairn error as itself (a Transient: the step's retry policy
    decides), anything else as it was."""
    if isinstance(exc, InputGuardrailTripwireTriggered):
        g = exc.guardrail_result
        return GuardrailTripped("input", g.guardrail.get_name(), g.output.output_info)
    if isinstance(exc, OutputGuardrailTripwireTriggered):
        o = exc.guardrail_result
        return GuardrailTripped("output", o.guardrail.get_name(), o.output.output_info)
    cause = cairn_cause(exc)
    return exc if cause is None else cause


def _outcome(ctx: Context, result: Any, taken: list[list[Any]]) -> StepResult:
    """The step's result: a wait for approval while tool calls are pending, else done.
    taken: the steer messages the run took in, and where (Steering)."""
    usage = _usage(ctx.state.get("usage"), result.context_wrapper.usage)
    if result.interruptions:
        pending = _pending(result.interruptions)
        return StepResult.wait(
            APPROVAL,
            cursor="agent",
            request=_request(pending),
            state={
                "pending": pending,
                "run_state": result.to_state().to_json(),
                "rejected": None,
                "usage": usage,
                "steered": taken,
            },
        )
    return StepResult(
        cursor=DONE,
        state={
            "output": jsonable(to_jsonable_python(result.final_output, fallback=str)),
            "agent": result.last_agent.name,
            "pending": None,
            "run_state": None,
            "rejected": None,
            "usage": usage,
            "steered": None,
        },
        window=[jsonable(item) for item in steered(result.to_input_list(), taken)],
    )
