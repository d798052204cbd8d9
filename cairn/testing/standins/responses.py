"""OpenAI's Responses API as ModelServer speaks it (the wire; what both OpenAI APIs share,
errors, limit headers and cuts, is in cairn.testing.standins.openai).

``POST /v1/responses``
----------------------
* Body: ``model``, ``input`` (a string, or items: messages with roles user, assistant,
  system, developer; ``function_call`` and ``function_call_output``, each output after its
  call and each call answered), optional ``instructions``, ``tools``
  (``{"type": "function", "name": ...}``), ``stream``, ``max_output_tokens`` (>= 16).
  ``previous_response_id`` is refused: the stand-in keeps no state, send the whole input.
* Answer: a ``response`` (status ``completed``) whose ``output`` is one ``message`` with
  one ``output_text`` (so ``response.output_text`` is the reply), or one ``function_call``
  (``call_id`` ``call_local_<turn>``) under the same ``TOOLS:`` rule, turns counted as
  the input's function_call items.  Usage: ``input_tokens`` (instructions and input as
  JSON), ``input_tokens_details.cached_tokens``, ``output_tokens``,
  ``output_tokens_details.reasoning_tokens``, ``total_tokens``, by the same rules.
* Streaming: typed events, ``event: <type>`` and ``sequence_number`` from 0:
  ``response.created``, ``response.in_progress``, ``response.output_item.added``, then
  for a message ``response.content_part.added``, ``response.output_text.delta`` pieces,
  ``response.output_text.done``, ``response.content_part.done``, or for a call
  ``response.function_call_arguments.delta`` pieces and ``.done``; then
  ``response.output_item.done`` and ``response.completed`` with the whole response and
  its usage.  ``client.responses.stream(...).get_final_response()`` equals ``create``'s
  answer but for ``id``, ``created_at`` and ``completed_at``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from cairn.testing.standins.api import _Event, _Problem, _prompt_chars, _sse
from cairn.testing.standins.openai import _check_common, _openai_error, _OpenAiApi, _text_of
from cairn.testing.standins.replies import _next_tool_call, _tokens, _usage, reply_for


def _items(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The input as items (a string input is one user message)."""
    value = data["input"]
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value)


def _check_input(value: Any) -> _Problem | None:
    if isinstance(value, str):
        return None
    if not isinstance(value, list) or not value:
        return "input", "Invalid 'input': expected a string or a non-empty array of items."
    calls: list[str] = []  # call ids of function_call items not yet answered
    for i, item in enumerate(value):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            assert isinstance(item, dict)
            if item.get("role") not in ("user", "assistant", "system", "developer"):
                return (
                    f"input[{i}].role",
                    f"Invalid value for 'input[{i}].role': expected user, assistant, system or developer.",
                )
            if not isinstance(item.get("content"), (str, list)):
                return (
                    f"input[{i}].content",
                    f"Invalid type for 'input[{i}].content': expected a string or an array.",
                )
        elif kind == "function_call":
            assert isinstance(item, dict)
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                return (
                    f"input[{i}]",
                    "A function_call item needs 'call_id', 'name' and 'arguments' (strings).",
                )
            calls.append(item["call_id"])
        elif kind == "function_call_output":
            assert isinstance(item, dict)
            call_id = item.get("call_id")
            if call_id not in calls:
                return (
                    "input",
                    f"No tool call found for function call output with call_id {call_id}.",
                )
            if not isinstance(item.get("output"), (str, list)):
                return (
                    f"input[{i}].output",
                    f"Invalid type for 'input[{i}].output': expected a string or an array.",
                )
            calls.remove(call_id)
        else:
            return (
                f"input[{i}].type",
                f"The stand-in takes input items of type message, function_call and function_call_output, not {kind!r}.",
            )
    if calls:
        return "input", f"No tool output found for function call {calls[0]}."
    return None


class ResponsesApi(_OpenAiApi):
    """``POST /v1/responses`` (see the module docstring)."""

    name = "responses"
    path = "/v1/responses"

    def check(self, data: dict[str, Any] | None) -> _Problem | None:
        if data is None:
            return None, "We could not parse the JSON body of your request."
        if data.get("previous_response_id") is not None:
            return (
                "previous_response_id",
                "The stand-in keeps no responses: send the whole conversation in 'input'.",
            )
        problem = _check_common(data, max_keys=("max_output_tokens",), least=16)
        if problem is None:
            problem = _check_input(data.get("input"))
        if problem is not None:
            return problem
        if data.get("instructions") is not None and not isinstance(data["instructions"], str):
            return "instructions", "Invalid type for 'instructions': expected a string."
        tools = data.get("tools")
        if tools is not None:
            if not isinstance(tools, list):
                return "tools", "Invalid type for 'tools': expected an array."
            for i, tool in enumerate(tools):
                if (
                    not isinstance(tool, dict)
                    or tool.get("type") != "function"
                    or not isinstance(tool.get("name"), str)
                ):
                    return (
                        f"tools[{i}]",
                        "The stand-in offers tools of type 'function' with a 'name' only.",
                    )
        return None

    def directives(self, data: dict[str, Any]) -> str:
        first = next(
            (
                i
                for i in _items(data)
                if i.get("type", "message") == "message" and i.get("role") == "user"
            ),
            None,
        )
        return _text_of(first.get("content")) if first else ""

    def prompt_tokens(self, data: dict[str, Any]) -> int:
        return max(
            1,
            _prompt_chars({"instructions": data.get("instructions"), "input": data.get("input")})
            // 4,
        )

    def answer(self, data: dict[str, Any], no: int) -> dict[str, Any]:
        items = _items(data)
        directives = self.directives(data)
        schemas = {t["name"]: t.get("parameters") or {} for t in data.get("tools") or []}
        done = sum(1 for i in items if i.get("type") == "function_call")
        call = _next_tool_call(directives, schemas, done)
        item: dict[str, Any]
        if call is not None:
            name, args = call
            arguments = json.dumps(args)
            item = {
                "id": f"fc_local_{no}",
                "type": "function_call",
                "status": "completed",
                "arguments": arguments,
                "call_id": f"call_local_{done}",
                "name": name,
            }
            output = name + arguments
        else:
            # The reply is to the user's turn; a turn that ends in a tool's output has none.
            last = next(
                (i for i in reversed(items) if i.get("role") not in ("system", "developer")), None
            )
            said = (
                _text_of(last.get("content"))
                if last and last.get("type", "message") == "message" and last.get("role") == "user"
                else ""
            )
            output = reply_for(said)
            part = {"type": "output_text", "text": output, "annotations": [], "logprobs": []}
            item = {
                "id": f"msg_local_{no}",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        u = _usage(
            json.dumps({"instructions": data.get("instructions"), "input": data["input"]}),
            output,
            directives,
        )
        now = int(time.time())
        return {
            "id": f"resp_local_{no}",
            "object": "response",
            "created_at": now,
            "status": "completed",
            "completed_at": now,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": data.get("instructions"),
            "max_output_tokens": data.get("max_output_tokens"),
            "model": data["model"],
            "output": [item],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": data.get("tool_choice", "auto"),
            "tools": data.get("tools") or [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": {
                "input_tokens": u.input,
                "input_tokens_details": {"cached_tokens": u.cached, "cache_write_tokens": 0},
                "output_tokens": u.output,
                "output_tokens_details": {"reasoning_tokens": u.reasoning},
                "total_tokens": u.input + u.output,
            },
            "user": None,
            "metadata": {},
        }

    def events(self, answer: dict[str, Any], data: dict[str, Any]) -> list[_Event]:
        item = answer["output"][0]
        at = {"item_id": item["id"], "output_index": 0}
        progress = {
            **answer,
            "status": "in_progress",
            "completed_at": None,
            "output": [],
            "usage": None,
        }
        steps: list[tuple[str, dict[str, Any], dict[str, bool]]] = [
            ("response.created", {"response": progress}, {"opening": True}),
            ("response.in_progress", {"response": progress}, {}),
        ]
        if item["type"] == "function_call":
            opened = {**item, "status": "in_progress", "arguments": ""}
            steps.append(("response.output_item.added", {"output_index": 0, "item": opened}, {}))
            steps += [
                ("response.function_call_arguments.delta", {**at, "delta": p}, {"delta": True})
                for p in _tokens(item["arguments"])
            ]
            done = {**at, "arguments": item["arguments"], "name": item["name"]}
            steps.append(("response.function_call_arguments.done", done, {}))
        else:
            part = item["content"][0]
            opened = {**item, "status": "in_progress", "content": []}
            steps.append(("response.output_item.added", {"output_index": 0, "item": opened}, {}))
            in_part = {**at, "content_index": 0}
            steps.append(
                ("response.content_part.added", {**in_part, "part": {**part, "text": ""}}, {})
            )
            steps += [
                (
                    "response.output_text.delta",
                    {**in_part, "delta": t, "logprobs": []},
                    {"delta": True, "text": True},
                )
                for t in _tokens(part["text"])
            ]
            steps.append(
                ("response.output_text.done", {**in_part, "text": part["text"], "logprobs": []}, {})
            )
            steps.append(("response.content_part.done", {**in_part, "part": part}, {}))
        steps.append(("response.output_item.done", {"output_index": 0, "item": item}, {}))
        steps.append(("response.completed", {"response": answer}, {"closing": True}))
        return [
            _Event(_sse({"type": kind, "sequence_number": n, **body}, kind), **flags)
            for n, (kind, body, flags) in enumerate(steps)
        ]

    def cut_event(self, status: int, message: str, at: int) -> bytes:
        error = _openai_error(status, message)
        return _sse({"type": "error", **error, "sequence_number": at}, "error")
