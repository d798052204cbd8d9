"""The model APIs cairn calls, one module each (anthropic, openai) behind one small
contract: what ModelClient (cairn.steps.model) needs to send a request through the SDK,
tell a failure worth retrying from one that is not, read the provider's rate-limit
headers, and read an answer (its text, its journal form, its span attributes).

A call's provider is the one its model's name says (claude-* is Anthropic's; gpt-*,
chatgpt-*, o1/o3/o4* are OpenAI's), or the one it names (provider=); OpenAI's API is Chat
Completions unless the request has `input=` or names api="responses".
"""

from __future__ import annotations

import dataclasses
import datetime
import email.utils
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from cairn.core.errors import CairnError, InvalidInput

PROVIDERS = ("anthropic", "openai")
APIS = {"anthropic": ("messages",), "openai": ("chat", "responses")}

# The longest back-off a provider's headers can ask of the fleet: a clock gone wrong on
# either side must not stop every worker for long.
MAX_BACK_OFF = 60.0

_OPENAI_NAMES = re.compile(r"(gpt-|chatgpt-|ft:gpt-|o[1-9](-|$)|codex-|computer-use-)")


class UnknownModel(InvalidInput):
    """A model call named a model whose provider cairn cannot tell, a provider it does not
    speak, or an API its provider does not have. Not retried: the step fails with it."""


class ModelNotConfigured(CairnError):
    """A model call went to a provider this worker has neither an API key nor an address
    for: the message names the variable to set. Not retried."""


def guess_provider(model: str) -> str | None:
    """The provider a model's name says, or None."""
    if model.startswith("claude-"):
        return "anthropic"
    if _OPENAI_NAMES.match(model):
        return "openai"
    return None


def provider_of(model: str, provider: str | None = None) -> str:
    """provider, checked, or the one model's name says. Raises UnknownModel."""
    if provider is not None:
        if provider not in PROVIDERS:
            raise UnknownModel(
                f"provider {provider!r}: cairn speaks {' and '.join(map(repr, PROVIDERS))}"
            )
        return provider
    if not isinstance(model, str) or not model:
        raise UnknownModel(f"model {model!r}: a model call wants a model name")
    found = guess_provider(model)
    if found is None:
        raise UnknownModel(
            f"model {model!r}: cairn cannot tell its provider from its name (claude-* is "
            "Anthropic's; gpt-*, o1/o3/o4* OpenAI's): pass provider='anthropic' or 'openai'"
        )
    return found


@dataclasses.dataclass(frozen=True)
class Route:
    """Where one model call goes."""

    provider: str
    api: str
    """messages (Anthropic); chat or responses (OpenAI)."""
    model: str


def route(request: dict[str, Any], default_model: str) -> Route:
    """The call's route, taking `provider` and `api` out of the request (they are cairn's,
    not the SDK's) and filling in the default model. Raises UnknownModel."""
    provider, api = request.pop("provider", None), request.pop("api", None)
    model = request.setdefault("model", default_model)
    provider = provider_of(model, provider)
    if api is None:
        api = (
            "messages" if provider == "anthropic" else "responses" if "input" in request else "chat"
        )
    if api not in APIS[provider]:
        raise UnknownModel(f"api {api!r}: {provider} has {' and '.join(map(repr, APIS[provider]))}")
    if api == "chat" and "input" in request:
        raise UnknownModel("Chat Completions take messages=, not input= (that is api='responses')")
    if api == "responses" and "messages" in request:
        raise UnknownModel("the Responses API takes input=, not messages= (that is api='chat')")
    return Route(provider, api, model)


class Attempt:
    """One try of a call, as the rate limiter sees it: the answer's headers, set by the
    provider as soon as they came, and its usage once it is whole."""

    __slots__ = ("headers", "usage")

    def __init__(self) -> None:
        self.headers: Mapping[str, str] | None = None
        self.usage: Any = None


class Provider(Protocol):
    """One model API behind its SDK (an instance per ModelClient; the SDK client is made
    at its first call, so a worker that never calls a provider never needs its key)."""

    name: str
    """gen_ai.provider.name, and the rate limiter's key."""

    @property
    def api_key(self) -> str:
        """The key its calls authenticate with (hashed for the rate limiter's key).
        Raises ModelNotConfigured when there is neither a key nor an address."""
        ...

    def create(self, api: str, request: dict[str, Any], attempt: Attempt) -> Any:
        """One request; returns the SDK's answer, its headers set on attempt."""
        ...

    def stream(
        self, api: str, request: dict[str, Any], attempt: Attempt, on_text: Callable[[str], None]
    ) -> Any:
        """One streamed request: on_text(delta) for each text delta as it comes; returns
        the whole answer as create() would (the same type)."""
        ...

    def transient(self, exc: BaseException) -> bool:
        """A failure a later try may not meet: a 429 that is not a spent quota, 408, 409,
        5xx, a timeout, a connection lost, an overload reported mid-stream."""
        ...

    def back_off(self, headers: Mapping[str, str], status: int) -> float:
        """Seconds the answer's headers ask every worker to hold off (0: none)."""
        ...

    def prompt(self, api: str, request: dict[str, Any]) -> Any:
        """The part of a request that is prompt (for token estimates)."""
        ...

    def max_output(self, api: str, request: dict[str, Any]) -> int:
        """The answer's longest length in tokens, as the request bounds it."""
        ...

    def close(self) -> None: ...


# -- headers every provider spells alike -------------------------------------------------
def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds a retry-after-ms or retry-after header (seconds, or an HTTP date) asks."""
    if headers is None:
        return None
    try:
        return float(headers.get("retry-after-ms", "")) / 1000
    except ValueError:
        pass
    value = headers.get("retry-after", "")
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return when.timestamp() - time.time()


def seconds_until(stamp: str | None) -> float | None:
    """Seconds from now to an RFC 3339 time (anthropic-ratelimit-*-reset), if it is one."""
    try:
        when = datetime.datetime.fromisoformat(stamp or "")
    except ValueError:
        return None
    return when.timestamp() - time.time()


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def duration(value: str | None) -> float | None:
    """Seconds in an OpenAI reset duration ("1s", "6m0s", "20ms", "1h2m3.5s"), if it is one."""
    if not value:
        return None
    parts = _DURATION.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value.strip():
        return None
    return sum(float(n) * _UNIT[u] for n, u in parts)


def hold(
    status: int,
    headers: Mapping[str, str],
    *,
    requests: tuple[str | None, str | None, float | None],
    tokens: tuple[str | None, float | None],
) -> float:
    """The fleet's back-off from an answer: a 429's retry-after (a second without one), or
    while a limit's remaining count is 0, until the limit gives one back.

    requests: (limit, remaining, seconds until the bucket is full again); a request comes
    back every (full - now) / limit seconds, and waiting for all of them would leave the
    quota idle. tokens: (remaining, seconds until full); tokens hit 0 exactly only when a
    call took the last ones: until full.
    """
    wait = 0.0
    if status == 429:
        asked = retry_after(headers)
        wait = 1.0 if asked is None else asked
    limit, remaining, full = requests
    if remaining == "0":
        try:
            per = max(int(limit or ""), 1)
        except ValueError:
            per = 1
        wait = max(wait, (full or 0.0) / per)
    if tokens[0] == "0":
        wait = max(wait, tokens[1] or 0.0)
    return min(max(wait, 0.0), MAX_BACK_OFF)


# -- answers, whichever provider gave them -----------------------------------------------
def kind_of(data: Mapping[str, Any]) -> str | None:
    """The API a journaled answer (JSON) came from: messages, chat, responses, or None."""
    if data.get("type") == "message":  # Anthropic's, as cairn journaled it from the first
        return "messages"
    kinds = {"chat.completion": "chat", "response": "responses"}
    return kinds.get(str(data.get("object")))


def decode(data: Any) -> Any:
    """A journaled answer as its SDK's own type again (a Message, a ChatCompletion, a
    Response); anything else as it was journaled."""
    kind = kind_of(data) if isinstance(data, dict) else None
    if kind is None:
        return data
    if kind == "messages":
        from cairn.steps.providers import anthropic

        return anthropic.decode(data)
    from cairn.steps.providers import openai

    return openai.decode(kind, data)


def text_of(answer: Any) -> str:
    """The text of an answer: an Anthropic Message's text blocks, an OpenAI ChatCompletion's
    first choice, an OpenAI Response's output_text; or their journaled JSON."""
    if isinstance(answer, Mapping):
        answer = decode(dict(answer))
        if isinstance(answer, Mapping):  # a shape no SDK gave: a message dict of a test's
            content = answer.get("content")
            return content if isinstance(content, str) else ""
    choices = getattr(answer, "choices", None)
    if choices is not None:
        return (choices[0].message.content or "") if choices else ""
    if getattr(answer, "object", None) == "response":
        return str(answer.output_text)
    return "".join(getattr(b, "text", "") for b in getattr(answer, "content", None) or [])
