"""What each API the model stand-in speaks provides to ModelServer (cairn.testing.standins.
model), which does the rest the same way for all: counting, the rate limit, injected
failures, pacing and cuts. An API is its wire format only: how a body is checked, what
the answer and its stream look like, how an error and the rate-limit headers are spelled."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

_Problem = tuple[str | None, str]
"""What is wrong with a request body: (the parameter at fault or None, a message)."""


@dataclass(frozen=True)
class _Event:
    """One event of a streamed answer, as written, and what it is to pacing and cuts."""

    wire: bytes
    delta: bool = False
    """A piece of the answer: counts toward ``cut_after``."""
    text: bool = False
    """A piece of text: ``token_ms`` apart from the one before."""
    opening: bool = False
    """Goes out even with ``cut_after=0`` (the answer has begun)."""
    closing: bool = False
    """A cut comes before this one at the latest, so a cut answer is never whole."""


@dataclass(frozen=True, kw_only=True)
class _Limit:
    """The rate limit's buckets as one request found them (after taking from them)."""

    refused: str | None
    """None, or which bucket ran dry: "requests" or "tokens"."""
    requests: int
    """Requests a minute (0: not limited)."""
    requests_left: float
    requests_full_s: float
    """Seconds until the requests bucket is full again."""
    tokens: int
    """Tokens a minute (0: not limited)."""
    tokens_left: float
    tokens_full_s: float
    retry_after_s: float
    """When refused: seconds until the request would pass."""

    def buckets(self) -> list[tuple[str, int, float, float]]:
        """(kind, per minute, left, seconds until full) of each bucket that is limited."""
        both = [
            ("requests", self.requests, self.requests_left, self.requests_full_s),
            ("tokens", self.tokens, self.tokens_left, self.tokens_full_s),
        ]
        return [bucket for bucket in both if bucket[1]]


class _Api:
    """One API's wire format (subclasses in anthropic.py and openai.py)."""

    name: ClassVar[str]
    """Its key in ``stats()["by_api"]`` and ``received(api=...)``."""
    path: ClassVar[str]
    """The POST route that answers it."""
    request_id_header: ClassVar[str]

    def error(self, status: int, message: str, *, param: str | None = None) -> dict[str, Any]:
        """The API's error body for status."""
        raise NotImplementedError

    def rate_limited(self, limit: _Limit) -> tuple[dict[str, Any], dict[str, str]]:
        """The 429 body and headers for a request the rate limit refused."""
        raise NotImplementedError

    def limit_headers(self, limit: _Limit) -> dict[str, str]:
        """The rate-limit headers every answer carries while a limit is set."""
        raise NotImplementedError

    def injected_429_headers(self) -> dict[str, str]:
        """Headers of an injected 429 (a retry-after of 0, so a test need not wait)."""
        return {"retry-after": "0"}

    def check(self, data: dict[str, Any] | None) -> _Problem | None:
        """What is wrong with the body, or None if it is a usable request."""
        raise NotImplementedError

    def directives(self, data: dict[str, Any]) -> str:
        """The text a test's directive lines are read from: the first user message."""
        raise NotImplementedError

    def prompt_tokens(self, data: dict[str, Any]) -> int:
        """The prompt's token estimate, taken from the tokens bucket (body checked or not)."""
        raise NotImplementedError

    def answer(self, data: dict[str, Any], no: int) -> dict[str, Any]:
        """The answer to a checked body; ``no`` numbers the answers the server gave."""
        raise NotImplementedError

    def events(self, answer: dict[str, Any], data: dict[str, Any]) -> list[_Event]:
        """The streamed form of ``answer``, from which the SDK assembles it again."""
        raise NotImplementedError

    def cut_event(self, status: int, message: str, at: int) -> bytes:
        """The event that ends a stream cut with ``cut_status`` (``at``: events sent)."""
        raise NotImplementedError


def _sse(data: dict[str, Any], name: str | None = None) -> bytes:
    """One server-sent event; without a name, a bare ``data:`` line (Chat Completions)."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def _prompt_chars(prompt: Any) -> int:
    """Characters of the prompt's JSON, whatever its shape (a body not yet checked)."""
    try:
        return len(json.dumps(prompt))
    except (TypeError, ValueError):
        return 0
