"""OpenAI's Chat Completions and Responses APIs through the openai SDK."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cairn.steps.prices import tokens_of
from cairn.steps.providers import Attempt, duration, hold
from cairn.steps.providers.transport import SdkClient, answered_headers

# What a request that bounds its answer by none is taken to write at most, for the rate
# limiter's booking and the budget's worst case (settled with the usage after).
DEFAULT_MAX_OUTPUT = 4096

# Codes of an error the API reports after a stream began (its headers said 200) that a
# fresh request may not meet.
_TRANSIENT_CODES = frozenset(
    {"server_error", "internal_error", "rate_limit_exceeded", "overloaded", "timeout"}
)


class OpenAIProvider(SdkClient):
    """chat.completions and responses, create and stream, the SDK's own retries off (one
    retry policy, ModelClient's, which the task can see)."""

    name = "openai"
    sdk = "openai"
    title = "OpenAI"
    client_class = "OpenAI"

    def _api(self, api: str) -> Any:
        return self.client.responses if api == "responses" else self.client.chat.completions

    # -- a request -----------------------------------------------------------------------
    def create(self, api: str, request: dict[str, Any], attempt: Attempt) -> Any:
        answered_headers()  # none left over from another request
        answer = self._api(api).create(**request)
        attempt.headers = answered_headers()
        return answer

    def stream(
        self, api: str, request: dict[str, Any], attempt: Attempt, on_text: Callable[[str], None]
    ) -> Any:
        if api == "responses":
            with self.client.responses.create(**request, stream=True) as events:
                attempt.headers = events.response.headers
                return _response_of(events, on_text)
        # The usage comes in a last chunk of its own, and only when asked for.
        options = {**(request.get("stream_options") or {}), "include_usage": True}
        body = {**request, "stream": True, "stream_options": options}
        with self.client.chat.completions.create(**body) as chunks:
            attempt.headers = chunks.response.headers
            return _completion_of(chunks, on_text)

    def prompt(self, api: str, request: dict[str, Any]) -> Any:
        names = ("instructions", "input", "tools") if api == "responses" else ("messages", "tools")
        return {k: request.get(k) for k in names}

    def max_output(self, api: str, request: dict[str, Any]) -> int:
        names = (
            ("max_output_tokens",)
            if api == "responses"
            else ("max_completion_tokens", "max_tokens")
        )
        return int(next((request[n] for n in names if request.get(n)), DEFAULT_MAX_OUTPUT))

    # -- failures ------------------------------------------------------------------------
    def transient(self, exc: BaseException) -> bool:
        import openai

        if isinstance(exc, openai.APIConnectionError):  # includes timeouts
            return True
        if isinstance(exc, openai.APIStatusError):
            if exc.status_code == 429:
                return exc.code != "insufficient_quota"  # a spent quota waits for a person
            return exc.status_code in (408, 409) or exc.status_code >= 500
        if isinstance(exc, openai.APIError):  # reported in a stream that had begun
            return (exc.code or exc.type or "") in _TRANSIENT_CODES
        return False

    def back_off(self, headers: Mapping[str, str], status: int) -> float:
        """x-ratelimit-{limit,remaining,reset}-{requests,tokens}: reset is a duration
        ("6m0s"), until the bucket is full again."""
        h = "x-ratelimit-"
        return hold(
            status,
            headers,
            requests=(
                headers.get(h + "limit-requests"),
                headers.get(h + "remaining-requests"),
                duration(headers.get(h + "reset-requests")),
            ),
            tokens=(headers.get(h + "remaining-tokens"), duration(headers.get(h + "reset-tokens"))),
        )


def _failed(events: Any, data: Any, message: str) -> Exception:
    """An error a Responses stream reported after it began, as the SDK names one."""
    import openai

    return openai.APIError(message, events.response.request, body=data)


def _response_of(events: Any, on_text: Callable[[str], None]) -> Any:
    """The Response a Responses stream ends with, each output_text delta to on_text."""
    done: dict[int, Any] = {}  # output items as each was finished, in case the end omits them
    for event in events:
        kind = event.type
        if kind == "response.output_text.delta":
            on_text(event.delta)
        elif kind == "response.output_item.done":
            done[event.output_index] = event.item
        elif kind in ("response.completed", "response.incomplete"):
            response = event.response
            if not response.output and done:
                response.output = [done[i] for i in sorted(done)]
            return response
        elif kind == "response.failed":
            error = event.response.error
            body = error.model_dump() if error is not None else None
            raise _failed(events, body, error.message if error else "the response failed")
        elif kind == "error":
            raise _failed(events, event.model_dump(), event.message)
    import openai

    # The body ended without its last event: as a connection cut off.
    raise openai.APIConnectionError(
        message="the stream ended before the response was complete",
        request=events.response.request,
    )


def _completion_of(chunks: Any, on_text: Callable[[str], None]) -> Any:
    """The ChatCompletion a Chat Completions stream adds up to, the first choice's content
    deltas to on_text."""
    from openai.lib.streaming.chat import ChatCompletionStreamState

    state: Any = ChatCompletionStreamState()
    for chunk in chunks:
        if chunk.object != "chat.completion.chunk":  # Azure's content-filter events
            continue
        state.handle_chunk(chunk)
        for choice in chunk.choices:
            if choice.index == 0 and choice.delta.content:
                on_text(choice.delta.content)
    # A plain ChatCompletion, as create() returns: the state adds up a Parsed* one.
    data = state.get_final_completion().model_dump(mode="json", exclude_unset=True)
    for choice in data.get("choices", []):
        message = choice.get("message") or {}
        message.pop("parsed", None)
        for call in message.get("tool_calls") or []:
            (call.get("function") or {}).pop("parsed_arguments", None)
    return decode("chat", data)


# -- answers -------------------------------------------------------------------------------
def decode(kind: str, data: Mapping[str, Any]) -> Any:
    """A ChatCompletion's or a Response's JSON as the SDK's own type."""
    if kind == "responses":
        from openai.types.responses import Response

        return Response.model_validate(data)
    from openai.types.chat import ChatCompletion

    return ChatCompletion.model_validate(data)


def encode(answer: Any) -> Any:
    """An answer as the journal keeps it: what the API sent (unset fields left out)."""
    return answer.model_dump(mode="json", exclude_unset=True)


def span_attributes(api: str, request: Mapping[str, Any], answer: Any) -> dict[str, Any]:
    """A ChatCompletion's or a Response's GenAI attributes (input tokens count the
    cached ones, as both the API and the conventions do)."""
    t = tokens_of(getattr(answer, "usage", None))
    if api == "responses":
        incomplete = getattr(answer, "incomplete_details", None)
        reasons = [getattr(incomplete, "reason", None) or getattr(answer, "status", None)]
        max_tokens = request.get("max_output_tokens")
    else:
        reasons = [c.finish_reason for c in getattr(answer, "choices", None) or []]
        max_tokens = request.get("max_completion_tokens") or request.get("max_tokens")
    return {
        "gen_ai.operation.name": "chat",
        "openai.api.type": "responses" if api == "responses" else "chat_completions",
        "gen_ai.request.max_tokens": max_tokens,
        "gen_ai.response.id": getattr(answer, "id", None),
        "gen_ai.response.finish_reasons": [r for r in reasons if r] or None,
        "gen_ai.usage.input_tokens": t.prompt,
        "gen_ai.usage.output_tokens": t.output,
        "gen_ai.usage.cache_read.input_tokens": t.cache_read,
        "gen_ai.usage.reasoning.output_tokens": t.reasoning,
        "openai.response.service_tier": getattr(answer, "service_tier", None),
        "openai.response.system_fingerprint": getattr(answer, "system_fingerprint", None),
    }
