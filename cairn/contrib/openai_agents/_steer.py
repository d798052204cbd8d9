"""Steer messages (Client.steer) into an Agents SDK run, through the SDK's own hook for
input before a model call: RunConfig.call_model_input_filter."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
from collections.abc import Sequence
from typing import Any

from agents import RunConfig
from agents.run_config import CallModelData, CallModelInputFilter, ModelInputData

from cairn.steps.context import current


class Steering:
    """The call_model_input_filter of one step's Runner.run with steer=True: before each
    model request it takes in the run's steer messages (ctx.messages(), a journaled read:
    a replay takes the same ones at the same place, and no more), each a user message at
    the end of that request's input, then runs the config's own filter, if any.

    The SDK keeps no item its filter adds, so each message is remembered with where it
    went (its place among the SDK's own items) and put back there in every later request
    and in the run's window: the conversation holds it once, in order.
    """

    def __init__(self, then: CallModelInputFilter | None, taken: Sequence[Any] = ()) -> None:
        self._then = then
        # (place, item): before the SDK's item at place. JSON-ready: a run that waits for
        # approval keeps it in its state, and its resumed Runner.run starts from there.
        self.taken: list[list[Any]] = [list(t) for t in taken]

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        given = list(data.model_data.input)
        step = current()
        if step is not None:
            for message in await asyncio.to_thread(step.messages):
                self.taken.append([len(given), _user_item(message)])
        data.model_data.input = steered(given, self.taken)
        if self._then is None:
            return data.model_data
        out = self._then(data)
        return await out if inspect.isawaitable(out) else out

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
