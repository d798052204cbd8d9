"""The Agents SDK's model calls as cairn's: a ModelProvider whose models send each request
through ctx.amodel (journaled, fenced, limited, priced), on the SDK's own Responses model;
with steering on, a request a steer message cuts is made again with the message in."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import openai
from agents import Model, ModelProvider, ModelResponse, OpenAIProvider, OpenAIResponsesModel
from agents.models import get_default_model

from cairn.contrib.openai_agents._steer import active
from cairn.core.errors import CairnError, CallInterrupted
from cairn.steps.context import current


class _Responses:
    """`client.responses` as the SDK's Responses model calls it: create() only, which the
    SDK supports for custom clients (it falls back to it where a client has no more)."""

    def __init__(self, stream: bool) -> None:
        self._stream = stream

    async def create(self, **request: Any) -> Any:
        ctx = current()
        if ctx is None:  # CairnModel sends nothing here outside a step
            raise CairnError("cairn's Agents SDK client called outside a cairn step")
        # The SDK leaves out what it does not set with openai's Omit: the request is JSON
        # to cairn (its budget, its rate limit booking), and the SDK call takes it again.
        body = {
            k: v for k, v in request.items() if not isinstance(v, openai.Omit | openai.NotGiven)
        }
        body.pop("stream", None)  # the SDK's stream is never asked for here: see CairnModel
        # Steering on: a message sent with interrupt=True cuts the request (CairnModel).
        cut = active() is not None
        return await ctx.amodel(
            provider="openai", api="responses", stream=self._stream, interruptible=cut, **body
        )


class _StepClient:
    """What the SDK's OpenAIResponsesModel needs of an AsyncOpenAI, answered by the step in
    hand. No base_url: the SDK takes the endpoint for not OpenAI's own, and so adds none
    of its api.openai.com-only defaults (cairn's worker decides where requests go)."""

    def __init__(self, stream: bool) -> None:
        self.responses = _Responses(stream)


class CairnModel(Model):
    """One model of the Agents SDK's, by name, whose requests are cairn model calls inside
    a cairn step (ctx.amodel: journaled as "model", checked against the lease and budget,
    under the fleet's rate limit, priced, replayed from the journal on a resumed run), and
    the SDK's own OpenAI model outside one.

    The request is the one the SDK's OpenAIResponsesModel builds (tools, handoffs, output
    schema, settings); cairn's worker sends it with its OpenAI client (OPENAI_API_KEY,
    OPENAI_BASE_URL or CAIRN_OPENAI_BASE_URL). stream: each text delta a `token` event.
    """

    def __init__(self, name: str, *, stream: bool = False, outside: ModelProvider) -> None:
        self.name = name
        self._inside = OpenAIResponsesModel(name, openai_client=_StepClient(stream))  # type: ignore[arg-type]
        self._outside = outside

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        if current() is None:
            return await self._outside.get_model(self.name).get_response(*args, **kwargs)
        while True:
            try:
                return await self._inside.get_response(*args, **kwargs)
            except CallInterrupted:
                # Cut by a steer message (journaled, its answer discarded): asked again at
                # once with what was sent meanwhile at the end of its input. A replay meets
                # the same cut and reads the same messages from the journal.
                steering = active()
                if steering is None:
                    raise
                args, kwargs = await _with_input(steering.cut, args, kwargs)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        if current() is not None:
            # A step runs the agent with Runner.run; its text streams as token events.
            raise CairnError(
                "Runner.run_streamed inside a cairn step: use Runner.run, and "
                "CairnModelProvider(stream=True) to stream the text as token events"
            )
        return self._outside.get_model(self.name).stream_response(*args, **kwargs)


async def _with_input(
    change: Callable[[Any], Awaitable[list[Any]]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """get_response's arguments with its input (the second, or input=) changed."""
    if "input" in kwargs:
        return args, {**kwargs, "input": await change(kwargs["input"])}
    return (args[0], await change(args[1]), *args[2:]), kwargs


class CairnModelProvider(ModelProvider):
    """The Agents SDK's model provider for runs in cairn steps (agent_workflow passes it in
    its RunConfig): every model name becomes a CairnModel, an OpenAI Responses model whose
    requests are cairn model calls. A name "openai/<model>" is "<model>"; no name is the
    SDK's default model (OPENAI_DEFAULT_MODEL)."""

    def __init__(self, *, stream: bool = False) -> None:
        self._stream = stream
        self._outside = OpenAIProvider()
        self._models: dict[str, CairnModel] = {}

    def get_model(self, model_name: str | None) -> Model:
        name = model_name or get_default_model()
        prefix, slash, rest = name.partition("/")
        if slash:
            if prefix != "openai":
                raise CairnError(
                    f"model {name!r}: cairn's Agents SDK provider speaks OpenAI's Responses "
                    "API; give an OpenAI model name"
                )
            name = rest
        model = self._models.get(name)
        if model is None:
            model = self._models[name] = CairnModel(
                name, stream=self._stream, outside=self._outside
            )
        return model
