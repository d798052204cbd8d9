"""pydantic-ai agents as cairn runs, on pydantic-ai's public durable-execution API.

    from pydantic_ai import Agent
    from cairn.pydantic_ai import CairnDurability, agent_workflow

    agent = Agent("anthropic:claude-haiku-4-5", name="support", capabilities=[CairnDurability()])
    flow = agent_workflow("support", agent)    # enqueue "support" with {"prompt": "..."}

Inside a cairn step, every model request and tool call of the agent is one journaled
call (`ctx.acall`): recorded in Postgres as it returns, fenced by the run's epoch, and
returned from the journal when a kill makes the step run again, so a resumed run pays for
none of the requests it already made and repeats none of its tools. Outside a cairn step
the capability does nothing, as pydantic-ai's other durable backends do. Needs the extra:
`pip install 'cairn[pydantic-ai]'`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

try:
    from pydantic import TypeAdapter, ValidationError
    from pydantic_ai import exceptions as pai_errors
    from pydantic_ai.agent import AbstractAgent
    from pydantic_ai.durable_exec import (
        JSON_CODEC,
        BaseDurabilityCapability,
        DurabilityEngineSpec,
        DurableOperationId,
        JournalCallableOperationBackend,
        ModelRequestId,
        RoleBasedOperationConfig,
    )
    from pydantic_ai.messages import (
        AgentStreamEvent,
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelResponse,
        PartDeltaEvent,
        PartStartEvent,
        TextPart,
        TextPartDelta,
        UserPromptPart,
    )
    from pydantic_ai.models import ModelRequestContext
    from pydantic_ai.tools import (
        AgentDepsT,
        DeferredToolRequests,
        DeferredToolResults,
        RunContext,
    )
    from pydantic_core import to_jsonable_python
except ImportError as exc:  # the optional extra is missing
    raise ImportError(
        f"cairn.pydantic_ai needs pydantic-ai ({exc}); install it with "
        "pip install 'cairn[pydantic-ai]'"
    ) from exc

from cairn.core.errors import CairnError, CallInterrupted, InvalidInput, ModelUnavailable
from cairn.core.records import decision_in
from cairn.steps.context import Context, current
from cairn.steps.model import ModelClient, cost_of
from cairn.steps.modelcalls import model_client
from cairn.steps.prices import Prices
from cairn.steps.providers import Route, guess_provider
from cairn.steps.providers.anthropic import DEFAULT_MAX_TOKENS
from cairn.steps.providers.transport import fence_requests
from cairn.steps.registry import DONE, Retry, StepResult, Workflow
from cairn.steps.registry import workflow as cairn_workflow
from cairn.steps.window import json_size

__all__ = [
    "APPROVAL",
    "CairnDurability",
    "agent_workflow",
    "messages_of",
    "stream_tokens",
    "workflow",
]

APPROVAL = "approval"
"""The signal a run of `agent_workflow()` waits for when its agent deferred tool calls."""

_MESSAGES: TypeAdapter[list[ModelMessage]] = ModelMessagesTypeAdapter
_REQUESTS = TypeAdapter(DeferredToolRequests)
_RESULTS = TypeAdapter(DeferredToolResults)
_run_ids: weakref.WeakKeyDictionary[Context, int] = weakref.WeakKeyDictionary()
# The steer messages cuts took in, by step, agent run and request step (_request_step).
_cut_in: weakref.WeakKeyDictionary[Context, dict[tuple[str, int], list[ModelRequest]]] = (
    weakref.WeakKeyDictionary()
)


def _model_cost(payload: Any, prices: Prices | None = None) -> float:
    """The cost of one recorded ModelResponse (JSON), by cairn's price table for its
    provider (pydantic-ai's usage counts cached tokens in input_tokens; each is priced as
    billed); a model cairn does not list is priced as its provider's dearest, so cost is
    never under-counted."""
    if not isinstance(payload, dict):
        return cost_of("", {})
    name = payload.get("model_name") or ""
    provider = payload.get("provider_name")
    provider = provider if provider in ("anthropic", "openai") else guess_provider(name)
    return cost_of(name, payload.get("usage") or {}, provider, prices)


def _worst_cost(model_name: str, cache_key: tuple[object, ...], prices: Prices | None) -> float:
    """A cut request's cost: what the provider billed for the answer it began is not known,
    so its worst case (its messages at 3 bytes a token, the most output its settings
    allow), as ctx.model's cut counts."""
    prompt, most = _sized(cache_key)
    usage = {"input_tokens": prompt, "output_tokens": most or DEFAULT_MAX_TOKENS}
    provider = guess_provider(model_name)
    return cost_of(
        model_name, usage, provider if provider in ("anthropic", "openai") else None, prices
    )


# pydantic-ai's errors a later request may not meet: the step is retried later (cairn's
# Transient), not failed, and nothing is journaled for the request.
_TRANSIENT = (
    pai_errors.ModelRateLimitError,
    pai_errors.ModelUnavailableError,
    pai_errors.ModelServerError,
    pai_errors.ModelConnectionError,
    pai_errors.ModelRequestTimeout,
)


def _booking(model: ModelClient, where: Route, cache_key: tuple[object, ...]) -> int:
    """Tokens to book for a model request: its messages at 3 bytes a token and the most
    output its settings allow (cache_key is pydantic-ai's: model id, messages, settings,
    ...; a key of another shape books the default output only, settled after)."""
    prompt, most = _sized(cache_key)
    request = {"max_tokens": most, "max_completion_tokens": most}
    return prompt + model.providers[where.provider].max_output(where.api, request)


def _sized(cache_key: tuple[object, ...]) -> tuple[int, int | None]:
    """A request's prompt in tokens (its messages at 3 bytes a token) and the most output
    its settings allow (None: not said), from pydantic-ai's cache key (model id, messages,
    settings, ...; a key of another shape: no messages)."""
    messages, settings = (cache_key[1], cache_key[2]) if len(cache_key) >= 3 else ([], None)
    try:
        prompt = json_size(_MESSAGES.dump_python(list(messages), mode="json"))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        prompt = 0
    most = (settings or {}).get("max_tokens") if isinstance(settings, dict) else None
    return prompt // 3 + 1, most


@contextlib.asynccontextmanager
async def _limited(
    ctx: Context, model_name: str, cache_key: tuple[object, ...]
) -> AsyncIterator[dict[str, Any]]:
    """A model request of the agent's under the fleet's rate limit, as ctx.model's are
    (the worker's ModelClient: per provider, model and key, the key being the one its
    environment gives the provider, as pydantic-ai's own providers read it): booked and
    waited for before, a 429's headers backing the fleet off, the tokens settled after
    (the body puts the response's usage in the yielded dict). Its transient failures
    become ModelUnavailable, so the step is retried rather than failed."""
    model = model_client(ctx)
    provider = guess_provider(model_name)
    admission = None
    if model is not None and model.limiter is not None and provider is not None:
        where = Route(provider, "messages" if provider == "anthropic" else "chat", model_name)
        # Redis calls in a thread: the step's event loop goes on with its other tasks.
        admission = await asyncio.to_thread(model.admit, where, _booking(model, where, cache_key))
        await asyncio.sleep(admission.wait)  # the request after it: fenced (fence_requests)
    answer: dict[str, Any] = {}
    try:
        yield answer
    except Exception as exc:
        if admission is not None and model is not None:
            failed = ModelClient.failure(exc)
            if failed is not None:
                await asyncio.to_thread(model.answered, admission, *failed, None)
        if isinstance(exc, _TRANSIENT):
            raise ModelUnavailable(f"model {model_name}: {exc}") from exc
        raise
    if admission is not None and model is not None:
        await asyncio.to_thread(model.answered, admission, 200, None, answer.get("usage"))


class _Backend(JournalCallableOperationBackend[None]):
    """Each durable unit pydantic-ai hands over (model request, tool call, ...) is one
    journaled call of the step in hand, named by pydantic-ai's journal convention.
    interruptible: a model request may be cut by a steer message (CairnDurability(steer=))."""

    def __init__(self, *, interruptible: bool = False, **options: Any) -> None:
        super().__init__(**options)
        self.interruptible = interruptible

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: None,
    ) -> object:
        ctx = current()
        if ctx is None:  # not in a cairn step: nothing to record
            return await body()
        if isinstance(operation_id, ModelRequestId):
            model = model_client(ctx)
            prices = model.prices if model is not None else None

            async def request() -> object:
                try:
                    async with _limited(ctx, operation_id.model_name, cache_key) as answer:
                        payload = await body()
                        if isinstance(payload, dict):
                            answer["usage"] = payload.get("usage")
                except asyncio.CancelledError:
                    if self.interruptible:  # cut: recorded with the cut, as ctx.model's is
                        ctx.add_cost(_worst_cost(operation_id.model_name, cache_key, prices))
                    raise
                ctx.add_cost(_model_cost(payload, prices))  # recorded with the call, counted once
                return payload

            # max_cost=0: a run already over its budget stops before the request.
            return await ctx.acall(name, request, max_cost=0.0, interruptible=self.interruptible)
        return await ctx.acall(name, body)


@dataclass(init=False, kw_only=True)
class CairnDurability(BaseDurabilityCapability[AgentDepsT]):
    """Makes an agent durable inside a cairn step: attach it with `capabilities=[...]`.

    Model requests, tool calls, tool-argument validation and whatever else pydantic-ai
    routes through its durable backend become journaled calls of the step (`ctx.acall`),
    keyed by run, step, visit, operation name and count. Inside a tool, `cairn.current()`
    is the step's Context: `ctx.idempotency_key()` is that tool call's own key and
    `ctx.db` a transaction that commits with the call's journal record.

    The tool calls of one model response run side by side (pydantic-ai's parallel tool
    calls): each takes its journal place as its task starts, in the order the response
    lists them, not as it finishes, so a replay finds each one's record.
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="cairn",
        durable_unit_noun="journaled call",
        durable_container_noun="run",
        codec=JSON_CODEC,  # the journal holds JSON
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-in-durable-unit",  # a unit runs in the step's own process
            "dynamic": "enter-never",
        },
        # A toolset added per run was never wrapped: its calls would run again on replay.
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        journal_discovery=True,
        # Places are taken at call start, in the order the tasks start: parallel is stable.
        sequential_tools_in_durable_context=False,
        tool_config_key=None,
    )

    def __init__(self, *, steer: bool = False, **options: Any) -> None:
        """steer: before each model request, the agent takes in the run's steer messages
        (Client.steer; ctx.messages(), a journaled read) as a user prompt, so its user can
        add to a conversation while it works. A message sent with interrupt=True while a
        model request is in flight cuts it: its answer is discarded (the journal records
        the cut) and the request is made again at once with the messages sent meanwhile.
        options: pydantic-ai's own (name=, ...)."""
        super().__init__(**options)
        self.steer = steer

    @property
    def in_durable_context(self) -> bool:
        return current() is not None

    async def before_model_request(
        self, ctx: RunContext[AgentDepsT], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        request_context = await super().before_model_request(ctx, request_context)
        step = current()
        if not self.steer or step is None:
            return request_context
        # A journaled read at this place of the step: a replay takes in the same messages
        # before the same request, and the model's answer to them comes from the journal.
        for message in await asyncio.to_thread(step.messages):
            # pydantic-ai's own input: into this request and the agent's history (the
            # run's window), each message a user prompt of its own.
            ctx.enqueue(UserPromptPart(_said(message)))
        return request_context

    def _handles_model_request_error(
        self, ctx: RunContext[AgentDepsT], request_context: ModelRequestContext
    ) -> bool:
        # Only a steered agent's requests can be cut: the others keep pydantic-ai's lazily
        # opened streams (it opens a stream early for a capability that handles errors).
        return self.steer

    async def on_model_request_error(
        self, ctx: RunContext[AgentDepsT], *, request_context: ModelRequestContext, error: Exception
    ) -> ModelResponse:
        step = current()
        if not (self.steer and step is not None and isinstance(error, CallInterrupted)):
            return await super().on_model_request_error(
                ctx, request_context=request_context, error=error
            )
        # Cut by a steer message: the messages sent meanwhile (a journaled read: a replay
        # meets the same cut and takes the same ones) go into the agent's history as a
        # request of their own, and into each further attempt at this request step.
        said = await asyncio.to_thread(step.messages)
        if said:
            parts = [UserPromptPart(_said(message)) for message in said]
            taken = ModelRequest(parts, run_id=ctx.run_id, conversation_id=ctx.conversation_id)
            ctx.messages.append(taken)
            _cut_in.setdefault(step, {}).setdefault(_request_step(ctx), []).append(taken)
        raise pai_errors.RetryModelRequest

    async def prepare_model_request(
        self, ctx: RunContext[AgentDepsT], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        request_context = await super().prepare_model_request(ctx, request_context)
        step = current()
        if step is not None:
            # Each request the model's SDK client sends, its own retries after their
            # back-off too, is checked against the run's lease as it goes out.
            fence_requests(getattr(_unwrapped(request_context.model), "client", None))
            # Each attempt starts from the request as it was before the first: put back
            # what the cuts of earlier attempts took in.
            for taken in _cut_in.get(step, {}).get(_request_step(ctx), ()):
                if not any(m is taken for m in request_context.messages):
                    request_context.messages.append(taken)
        return request_context

    def get_default_run_id(self) -> str | None:
        ctx = current()
        if ctx is None:
            return None
        # The n-th agent run of this step visit: the same on every replay of the visit.
        n = _run_ids.get(ctx, 0)
        _run_ids[ctx] = n + 1
        return f"{ctx.run_id}:{ctx.cursor}:{ctx.visit}:{n}"

    def get_default_conversation_id(self, run_id: str) -> str | None:
        ctx = current()
        return ctx.run_id if ctx is not None else None  # one cairn run, one conversation

    async def get_run_start_time(self, run_id: str) -> dt.datetime | None:
        ctx = current()
        if ctx is None:
            return None

        def now() -> str:
            return dt.datetime.now(dt.UTC).isoformat()

        # Journaled, so a resumed run counts its timeout= from when it first started.
        return dt.datetime.fromisoformat(await ctx.acall(f"{self.name}__run_start_time", now))

    def get_durable_operation_backend(self) -> _Backend:
        return _Backend(
            interruptible=self.steer,
            agent_name=self.name,
            default_model_id=self.default_model_id,
            config=RoleBasedOperationConfig(model=None, event=None, capability=None, tool=None),
        )


async def stream_tokens(run_ctx: Any, events: AsyncIterable[AgentStreamEvent]) -> None:
    """An event_stream_handler that puts the agent's text, as the model writes it, on the
    run's live stream (`token` events: Client.events, GET /runs/{id}/events):

        CairnDurability(event_stream_handler=stream_tokens)

    pydantic-ai then makes each model request a streamed one, inside its journaled call;
    a replay returns the recorded response and streams nothing again."""
    async for event in events:
        ctx = current()
        if ctx is None:
            continue
        if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
            if event.part.content:
                ctx.token(event.part.content)
        elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
            ctx.token(event.delta.content_delta)


def _unwrapped(model: Any) -> Any:
    """The model under pydantic-ai's wrappers (its durable model, a fallback's)."""
    while getattr(model, "wrapped", None) is not None:
        model = model.wrapped
    return model


def _request_step(ctx: RunContext[Any]) -> tuple[str, int]:
    """One request step of one agent run (its attempts share it)."""
    return ctx.run_id or "", ctx.run_step


def _said(message: Any) -> str:
    """A steer message as the agent's user prompt: text as it is, else its "content", else
    its JSON."""
    if isinstance(message, str):
        return message
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else json.dumps(message)


def messages_of(window: Sequence[Mapping[str, Any]]) -> list[ModelMessage]:
    """A run's window as pydantic-ai messages. A summary cairn's compaction put in place of
    the oldest messages becomes a user prompt."""
    out: list[dict[str, Any]] = []
    for m in window:
        if "kind" not in m and m.get("role") == "user":  # cairn's compaction summary
            out.append(
                {
                    "kind": "request",
                    "parts": [{"part_kind": "user-prompt", "content": str(m.get("content", ""))}],
                }
            )
        else:
            out.append(dict(m))
    return _MESSAGES.validate_python(out)


def _dump(messages: Sequence[ModelMessage]) -> list[dict[str, Any]]:
    return _MESSAGES.dump_python(list(messages), mode="json")  # type: ignore[no-any-return]


def _usage(before: Mapping[str, Any] | None, run: Any) -> dict[str, int]:
    total = dict(before or {})
    for field in ("requests", "tool_calls", "input_tokens", "output_tokens"):
        total[field] = int(total.get(field, 0)) + int(getattr(run, field, 0) or 0)
    return total


def _validated(data: dict[str, Any]) -> dict[str, Any]:
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidInput("a pydantic-ai run wants {'prompt': a non-empty string}")
    return data


def _request(pending: dict[str, Any]) -> dict[str, Any] | None:
    """What the run asks the approvals inbox: the tool calls waiting for approval (the
    first one's tool and args, and all of them); None when only external calls wait."""
    calls = [
        {"tool_call_id": c.get("tool_call_id"), "tool": c.get("tool_name"), "args": c.get("args")}
        for c in pending.get("approvals") or []
    ]
    if not calls:
        return None
    first = calls[0]
    names = ", ".join(sorted({str(c["tool"]) for c in calls}))
    return {"tool": first["tool"], "args": first["args"], "calls": calls,
            "prompt": f"The agent asks to call {names}"}  # fmt: skip


def _decided(payload: Any, pending: dict[str, Any]) -> Any:
    """An inbox decision (Client.decide) as the approval payload below: the one decision
    for each call waiting for approval, an edit's args as the first call's override."""
    found = decision_in(payload)
    if found is None:
        return payload
    if pending.get("calls"):
        raise ValueError("external calls wait for their results: an inbox decision has none")
    decision, args = found
    out: dict[str, Any] = {}
    for n, call in enumerate(pending.get("approvals") or []):
        verdict: Any = decision != "deny"
        if decision == "edit" and n == 0:
            verdict = {"kind": "tool-approved", "override_args": args}
        out[call["tool_call_id"]] = verdict
    return {"approvals": out}


def _results(payload: Any) -> DeferredToolResults:
    """The approval signal's payload: {"approvals": {tool_call_id: true | false}, "calls":
    {tool_call_id: result}}, as pydantic-ai's DeferredToolResults."""
    if not isinstance(payload, dict) or not set(payload) <= {"approvals", "calls", "metadata"}:
        raise ValueError(
            "an approval signal wants {'approvals': {tool_call_id: true|false}, "
            f"'calls': {{tool_call_id: result}}}}, not {payload!r:.200}"
        )
    try:
        return _RESULTS.validate_python(payload)
    except ValidationError as exc:
        raise ValueError(f"approval signal: {exc}") from exc


def agent_workflow(
    name: str,
    agent: AbstractAgent[Any, Any],
    *,
    deps: Callable[[Context], Any] | None = None,
    retry: Retry | None = None,
    **options: Any,
) -> Workflow:
    """Register agent as the cairn workflow name: enqueue it with {"prompt": "..."}.

    One step, "agent", awaits agent.run(prompt). The run's state is {"output": the agent's
    output as JSON, "usage": ...} when done; the conversation is the run's window (saved
    with the step, compacted as any window is), and its cost counts against the run's
    budget. When the agent defers tool calls (output_type includes DeferredToolRequests:
    tools with requires_approval=True, or raising CallDeferred), the run waits for the
    signal "approval" holding no worker, with the pending calls in state["pending"]; the
    signal's payload {"approvals": {tool_call_id: true|false}, "calls": {id: result}}
    resumes it. Calls waiting for approval are in the approvals inbox (Client.approvals),
    whose decision (Client.decide) is one for them all, an edit's args the first call's.
    deps(ctx): the agent's deps for this step, if it takes any.
    """
    if CairnDurability.from_agent(agent) is None:
        raise CairnError(
            f"agent {getattr(agent, 'name', None)!r} has no CairnDurability: build it with "
            "Agent(..., capabilities=[cairn.pydantic_ai.CairnDurability()]) so its model "
            "requests and tool calls are journaled"
        )
    flow = cairn_workflow(name, validate=_validated, **options)

    @flow.step("agent", retry=retry)
    async def run_agent(ctx: Context) -> StepResult:
        history = messages_of(ctx.window)
        prompt: str | None = None
        deferred: DeferredToolResults | None = None
        pending = ctx.state.get("pending")
        if pending is not None:
            try:
                deferred = _results(_decided(ctx.signal, pending))
            except ValueError as exc:  # a bad signal loses nothing: wait for a good one
                return StepResult.wait(
                    APPROVAL,
                    cursor="agent",
                    state={"pending": pending, "rejected": str(exc)},
                    request=_request(pending),
                )
        elif not history:
            prompt = ctx.input["prompt"]
        result = await agent.run(
            prompt,
            message_history=history or None,
            deferred_tool_results=deferred,
            deps=deps(ctx) if deps is not None else None,
        )
        window = [*ctx.window, *_dump(result.all_messages()[len(history) :])]
        usage = _usage(ctx.state.get("usage"), result.usage)
        if isinstance(result.output, DeferredToolRequests):
            asked = _REQUESTS.dump_python(result.output, mode="json")
            return StepResult.wait(
                APPROVAL,
                cursor="agent",
                state={"pending": asked, "rejected": None, "usage": usage},
                window=window,
                request=_request(asked),
            )
        output = to_jsonable_python(result.output)
        return StepResult(
            cursor=DONE,
            state={"output": output, "pending": None, "rejected": None, "usage": usage},
            window=window,
        )

    return flow


# Its name until 0.1: `cairn.workflow` is the step API's; this one registers an agent.
workflow = agent_workflow
