"""The fleet's rate limiter on real Redis, with a record of what each call booked and gave
back: how the tests see that an integration's model requests (pydantic-ai's, a LangGraph
node's) go through the worker's limiter, under the provider, model and key they were sent
with."""

from __future__ import annotations

from typing import Any

from cairn.store.ratelimit import RateLimiter


class Booked(RateLimiter):
    """A RateLimiter that keeps (provider, model, who, tokens) of each take and
    (provider, model, who, unused) of each settle, in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.takes: list[tuple[str, str, str, int]] = []
        self.settles: list[tuple[str, str, str, int]] = []

    def take(
        self,
        provider: str,
        model: str,
        who: str,
        tokens: int,
        longest: float,
        tenant: str | None = None,
    ) -> tuple[bool, float]:
        self.takes.append((provider, model, who, tokens))
        return super().take(provider, model, who, tokens, longest, tenant)

    def settle(
        self, provider: str, model: str, who: str, unused: int, tenant: str | None = None
    ) -> None:
        self.settles.append((provider, model, who, unused))
        super().settle(provider, model, who, unused, tenant)
