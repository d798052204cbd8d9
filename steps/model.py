"""Model calls through the anthropic SDK: retries, and cost from usage."""

from __future__ import annotations

import logging
import os
from typing import Any

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay
from tenacity.wait import wait_random_exponential

from cairn.errors import ModelUnavailable
from cairn.steps.window import json_size

logger = logging.getLogger(__name__)

# USD per million tokens: (input, output, cache write, cache read). Unknown models are
# priced as the most expensive listed, so cost is never under-reported.
PRICES: dict[str, tuple[float, float, float, float]] = {
    "claude-opus-4-5": (5.00, 25.00, 6.25, 0.50),
    "claude-sonnet-4-5": (3.00, 15.00, 3.75, 0.30),
    "claude-haiku-4-5": (1.00, 5.00, 1.25, 0.10),
}
_FALLBACK_PRICE = max(PRICES.values())


def _price(model: str) -> tuple[float, float, float, float]:
    return next((p for name, p in PRICES.items() if model.startswith(name)), _FALLBACK_PRICE)


def cost_of(model: str, usage: Any) -> float:
    """Cost in USD of one response, from its usage block (cache tokens included)."""
    price = _price(model)
    tokens = (
        getattr(usage, "input_tokens", 0) or 0,
        getattr(usage, "output_tokens", 0) or 0,
        getattr(usage, "cache_creation_input_tokens", 0) or 0,
        getattr(usage, "cache_read_input_tokens", 0) or 0,
    )
    return sum(n * p for n, p in zip(tokens, price, strict=True)) / 1_000_000


def preload_sdk() -> None:
    """Import the anthropic SDK now (workers do, before their pool forks)."""
    import anthropic  # noqa: F401


def _transient(exc: BaseException) -> bool:
    import anthropic

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
        import anthropic  # here, not at import: only workers that call a model load the SDK

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

    def worst_cost(self, **request: Any) -> float:
        """An upper estimate of a request's cost, for the budget check before the call: its
        prompt at 3 bytes a token (English and JSON run nearer 4), uncached, and all of
        max_tokens as output."""
        model = request.get("model", self.default_model)
        prompt = {k: request.get(k) for k in ("system", "messages", "tools")}
        tokens_in = json_size(prompt) // 3 + 1
        price_in, price_out, *_ = _price(model)
        return (tokens_in * price_in + request.get("max_tokens", 1024) * price_out) / 1e6

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
