"""Model calls through the anthropic SDK: retries, and cost from usage."""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
from collections.abc import Callable
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


POOLS = 64

# TCP keepalive as the SDK's default transport sets it: a long model call on an idle
# connection is not dropped by a NAT or load balancer on the way.
_KEEPALIVE = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)] + [
    (socket.IPPROTO_TCP, getattr(socket, name), value)
    for name, value in (("TCP_KEEPINTVL", 60), ("TCP_KEEPCNT", 5))
    if hasattr(socket, name)
]


def _spread_transport() -> Any:
    """The SDK's HTTP transport as POOLS connection pools, each thread keeping to one.

    httpcore's pool looks at every connection it holds for every request and response,
    so with hundreds of runs calling the model at once in one process (the threads pool)
    one shared pool cost more CPU than the rest of the step: about 6.7 CPU ms a call at
    500 threads, against 0.85 ms for one thread. A pool per thread would make a TLS
    context each; POOLS pools bound the scan at about concurrency / POOLS connections.
    """
    import httpx2  # the SDK's own HTTP package: anthropic.DefaultHttpxClient takes its transports

    class Spread(httpx2.BaseTransport):
        def __init__(self) -> None:
            self._ssl = httpx2.create_ssl_context()  # one for all pools: slow to make
            self._pools: list[Any] = [None] * POOLS
            self._lock = threading.Lock()
            self._turn = itertools.count()
            self._mine = threading.local()

        def _pool(self) -> Any:
            i = getattr(self._mine, "i", None)
            if i is None:
                i = self._mine.i = next(self._turn) % POOLS
            if self._pools[i] is None:
                with self._lock:
                    if self._pools[i] is None:
                        self._pools[i] = httpx2.HTTPTransport(
                            verify=self._ssl, socket_options=_KEEPALIVE
                        )
            return self._pools[i]

        def handle_request(self, request: Any) -> Any:
            return self._pool().handle_request(request)

        def close(self) -> None:
            for pool in self._pools:
                if pool is not None:
                    pool.close()

    return Spread()


def preload_sdk() -> None:
    """Import the anthropic SDK now (workers do, before their pool forks)."""
    import anthropic  # noqa: F401


def _transient(exc: BaseException) -> bool:
    import anthropic

    if isinstance(exc, anthropic.APIConnectionError):  # includes timeouts
        return True
    if not isinstance(exc, anthropic.APIStatusError):
        return False
    if exc.status_code == 200:
        # An `error` event in a stream that had begun: the API's overload or fault after
        # the headers went out, which a fresh request may not meet.
        return exc.type in ("overloaded_error", "api_error")
    return exc.status_code in (408, 409, 429) or exc.status_code >= 500  # 529 = overloaded


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
    """messages.create (or .stream) with tenacity retries; returns (message, cost_usd)."""

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
            http_client=anthropic.DefaultHttpxClient(transport=_spread_transport()),
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

    def _retrying(self, retry: Callable[[BaseException], bool] = _transient) -> Retrying:
        return Retrying(
            retry=retry_if_exception(retry),
            wait=_retry_after,
            stop=stop_after_delay(self.give_up_after),
            reraise=True,
        )

    def create(self, **request: Any) -> tuple[Any, float]:
        request.setdefault("model", self.default_model)
        request.setdefault("max_tokens", 1024)
        try:
            message = self._retrying()(self.client.messages.create, **request)
        except Exception as exc:
            if _transient(exc):
                raise ModelUnavailable(f"model API kept failing: {exc}") from exc
            raise
        return message, cost_of(message.model, message.usage)

    def stream(
        self,
        on_text: Callable[[str], None],
        on_restart: Callable[[], None] | None = None,
        **request: Any,
    ) -> tuple[Any, float]:
        """messages.stream through the SDK with the same retry policy as create(): on_text(delta)
        for each text delta as it arrives; returns (final message, cost from the final usage).

        Each retry streams the answer again from its start; if the failed try had passed
        text to on_text, on_restart() is called once before the new try's first delta (or
        before returning, if the new answer has no text), so the consumer drops what it
        showed.  An exception from on_text or on_restart propagates at once, unretried.

        Returns:
            The final ``anthropic.types.Message`` (the type create() returns) and its cost.

        Raises:
            ModelUnavailable: the API kept failing transiently for ``give_up_after`` seconds.
        """
        import anthropic
        import httpx2

        request.setdefault("model", self.default_model)
        request.setdefault("max_tokens", 1024)
        shown = False  # the consumer holds text passed to on_text and not yet dropped
        # What on_text or on_restart raised: never retried, whatever its type.
        theirs: BaseException | None = None

        def deliver(text: str | None, restart: bool) -> None:
            nonlocal shown, theirs
            try:
                if restart:
                    shown = False
                    if on_restart is not None:
                        on_restart()
                if text is not None:
                    shown = True
                    on_text(text)
            except BaseException as exc:
                theirs = exc
                raise

        def attempt() -> Any:
            restart = shown  # a failed try's text to drop before this one's
            with self.client.messages.stream(**request) as s:
                try:
                    for text in s.text_stream:
                        deliver(text, restart)
                        restart = False
                    final = s.get_final_message()
                except httpx2.TransportError as exc:
                    if exc is theirs:
                        raise
                    # The SDK names transport errors its own way only up to the headers; a
                    # body cut off or stalled later comes through raw. Same failure, same name.
                    if isinstance(exc, httpx2.TimeoutException):
                        raise anthropic.APITimeoutError(request=s.response.request) from exc
                    raise anthropic.APIConnectionError(request=s.response.request) from exc
            if restart:  # the new answer had no text to replace the old with
                deliver(None, restart)
            return final

        def retry(exc: BaseException) -> bool:
            return exc is not theirs and _transient(exc)

        try:
            final = self._retrying(retry)(attempt)
        except Exception as exc:
            if retry(exc):
                raise ModelUnavailable(f"model API kept failing: {exc}") from exc
            raise
        # A plain Message, as create() returns: the stream's ParsedMessage has its own block types.
        message = _message_type().model_validate(final.model_dump())
        return message, cost_of(message.model, message.usage)

    @staticmethod
    def encode(message: Any) -> Any:
        """A response as the journal keeps it (JSON)."""
        return message.model_dump(mode="json")

    @staticmethod
    def decode(data: Any) -> Any:
        """A journaled response as the SDK's own Message again."""
        return _message_type().model_validate(data)


def _message_type() -> Any:
    from anthropic.types import Message

    return Message


def text_of(message: Any) -> str:
    """The concatenated text blocks of a response."""
    return "".join(getattr(b, "text", "") for b in message.content)
