"""What a stand-in model answers, whatever API it speaks: a deterministic reply to the
last user text, the directives a test writes into its first user message (``REPLY:``,
``TOOLS:``, ``TOKEN_MS:``, ``CACHED:``, ``REASONING:``), the tool a turn calls, the
token counts, and text cut into word-sized tokens for a stream."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_REPLY_LINE = re.compile(r"^[ \t]*REPLY: ?(.*?)\r?$", re.MULTILINE)


def reply_for(text: str) -> str:
    """Deterministic reply: ``REPLY: x`` line, else VALIDATE, else SUMMARIZE, else ack."""
    m = _REPLY_LINE.search(text)
    if m:
        return m.group(1)
    if "VALIDATE" in text:
        return "INVALID" if "INVALID" in text else "VALID"
    if "SUMMARIZE" in text:
        return "Summary: " + text[:300]
    return "ack: " + text[:80]


_TOOLS_LINE = re.compile(r"^[ \t]*TOOLS: ?(.*?)\r?$", re.MULTILINE)
_TOKEN_MS_LINE = re.compile(r"^[ \t]*TOKEN_MS: ?(\d+)\r?$", re.MULTILINE)
_CACHED_LINE = re.compile(r"^[ \t]*CACHED: ?(\d+)\r?$", re.MULTILINE)
_REASONING_LINE = re.compile(r"^[ \t]*REASONING: ?(\d+)\r?$", re.MULTILINE)

# A word and the whitespace before it; trailing whitespace goes with the last word.
_TOKEN = re.compile(r"\s*\S+(?:\s+\Z)?")


def _tokens(text: str) -> list[str]:
    """text cut into word-sized tokens, whitespace leading as in the model's own tokens
    (``"Hello"``, ``" world"``); they concatenate to text exactly."""
    return _TOKEN.findall(text) or ([text] if text else [])


def _directive(line: re.Pattern[str], directives: str) -> int | None:
    m = line.search(directives)
    return int(m.group(1)) if m else None


def _next_tool_call(
    directives: str, schemas: dict[str, dict[str, Any]], done: int
) -> tuple[str, dict[str, Any]] | None:
    """The tool to call this turn, for an agent loop without a real model: the first user
    message's ``TOOLS: a, b, c`` line lists the tools to call, one a turn, in order (``done``:
    the calls already in the conversation); then text again. The arguments fill each
    required property of the tool's JSON schema (``schemas``: name -> schema of the tools
    the request offers) from its name and the turn."""
    m = _TOOLS_LINE.search(directives)
    if m is None or not schemas:
        return None
    plan = [t.strip() for t in m.group(1).split(",") if t.strip()]
    if done >= len(plan) or plan[done] not in schemas:
        return None
    name = plan[done]
    schema = schemas[name] or {}
    props = schema.get("properties") or {}
    fill = {"integer": done, "number": done, "boolean": True}
    args = {
        p: fill.get(props.get(p, {}).get("type"), f"{name} {done}")
        for p in schema.get("required") or []
    }
    return name, args


@dataclass(frozen=True, kw_only=True)
class _Usage:
    """Token counts of one answer, before each API spells them its own way."""

    input: int
    """All prompt tokens, cached ones included."""
    cached: int
    """Of ``input``, read from the prompt cache (a ``CACHED: n`` line, at most input)."""
    output: int
    """All output tokens, reasoning ones included."""
    reasoning: int
    """Of ``output``, spent reasoning (a ``REASONING: n`` line)."""


def _usage(prompt: str, output: str, directives: str) -> _Usage:
    """A quarter of the characters (at least one token each way), as an estimate the tests
    can recompute; ``CACHED:`` and ``REASONING:`` lines set the details a real API reports
    only for long prompts and reasoning models."""
    tokens_in = max(1, len(prompt) // 4)
    reasoning = _directive(_REASONING_LINE, directives) or 0
    return _Usage(
        input=tokens_in,
        cached=min(tokens_in, _directive(_CACHED_LINE, directives) or 0),
        output=max(1, len(output) // 4) + reasoning,
        reasoning=reasoning,
    )
