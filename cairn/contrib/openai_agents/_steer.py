"""Steer messages (Client.steer) into an Agents SDK run, through the SDK's own hook for
input before a model call (RunConfig.call_model_input_filter), and into a request that a
message sent with interrupt=True cut (CairnModel asks the step's Steering, `active()`)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import inspect
import json
from collections.abc import Iterator, Sequence
from typing import Any

from agents import RunConfig
from agents.memory import Session
from agents.run_config import CallModelData, CallModelInputFilter, ModelInputData

from cairn.steps.context import current

# The Steering of the step running in this asyncio task (set around its Runner.run): with
# one, the agent's model requests may be cut, and a cut request is made again with it.
_active: contextvars.ContextVar[Steering | None] = contextvars.ContextVar(
    "cairn_agents_steering", default=None
)


def active() -> Steering | None:
    return _active.get()


class Steering:
    """The call_model_input_filter of one step's Runner.run with steer=True: before each
    model request it takes in the run's steer messages (ctx.messages(), a journaled read:
    a replay takes the same ones at the same place, and no more), each a user message at
    the end of that request's input, then runs the config's own filter, if any.

    The SDK keeps no item its filter adds, so each message is remembered with where it
    went (its place among the SDK's own items) and put back there in every later request
    and in the run's window: the conversation holds it once, in order. With a session
    (the run's CairnSession), each is also written to it as it is taken, in the step's
    transaction like the SDK's own items: the next turn reads it at its place.
    """

    def __init__(
        self,
        then: CallModelInputFilter | None,
        taken: Sequence[Any] = (),
        *,
        session: Session | None = None,
    ) -> None:
        self._then = then
        self._session = session
        # (place, item): before the SDK's item at place. JSON-ready: a run that waits for
        # approval keeps it in its state, and its resumed Runner.run starts from there.
        self.taken: list[list[Any]] = [list(t) for t in taken]
        self._at = 0  # the place of the request in hand: where a cut's messages go

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        given = list(data.model_data.input)
        self._at = len(given)
        await self._keep(await self._take())
        data.model_data.input = steered(given, self.taken)
        if self._then is None:
            return data.model_data
        out = self._then(data)
        return await out if inspect.isawaitable(out) else out

    async def cut(self, given: str | list[Any]) -> list[Any]:
        """The input of a request a steer message cut, made again at once: given with the
        messages read now (the one that cut it among them) at its end, and remembered at
        the request's place, as the filter's are, for the later requests and the window."""
        items = await self._take()
        await self._keep(items)
        start = [_user_item(given)] if isinstance(given, str) else list(given)
        return [*start, *items]

    async def _keep(self, items: list[dict[str, Any]]) -> None:
        """Remember items at the request's place; with a session, append them to it now.
        The SDK writes every item before a request to the session before making it (the
        input first, each turn's items after the turn), so now is their place there too."""
        for item in items:
            self.taken.append([self._at, item])
        if self._session is not None and items:
            # Also with a turn the SDK holds back over a wait for approval (output guardrails
            # and a tool_use_behavior not "run_llm_again": RunState._pending_session_write,
            # agents 0.24): the resumed Runner.run writes it before any later request, in
            # persist_resumed_turn (run.py, each resumed turn that goes on) or in
            # resume_pending_session_write at its start; what it cannot settle then it drops.
            # Each a user message, the SDK's EasyInputMessageParam, typed here as a dict.
            await self._session.add_items(items)  # type: ignore[arg-type]

    async def _take(self) -> list[dict[str, Any]]:
        """The run's steer messages not read yet, as user items (a journaled read)."""
        step = current()
        if step is None:
            return []
        return [_user_item(m) for m in await asyncio.to_thread(step.messages)]

    @contextlib.contextmanager
    def steering(self) -> Iterator[None]:
        """This Steering the one of the step's task, for as long as its Runner.run runs."""
        token = _active.set(self)
        try:
            yield
        finally:
            _active.reset(token)

    def config(self, base: RunConfig) -> RunConfig:
        """base with this filter in place of its own (which this one runs after)."""
        return dataclasses.replace(base, call_model_input_filter=self)


def steered(items: Sequence[Any], taken: Sequence[Sequence[Any]]) -> list[Any]:
    """items with each steer message taken put back at its place, in the order taken."""
    out: list[Any] = []
    done = 0
    for place, item in taken:
        out.extend(items[done:place])
        done = max(done, place)
        out.append(item)
    out.extend(items[done:])
    return out


def _user_item(message: Any) -> dict[str, Any]:
    """A steer message as a user message: text as it is, else its "content", else its
    JSON."""
    if isinstance(message, str):
        text = message
    else:
        content = message.get("content") if isinstance(message, dict) else None
        text = content if isinstance(content, str) else json.dumps(message)
    return {"role": "user", "content": text}
