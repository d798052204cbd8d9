"""Model calls through the anthropic SDK: retries, fleet-wide rate limits, and cost from
usage."""

from __future__ import annotations

import contextlib
import datetime
import itertools
import logging
import os
import socket
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay
from tenacity.wait import wait_random_exponential

from cairn.core.errors import ModelUnavailable
from cairn.steps.window import json_size

if TYPE_CHECKING:
    from cairn.store.ratelimit import RateLimiter

logger = logging.getLogger(__name__)

# observe(event, model, amount): "wait" (seconds a call waited for the limit), "deferred"
# (a call that would have waited too long: its step is retried later), "429" (answered).
Observe = Callable[[str, str, float], None]

# The longest back-off a provider's headers can ask of the fleet: a clock gone wrong on
# either side must not stop every worker for long.
MAX_BACK_OFF = 60.0


class RateLimited(ModelUnavailable):
    """A model call would wait past CAIRN_RATE_WAIT_MAX for the fleet's rate limit: the
    step is retried later (a Transient, so its Retry policy counts it), freeing the worker."""

    def __init__(self, model: str, wait: float) -> None:
        super().__init__(f"model {model}: over the fleet's rate limit for {wait:.1f}s more")
        self.model, self.wait = model, wait


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


def _seconds_until(stamp: str | None) -> float | None:
    """Seconds from now to an RFC 3339 time (anthropic-ratelimit-*-reset), if it is one."""
    try:
        when = datetime.datetime.fromisoformat(stamp or "")
    except ValueError:
        return None
    return when.timestamp() - time.time()


def back_off(headers: Any, status: int) -> float:
    """Seconds the provider's answer asks every worker to hold off (0: none): a 429's
    retry-after, or, when a limit's remaining count is 0, until the limit gives one back.

    anthropic-ratelimit-*-reset is when the bucket is full again: for requests, one comes
    back every (reset - now) / limit seconds, and waiting for all of them would leave the
    quota idle. Tokens hit 0 exactly only when a call took the last ones: until the reset.
    """
    hold = 0.0
    if status == 429:
        try:
            hold = float(headers.get("retry-after", ""))
        except ValueError:
            hold = 1.0  # a 429 without its retry-after: a second, then the resets below
    if headers.get("anthropic-ratelimit-requests-remaining") == "0":
        until = _seconds_until(headers.get("anthropic-ratelimit-requests-reset"))
        try:
            limit = max(int(headers.get("anthropic-ratelimit-requests-limit", "")), 1)
        except ValueError:
            limit = 1
        hold = max(hold, (until or 0.0) / limit)
    if headers.get("anthropic-ratelimit-tokens-remaining") == "0":
        hold = max(hold, _seconds_until(headers.get("anthropic-ratelimit-tokens-reset")) or 0.0)
    return min(max(hold, 0.0), MAX_BACK_OFF)


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
    """messages.create (or .stream) with tenacity retries; returns (message, cost_usd).

    limiter: the fleet's rate limits (cairn.store.ratelimit); each try of a call books
    its request and tokens there first, waiting up to wait_max seconds (past that it
    raises RateLimited), and the provider's rate-limit headers become fleet-wide back-offs.
    observe: told of waits, deferred calls and 429s (the worker's metrics).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        default_model: str = "claude-haiku-4-5",
        give_up_after: float = 60.0,
        timeout: float = 120.0,
        limiter: RateLimiter | None = None,
        wait_max: float = 10.0,
        observe: Observe | None = None,
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
        self.limiter, self.wait_max = limiter, wait_max
        self._observe = observe or (lambda event, model, amount: None)
        self._who = ""  # the API key's short hash: limits are per model and key
        if limiter is not None:
            from cairn.store.ratelimit import account

            self._who = account(self.client.api_key or "")

    @classmethod
    def from_settings(
        cls, settings: Any, redis_client: Any, observe: Observe | None = None
    ) -> ModelClient:
        """A worker's client: its model, API base URL and rate limits from settings, the
        limits kept in Redis through redis_client (the process's leases' client)."""
        from cairn.store.ratelimit import RateLimiter

        return cls(
            base_url=settings.anthropic_base_url,
            default_model=settings.model,
            limiter=RateLimiter.from_settings(settings, redis_client),
            wait_max=settings.rate_wait_max,
            observe=observe,
        )

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
        tokens_out: int = request.get("max_tokens", 1024)
        return (tokens_in * price_in + tokens_out * price_out) / 1e6

    def _retrying(self, retry: Callable[[BaseException], bool] = _transient) -> Retrying:
        return Retrying(
            retry=retry_if_exception(retry),
            wait=self._wait,
            stop=stop_after_delay(self.give_up_after),
            reraise=True,
        )

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if self.limiter is not None and getattr(exc, "status_code", None) == 429:
            # Its back-off is in Redis now: the next try's booking waits it out, up to
            # wait_max, and past that frees the worker (RateLimited) instead of sleeping.
            return 0.0
        return _retry_after(state)

    @contextlib.contextmanager
    def _limited(self, request: dict[str, Any]) -> Iterator[types.SimpleNamespace]:
        """One try of a call, under the fleet's limits: booked (and waited for) before,
        settled after. The body sets .headers (the answer's) and .usage (its tokens)."""
        import anthropic

        answer = types.SimpleNamespace(headers=None, usage=None)
        if self.limiter is None:
            yield answer
            return
        model, booked = request["model"], self._tokens(request)
        ok, wait = self.limiter.take(model, self._who, booked, self.wait_max)
        if not ok:
            self._observe("deferred", model, 1)
            raise RateLimited(model, wait)
        if wait > 0:
            self._observe("wait", model, wait)
            time.sleep(wait)
        try:
            yield answer
        except anthropic.APIStatusError as exc:
            if exc.status_code != 200:  # 200: an error event mid-stream, no headers of its own
                self._heed(model, exc.response.headers, exc.status_code)
            raise
        if answer.headers is not None:
            self._heed(model, answer.headers, 200)
        if answer.usage is not None:
            self.limiter.settle(model, self._who, booked - _tokens_used(answer.usage))

    def _heed(self, model: str, headers: Any, status: int) -> None:
        if status == 429:
            self._observe("429", model, 1)
        hold = back_off(headers, status)
        if hold > 0 and self.limiter is not None:
            self.limiter.back_off(model, self._who, hold)
            if status == 429:  # a limit we were not told of, or set too high: worth a line
                logger.warning(
                    "model %s answered 429: every worker holds off %.1fs",
                    model,
                    hold,
                    extra={"action": "model_back_off", "model": model, "seconds": hold},
                )

    @staticmethod
    def _tokens(request: dict[str, Any]) -> int:
        """Tokens to book for a request: its prompt at 3 bytes a token (over, as in
        worst_cost) and all of max_tokens; settled with the usage after."""
        prompt = {k: request.get(k) for k in ("system", "messages", "tools")}
        return json_size(prompt) // 3 + 1 + int(request.get("max_tokens", 1024))

    def create(self, **request: Any) -> tuple[Any, float]:
        request.setdefault("model", self.default_model)
        request.setdefault("max_tokens", 1024)

        def attempt() -> Any:
            with self._limited(request) as answer:
                raw = self.client.messages.with_raw_response.create(**request)
                answer.headers, message = raw.headers, raw.parse()
                answer.usage = message.usage
            return message

        try:
            message = self._retrying()(attempt)
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
            with self._limited(request) as answer, self.client.messages.stream(**request) as s:
                answer.headers = s.response.headers
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
                answer.usage = final.usage
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


def _tokens_used(usage: Any) -> int:
    """The tokens of an answer that count against a limit: cache reads are left out, as
    the API leaves them out of its input-tokens limit."""
    return sum(
        getattr(usage, name, 0) or 0
        for name in ("input_tokens", "cache_creation_input_tokens", "output_tokens")
    )


def _message_type() -> Any:
    from anthropic.types import Message

    return Message


def text_of(message: Any) -> str:
    """The concatenated text blocks of a response."""
    return "".join(getattr(b, "text", "") for b in message.content)
