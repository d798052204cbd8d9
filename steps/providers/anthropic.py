"""Anthropic's Messages API through the anthropic SDK."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cairn.steps.prices import tokens_of
from cairn.steps.providers import Attempt, hold, seconds_until
from cairn.steps.providers.transport import SdkClient, answered_headers

# A request without max_tokens (the API requires one) asks for this many.
DEFAULT_MAX_TOKENS = 1024

# Types of an error event in a stream that had begun that a fresh request may not meet.
_TRANSIENT_TYPES = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})


class AnthropicProvider(SdkClient):
    """messages.create and messages.stream, the SDK's own retries off (one retry policy,
    ModelClient's, which the task can see)."""

    name = "anthropic"
    sdk = "anthropic"
    title = "Anthropic"
    client_class = "Anthropic"

    # -- a request -----------------------------------------------------------------------
    def create(self, api: str, request: dict[str, Any], attempt: Attempt) -> Any:
        request.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
        answered_headers()  # none left over from another request
        message = self.client.messages.create(**request)
        attempt.headers = answered_headers()
        return message

    def stream(
        self, api: str, request: dict[str, Any], attempt: Attempt, on_text: Callable[[str], None]
    ) -> Any:
        import anthropic
        import httpx2

        request.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
        with self.client.messages.stream(**request) as s:
            attempt.headers = s.response.headers
            try:
                for text in s.text_stream:
                    on_text(text)
                final = s.get_final_message()
            except httpx2.TransportError as exc:  # on_text's own errors come wrapped: not here
                # The SDK names transport errors its own way only up to the headers; a
                # body cut off or stalled later comes through raw. Same failure, same name.
                if isinstance(exc, httpx2.TimeoutException):
                    raise anthropic.APITimeoutError(request=s.response.request) from exc
                raise anthropic.APIConnectionError(request=s.response.request) from exc
        # A plain Message, as create() returns: the stream's ParsedMessage has its own block types.
        return decode(final.model_dump())

    def prompt(self, api: str, request: dict[str, Any]) -> Any:
        return {k: request.get(k) for k in ("system", "messages", "tools")}

    def max_output(self, api: str, request: dict[str, Any]) -> int:
        return int(request.get("max_tokens") or DEFAULT_MAX_TOKENS)

    # -- failures ------------------------------------------------------------------------
    def transient(self, exc: BaseException) -> bool:
        import anthropic

        if isinstance(exc, anthropic.APIConnectionError):  # includes timeouts
            return True
        if not isinstance(exc, anthropic.APIStatusError):
            return False
        if exc.status_code == 200:
            # An `error` event in a stream that had begun: the API's overload, fault, rate
            # limit or timeout after the headers went out, which a fresh request may not
            # meet (the same errors as statuses 529, 500, 429 and 504 before them).
            return exc.type in _TRANSIENT_TYPES
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500  # 529 = overloaded

    def back_off(self, headers: Mapping[str, str], status: int) -> float:
        """anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}: reset is an RFC
        3339 time, when the bucket is full again."""
        h = "anthropic-ratelimit-"
        return hold(
            status,
            headers,
            requests=(
                headers.get(h + "requests-limit"),
                headers.get(h + "requests-remaining"),
                seconds_until(headers.get(h + "requests-reset")),
            ),
            tokens=(
                headers.get(h + "tokens-remaining"),
                seconds_until(headers.get(h + "tokens-reset")),
            ),
        )


# -- answers -------------------------------------------------------------------------------
def decode(data: Mapping[str, Any]) -> Any:
    """A Message's JSON as the SDK's Message."""
    from anthropic.types import Message

    return Message.model_validate(data)


def span_attributes(request: Mapping[str, Any], message: Any) -> dict[str, Any]:
    """A Message's GenAI attributes (input tokens count the cache's too, as the
    conventions ask)."""
    t = tokens_of(getattr(message, "usage", None))
    reason = getattr(message, "stop_reason", None)
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.max_tokens": request.get("max_tokens"),
        "gen_ai.response.id": getattr(message, "id", None),
        "gen_ai.response.finish_reasons": [reason] if reason else None,
        "gen_ai.usage.input_tokens": t.prompt,
        "gen_ai.usage.output_tokens": t.output,
        "gen_ai.usage.cache_creation.input_tokens": t.cache_write + t.cache_write_1h,
        "gen_ai.usage.cache_read.input_tokens": t.cache_read,
    }
