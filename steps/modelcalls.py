"""Model calls from a step: ctx.model and ctx.amodel through the worker's model client
(Anthropic or OpenAI, cairn.steps.model), journaled like any call (a replay returns the
recorded answer, uncalled), checked against the lease and the budget first, streamed as
token events when asked."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from cairn.core import tracing
from cairn.core.errors import CallInterrupted
from cairn.core.records import Call
from cairn.steps.journal import StepParts, as_json, error_of

if TYPE_CHECKING:
    from cairn.core.cuts import Cut
    from cairn.steps.model import ModelClient


class ModelCalls(StepParts):
    """The step context's model calls (ctx.model, ctx.amodel)."""

    # -- model -----------------------------------------------------------------------
    def model(
        self,
        *,
        stream: bool = False,
        provider: str | None = None,
        api: str | None = None,
        interruptible: bool = False,
        **request: Any,
    ) -> Any:
        """One model call through its provider's SDK, retried, journaled (a replay of the
        step returns the recorded answer, uncalled); its cost is counted once.

        Args:
            provider: "anthropic" or "openai"; by default the one `model=`'s name says
                (claude-* is Anthropic's; gpt-*, o1/o3/o4* OpenAI's), and without `model=`
                the worker's CAIRN_MODEL.
            api: OpenAI's "chat" (Chat Completions, the default) or "responses" (implied by
                `input=`).
            stream: through the SDK's streaming API, each text delta a `token` event on the
                run's stream as it arrives (cost from the final usage).
            interruptible: a steer message sent with interrupt=True (Client.steer) while
                the call is in flight cuts it: its answer is discarded, its worst case
                (prompt and max_tokens) counted as its cost, the cut journaled, and this
                raises CallInterrupted (a replay too, uncalled).
            **request: the SDK call's own arguments (messages=, max_tokens=, tools=...).

        Returns:
            The SDK's answer: an anthropic Message, an openai ChatCompletion or Response
            (`cairn.text_of` reads the text of each). Either way the whole answer is a
            `message` event once journaled, and again when a replay returns it.

        Raises:
            UnknownModel: a model, provider or API cairn cannot route (not retried).
            ModelUnavailable: the API kept answering 429/5xx or could not be reached.
        """
        if self._model is None:
            raise RuntimeError("no model client configured for this worker")
        request.update(_routing(provider, api))
        if self._inside() is not None:  # part of the call's own result: not journaled apart
            return self._ask(request, stream=stream)[0]
        pos, n = self._position("model")
        recorded = self._recorded(pos, "model")
        if recorded is not None:
            return self._replayed_message(pos, recorded)
        self._keyed(request, n)
        try:
            message, cost = self._ask(request, pos, stream, interruptible)
        except Exception as exc:
            self._model_failed(pos, exc, request)
            raise
        return self._answered(pos, message, cost)

    async def amodel(
        self,
        *,
        stream: bool = False,
        provider: str | None = None,
        api: str | None = None,
        interruptible: bool = False,
        **request: Any,
    ) -> Any:
        """ctx.model for async steps: the same journal, checks and events; the SDK call
        runs in a worker thread, so the step's event loop goes on with its other tasks."""
        if self._model is None:
            raise RuntimeError("no model client configured for this worker")
        request.update(_routing(provider, api))
        if self._inside() is not None:
            return (await self._aask(request, None, stream))[0]
        pos, n = self._position("model")
        recorded = self._recorded(pos, "model")
        if recorded is not None:
            return self._replayed_message(pos, recorded)
        self._keyed(request, n)
        try:
            message, cost = await self._aask(request, pos, stream, interruptible)
        except Exception as exc:
            self._model_failed(pos, exc, request)
            raise
        return self._answered(pos, message, cost)

    def _keyed(self, request: dict[str, Any], n: int) -> None:
        """An Idempotency-Key header on the request, the same on every attempt at this
        call: a provider that honours it bills a call a killed worker made once, when the
        next attempt makes it again (the stand-in does, cairn.testing.standins)."""
        from cairn.steps.model import ModelClient

        if isinstance(self._model, ModelClient):
            key = self._call_key("model", n)
            request["extra_headers"] = {"Idempotency-Key": key, **request.get("extra_headers", {})}

    def _replayed_message(self, pos: int, recorded: Call) -> Any:
        assert self._model is not None
        message = _decode(self._model, self._replay(recorded))
        if self._events is not None and isinstance(recorded.result, dict):
            self._tell("message", {"call": pos, **_shown(recorded.result), "replayed": True})
        return message

    def _answered(self, pos: int, message: Any, cost: float) -> Any:
        encoded = _encode(self._model, message)
        tokens = _used(message) if self._cp.budgets else 0  # only a budget counts them
        self._record(Call(pos=pos, name="model", result=encoded, cost_usd=cost, tokens=tokens))
        if self._events is not None and isinstance(encoded, dict):
            self._tell("message", {"call": pos, **_shown(encoded), "cost_usd": cost})
        return message

    def _ask(
        self,
        request: dict[str, Any],
        pos: int | None = None,
        stream: bool = False,
        interruptible: bool = False,
    ) -> tuple[Any, float]:
        """The model call itself (pos: its journal place; None inside a ctx.call)."""
        model = self._model
        assert model is not None
        self._check_model(request, pos)

        def made(cut: Cut | None = None) -> tuple[Any, float]:
            if stream:
                return self._stream(request, pos, cut)
            return model.create(**request)

        try:
            if interruptible and pos is not None:
                message, cost = self._uncut("model", pos, made)
            else:
                message, cost = made()
        except BaseException as exc:
            self._after_model(pos, exc)
            raise
        self._count(cost)
        if tracing.active():
            tracing.model_answered(_attributes(self._model, request, message), cost, stream)
        self._after_model(pos, None)
        return message, cost

    async def _aask(
        self,
        request: dict[str, Any],
        pos: int | None = None,
        stream: bool = False,
        interruptible: bool = False,
    ) -> tuple[Any, float]:
        model = self._model
        assert model is not None
        self._check_model(request, pos)

        async def made(cut: Cut | None = None) -> tuple[Any, float]:
            if stream:
                return await asyncio.to_thread(self._stream, request, pos, cut)
            return await asyncio.to_thread(model.create, **request)

        try:
            if interruptible and pos is not None:
                message, cost = await self._acut("model", pos, made)
            else:
                message, cost = await made()
        except BaseException as exc:
            self._after_model(pos, exc)
            raise
        self._count(cost)
        if tracing.active():
            tracing.model_answered(_attributes(self._model, request, message), cost, stream)
        self._after_model(pos, None)
        return message, cost

    def _stream(
        self, request: dict[str, Any], pos: int | None, cut: Cut | None = None
    ) -> tuple[Any, float]:
        stream = getattr(self._model, "stream", None)
        if stream is None:
            raise RuntimeError(f"{type(self._model).__name__} cannot stream: it has no stream()")
        call = pos if pos is not None else -1  # -1: inside a ctx.call, not journaled apart

        def on_text(text: str) -> None:
            if cut is None or not cut.fired:  # a cut answer's tokens go nowhere
                self._delta(call, text)

        def on_restart() -> None:
            # The retry's request was checked against the lease as it went out (the
            # transport's fence, as every try is).
            self._tell("model_restart", {"call": call})

        return stream(on_text, on_restart, **request)  # type: ignore[no-any-return]

    def _after_model(self, pos: int | None, exc: BaseException | None) -> None:
        if pos is not None and self._hooks is not None:
            self._hooks.after_call(self._cp, "model", pos, exc)

    def _model_failed(self, pos: int, exc: Exception, request: dict[str, Any]) -> None:
        if not self._recordable(exc):
            return
        # A request the API refuses is refused again on replay; a cut one is cut again, and
        # costs its worst case: what the API billed for the answer it began is not known.
        cost = 0.0
        worst = getattr(self._model, "worst_cost", None)  # a test's own client may have none
        if isinstance(exc, CallInterrupted) and worst is not None:
            cost = worst(**request)
            self._count(cost)
        self._record(Call(pos=pos, name="model", error=error_of(exc), cost_usd=cost))

    def _check_model(self, request: dict[str, Any], pos: int | None) -> None:
        assert self._model is not None
        # A model call costs money and shapes the run: a worker that lost the run must not
        # make one (a process resumed after SIGSTOP finds out here), nor a cancelled run.
        self._ensure_before_call()
        if self._cap is not None or (pos is not None and self._cp.budgets):
            worst = self._model.worst_cost(**request)
            self._afford(worst, "the next model call")
            if pos is not None and self._cp.budgets:
                count = getattr(self._model, "worst_tokens", None)  # a test's client may lack it
                tokens = count(**request) if count is not None else 0
                self._hold(pos, worst, "the next model call", tokens)
        if pos is not None and self._hooks is not None:
            self._hooks.before_call(self._cp, "model", pos)


def model_client(ctx: ModelCalls) -> ModelClient | None:
    """The worker's ModelClient a step's context calls through (None: none, or a test's
    own), for integrations that send model requests of their own (cairn.pydantic_ai) so
    they keep to the same rate limits and prices."""
    from cairn.steps.model import ModelClient

    return ctx._model if isinstance(ctx._model, ModelClient) else None


def _routing(provider: str | None, api: str | None) -> dict[str, Any]:
    """ctx.model's provider= and api=, for the client's request (only when given: a model
    client of a test's own need not know them)."""
    return {k: v for k, v in (("provider", provider), ("api", api)) if v is not None}


def _attributes(model: Any, request: dict[str, Any], message: Any) -> dict[str, Any]:
    """The answer's GenAI span attributes, by the client's provider's reading of it."""
    describe = getattr(model, "span_attributes", None)
    if describe is not None:
        return describe(request, message)  # type: ignore[no-any-return]
    name = getattr(message, "model", None) or request.get("model")
    return {"gen_ai.operation.name": "chat", "gen_ai.request.model": name}


def _used(message: Any) -> int:
    """The tokens an answer's usage reports (prompt, cached or not, and output), for token
    budgets; 0 for an answer without one."""
    from cairn.steps.prices import tokens_of

    usage = message.get("usage") if isinstance(message, dict) else getattr(message, "usage", None)
    if usage is None:
        return 0
    used = tokens_of(usage)
    return used.prompt + used.output


def _shown(message: dict[str, Any]) -> dict[str, Any]:
    from cairn.core.events import message_data

    return message_data(message)


def _encode(model: Any, message: Any) -> Any:
    encode = getattr(model, "encode", None)
    return encode(message) if encode else as_json(message, "the model client")


def _decode(model: Any, data: Any) -> Any:
    decode = getattr(model, "decode", None)
    return decode(data) if decode else data
