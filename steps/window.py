"""The model window's size and its compaction to a token budget."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

Summarizer = Callable[[Sequence[dict[str, Any]]], str]


def json_size(value: Any) -> int:
    """Bytes of compact JSON: the unit of the window's size limit and token estimate."""
    return len(json.dumps(value, separators=(",", ":")))


def grown_size(size: int, count: int, added: Sequence[dict[str, Any]]) -> int:
    """json_size of a list of `count` messages (size bytes) after appending `added`."""
    for m in added:
        size += json_size(m) + (1 if count else 0)  # "," before all but the first
        count += 1
    return size


def estimate_tokens(messages: Sequence[dict[str, Any]]) -> int:
    # ~4 bytes a token for English and JSON: good enough to hold a budget.
    return json_size(messages) // 4


def extractive_summary(messages: Sequence[dict[str, Any]], limit: int = 2000) -> str:
    """A cheap, deterministic summary: the start of each dropped message."""
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
        if "parts" in m:  # a pydantic-ai message: its parts' text and tool content
            content = " ".join(str(p.get("content", "")) for p in m["parts"] if isinstance(p, dict))
        parts.append(f"{_role(m)}: {str(content)[:200]}")
    return "\n".join(parts)[:limit]


def _role(m: dict[str, Any]) -> str:
    """Anthropic's role, or a pydantic-ai message's kind as one (a response is the
    assistant's turn)."""
    kind = m.get("kind", "")
    return m.get("role") or {"response": "assistant", "request": "user"}.get(kind, "?")


def compact(
    window: list[dict[str, Any]],
    budget_tokens: int,
    *,
    keep_last: int = 4,
    summarize: Summarizer = extractive_summary,
) -> list[dict[str, Any]]:
    """Replace the oldest messages by one summary message when over the token budget.

    Returns the window itself when it fits (so the save appends only the new tail).
    """
    if estimate_tokens(window) <= budget_tokens or len(window) <= keep_last:
        return window
    cut = len(window) - keep_last
    # The tail opens with an assistant turn so user/assistant keep alternating after the
    # summary (which is a user turn).
    while cut < len(window) and _role(window[cut]) != "assistant":
        cut += 1
    head, tail = window[:cut], window[cut:]
    summary = {
        "role": "user",
        "content": f"[Summary of the earlier conversation]\n{summarize(head)}",
    }
    return [summary, *tail]
