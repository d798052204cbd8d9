"""Model calls through the anthropic SDK: retries, cost from usage, window compaction."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import anthropic
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay
from tenacity.wait import wait_random_exponential

from store.errors import ModelUnavailable

logger = logging.getLogger(__name__)

# USD per million tokens: (input, output, cache write, cache read). Unknown models are
# priced as the most expensive listed, so cost is never under-reported.
PRICES: dict[str, tuple[float, float, float, float]] = {
    "claude-opus-4-5": (5.00, 25.00, 6.25, 0.50),
    "claude-sonnet-4-5": (3.00, 15.00, 3.75, 0.30),
    "claude-haiku-4-5": (1.00, 5.00, 1.25, 0.10),
}
_FALLBACK_PRICE = max(PRICES.values())


def cost_of(model: str, usage: Any) -> float:
    """Cost in USD of one response, from its usage block (cache tokens included)."""
    price = next((p for name, p in PRICES.items() if model.startswith(name)), _FALLBACK_PRICE)
    tokens = (
        getattr(usage, "input_tokens", 0) or 0,
        getattr(usage, "output_tokens", 0) or 0,
        getattr(usage, "cache_creation_input_tokens", 0) or 0,
        getattr(usage, "cache_read_input_tokens", 0) or 0,
    )
    return sum(n * p for n, p in zip(tokens, price, strict=True)) / 1_000_000


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, anthropic.APIConnectionError):  # includes timeouts
        return True
    return isinstance(exc, anthropic.APIStatusError) and (
        exc.status_code in (408, 409, 429) or exc.status_code >= 500  # 529 = overloaded
    )


def _retry_after(state: RetryCallState) -> float:
    """Honour the server's retry-after; otherwise exponential backoff with jitter."""
    exc = state.outcome.exception() if state.outcome else None
    response = getattr(exc, "response", None)
    if response is not None:
        try:
            return min(float(response.headers.get("retry-after", "")), 60.0)
        except ValueError:
            pass
    return wait_random_exponential(multiplier=0.5, max=20.0)(state)


class ModelClient:
    """messages.create with tenacity retries; returns (message, cost_usd)."""

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        default_model: str = "claude-haiku-4-5",
        give_up_after: float = 60.0,
        timeout: float = 120.0,
    ) -> None:
        # The SDK's own retries are off: one retry policy, ours, which the task can see.
        self.client = anthropic.Anthropic(
            api_key=api_key or os.environ.get("ANTHROPIC_API_KEY") or "local-stand-in",
            base_url=base_url,
            max_retries=0,
            timeout=timeout,
        )
        self.default_model = default_model
        self.give_up_after = give_up_after

    def close(self) -> None:
        self.client.close()

    def create(self, **request: Any) -> tuple[Any, float]:
        request.setdefault("model", self.default_model)
        request.setdefault("max_tokens", 1024)
        retrying = Retrying(
            retry=retry_if_exception(_transient),
            wait=_retry_after,
            stop=stop_after_delay(self.give_up_after),
            reraise=True,
        )
        try:
            message = retrying(self.client.messages.create, **request)
        except Exception as exc:
            if _transient(exc):
                raise ModelUnavailable(f"model API kept failing: {exc}") from exc
            raise
        return message, cost_of(message.model, message.usage)


def text_of(message: Any) -> str:
    """The concatenated text blocks of a response."""
    return "".join(getattr(b, "text", "") for b in message.content)


# -- compaction ------------------------------------------------------------------------
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
        parts.append(f"{m.get('role', '?')}: {str(content)[:200]}")
    return "\n".join(parts)[:limit]


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
    while cut < len(window) and window[cut].get("role") != "assistant":
        cut += 1
    head, tail = window[:cut], window[cut:]
    summary = {
        "role": "user",
        "content": f"[Summary of the earlier conversation]\n{summarize(head)}",
    }
    return [summary, *tail]
