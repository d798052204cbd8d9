"""What a model call cost: its usage read the same way whatever the provider, priced by a
table of USD per million tokens that a user can extend (set_price, CAIRN_MODEL_PRICES)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class Price:
    """USD per million tokens of each kind a provider bills apart."""

    input: float
    output: float
    """Reasoning tokens included: both providers bill them as output."""
    cache_write: float
    """A cache write of the default lifetime (Anthropic's 5 minutes)."""
    cache_write_1h: float
    """An Anthropic cache write with a 1-hour lifetime (ttl "1h"), billed apart."""
    cache_read: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tokens:
    """An answer's usage, each token in exactly one of the billed kinds."""

    input: int = 0
    """Prompt tokens neither written to nor read from the cache."""
    cache_write: int = 0
    """Written to the cache for its default lifetime."""
    cache_write_1h: int = 0
    """Written to Anthropic's cache for an hour."""
    cache_read: int = 0
    output: int = 0
    """Reasoning tokens included."""
    reasoning: int = 0
    """Of output, spent reasoning (reported, not billed apart)."""

    @property
    def limited(self) -> int:
        """What counts against a tokens-a-minute limit: cache reads are left out, as
        both APIs leave them out of their input-tokens limits."""
        return self.input + self.cache_write + self.cache_write_1h + self.output

    @property
    def prompt(self) -> int:
        """Every prompt token, cached or not."""
        return self.input + self.cache_write + self.cache_write_1h + self.cache_read


def _get(usage: Any, name: str) -> Any:
    return usage.get(name) if isinstance(usage, Mapping) else getattr(usage, name, None)


def _count(usage: Any, *path: str) -> int:
    for name in path:
        if usage is None:
            return 0
        usage = _get(usage, name)
    return int(usage or 0)


def tokens_of(usage: Any) -> Tokens:
    """The usage block of any answer cairn takes (an SDK object or its JSON): Anthropic's
    (input_tokens excludes the cache's), OpenAI Chat Completions' (prompt_tokens includes
    cached_tokens), OpenAI Responses' (input_tokens with input_tokens_details), or a
    pydantic-ai RequestUsage's JSON (input_tokens includes cache_write/read_tokens)."""
    if usage is None:
        return Tokens()
    if _get(usage, "prompt_tokens") is not None:  # OpenAI Chat Completions
        cached = _count(usage, "prompt_tokens_details", "cached_tokens")
        written = _count(usage, "prompt_tokens_details", "cache_write_tokens")
        return Tokens(
            input=max(_count(usage, "prompt_tokens") - cached - written, 0),
            cache_write=written,
            cache_read=cached,
            output=_count(usage, "completion_tokens"),
            reasoning=_count(usage, "completion_tokens_details", "reasoning_tokens"),
        )
    if _get(usage, "input_tokens_details") is not None:  # OpenAI Responses
        cached = _count(usage, "input_tokens_details", "cached_tokens")
        written = _count(usage, "input_tokens_details", "cache_write_tokens")
        return Tokens(
            input=max(_count(usage, "input_tokens") - cached - written, 0),
            cache_write=written,
            cache_read=cached,
            output=_count(usage, "output_tokens"),
            reasoning=_count(usage, "output_tokens_details", "reasoning_tokens"),
        )
    if _get(usage, "cache_read_tokens") is not None:  # pydantic-ai's RequestUsage
        written, cached = _count(usage, "cache_write_tokens"), _count(usage, "cache_read_tokens")
        return Tokens(
            input=max(_count(usage, "input_tokens") - cached - written, 0),
            cache_write=written,
            cache_read=cached,
            output=_count(usage, "output_tokens"),
            reasoning=_count(usage, "output_reasoning_tokens"),
        )
    # Anthropic Messages: cache_creation_input_tokens counts both lifetimes' writes, and
    # cache_creation says how many were for an hour (billed 2x input, not 1.25x).
    hour = _count(usage, "cache_creation", "ephemeral_1h_input_tokens")
    return Tokens(
        input=_count(usage, "input_tokens"),
        cache_write=max(_count(usage, "cache_creation_input_tokens") - hour, 0),
        cache_write_1h=hour,
        cache_read=_count(usage, "cache_read_input_tokens"),
        output=_count(usage, "output_tokens"),
    )


def _anthropic(input: float, output: float) -> Price:
    # A 5-minute cache write bills 1.25x the input, a 1-hour one 2x, a read 0.1x.
    return Price(
        input=input,
        output=output,
        cache_write=input * 1.25,
        cache_write_1h=input * 2,
        cache_read=input / 10,
    )


def _openai(input: float, output: float, cached: float) -> Price:
    # OpenAI bills no surcharge for writing the cache: written tokens are input.
    return Price(
        input=input, output=output, cache_write=input, cache_write_1h=input, cache_read=cached
    )


# USD per million tokens, from each provider's price page. A name covers the dated
# versions it prefixes, the longest name winning ("gpt-4o-mini" before "gpt-4o").
BUILT_IN: dict[str, dict[str, Price]] = {
    "anthropic": {
        "claude-opus-4-5": _anthropic(5.00, 25.00),
        "claude-sonnet-4-5": _anthropic(3.00, 15.00),
        "claude-haiku-4-5": _anthropic(1.00, 5.00),
    },
    "openai": {
        "gpt-5": _openai(1.25, 10.00, 0.125),
        "gpt-5-mini": _openai(0.25, 2.00, 0.025),
        "gpt-5-nano": _openai(0.05, 0.40, 0.005),
        "gpt-4.1": _openai(2.00, 8.00, 0.50),
        "gpt-4.1-mini": _openai(0.40, 1.60, 0.10),
        "gpt-4.1-nano": _openai(0.10, 0.40, 0.025),
        "gpt-4o": _openai(2.50, 10.00, 1.25),
        "gpt-4o-mini": _openai(0.15, 0.60, 0.075),
        "o1": _openai(15.00, 60.00, 7.50),
        "o3": _openai(2.00, 8.00, 0.50),
        "o3-mini": _openai(1.10, 4.40, 0.55),
        "o4-mini": _openai(1.10, 4.40, 0.275),
    },
}


def _dearest(prices: Mapping[str, Price] | Any) -> Price:
    """Each kind at the highest price any of these models bills it: never under-reported."""
    found = list(prices)
    return Price(
        input=max(p.input for p in found),
        output=max(p.output for p in found),
        cache_write=max(p.cache_write for p in found),
        cache_write_1h=max(p.cache_write_1h for p in found),
        cache_read=max(p.cache_read for p in found),
    )


class Prices:
    """A price table: its own entries first, then its parent's (a worker's client holds
    CAIRN_MODEL_PRICES over the process's PRICES, which set_price extends)."""

    def __init__(self, parent: Prices | None = None) -> None:
        self.parent = parent
        self._own: dict[str, dict[str, Price]] = {}

    def set(self, provider: str, model: str, price: Price) -> None:
        self._own.setdefault(provider, {})[model] = price

    def entries(self, provider: str) -> dict[str, Price]:
        """Every model name priced for provider, this table's own winning."""
        inherited = self.parent.entries(provider) if self.parent else {}
        return {**inherited, **self._own.get(provider, {})}

    def price(self, provider: str | None, model: str) -> Price:
        """model's price: the longest name that prefixes it; a model none covers is priced
        as its provider's dearest (any provider's, when the provider is not known)."""
        providers = [provider] if provider else sorted(BUILT_IN)
        names = {n: p for prov in providers for n, p in self.entries(prov).items()}
        best = max((n for n in names if model.startswith(n)), key=len, default=None)
        if best is not None:
            return names[best]
        return _dearest(names.values())

    def load(self, table: Mapping[str, Any]) -> Prices:
        """Add CAIRN_MODEL_PRICES's entries: {"[provider:]model": {"input": USD, "output":
        USD, "cache_write": USD, "cache_read": USD}} per million tokens (the cache prices
        optional); a name without its provider is the provider its name says."""
        from cairn.steps.providers import UnknownModel

        for name, fields in table.items():
            provider, _, model = name.partition(":") if _qualified(name) else ("", "", name)
            try:
                set_price(model, provider=provider or None, table=self, **fields)
            except UnknownModel as exc:
                raise UnknownModel(
                    f"CAIRN_MODEL_PRICES: {exc} (in this setting: name it 'openai:{model}')"
                ) from None
        return self


def _qualified(name: str) -> bool:
    return name.split(":", 1)[0] in BUILT_IN


PRICES = Prices()
"""The process's table: the built-in prices and what set_price added."""
for _provider, _models in BUILT_IN.items():
    for _model, _price in _models.items():
        PRICES.set(_provider, _model, _price)


def set_price(
    model: str,
    *,
    input: float,
    output: float,
    cache_write: float | None = None,
    cache_read: float | None = None,
    provider: str | None = None,
    table: Prices | None = None,
) -> None:
    """Price `model` (and the versions its name prefixes) in USD per million tokens, for
    every model call of this process from now on.

    Args:
        input: uncached prompt tokens.
        output: answer tokens, reasoning included.
        cache_write: prompt tokens written to the cache; by default as the provider bills
            them against input (Anthropic: 1.25x; OpenAI: 1x). Anthropic's 1-hour writes
            keep their ratio to cache_write (2x input against 1.25x).
        cache_read: prompt tokens read from the cache; by default as the provider bills
            them (Anthropic: 0.1x input; OpenAI, unknown: 1x, never under-reported).
        provider: "anthropic" or "openai"; by default the one the model's name says.
        table: the table to add to (default: the process's PRICES).

    Raises:
        UnknownModel: the provider is not one cairn speaks, or the name does not say it.
    """
    from cairn.steps.providers import provider_of

    provider = provider_of(model, provider)
    for name, value in (("input", input), ("output", output)):
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"price of {model!r}: {name}={value!r} is not USD >= 0")
    base = _anthropic(input, output) if provider == "anthropic" else _openai(input, output, input)
    price = Price(
        input=input,
        output=output,
        cache_write=base.cache_write if cache_write is None else cache_write,
        # An hour's write keeps the provider's ratio to the 5-minute one (Anthropic: 2 to
        # 1.25), so a cache_write given moves it too.
        cache_write_1h=base.cache_write_1h
        if cache_write is None or not base.cache_write
        else cache_write * base.cache_write_1h / base.cache_write,
        cache_read=base.cache_read if cache_read is None else cache_read,
    )
    (table or PRICES).set(provider, model, price)


def cost_of(
    model: str, usage: Any, provider: str | None = None, prices: Prices | None = None
) -> float:
    """Cost in USD of one answer, from its usage block (cache and reasoning tokens as
    billed). provider: by default the one the model's name says (none: priced as the
    dearest model cairn knows). prices: the table (default: the process's PRICES)."""
    if provider is None:
        from cairn.steps.providers import guess_provider

        provider = guess_provider(model)
    price = (prices or PRICES).price(provider, model)
    t = tokens_of(usage)
    return (
        t.input * price.input
        + t.cache_write * price.cache_write
        + t.cache_write_1h * price.cache_write_1h
        + t.cache_read * price.cache_read
        + t.output * price.output
    ) / 1_000_000
