"""Model calls through the providers' own SDKs (cairn.steps.providers: Anthropic's
Messages, OpenAI's Chat Completions and Responses): retries, fleet-wide rate limits per
provider, model and key, and cost from usage (cairn.steps.prices)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_before_delay
from tenacity.wait import wait_random_exponential

from cairn.core.errors import ModelUnavailable
from cairn.steps.prices import PRICES, Prices, cost_of, set_price, tokens_of
from cairn.steps.providers import (
    MAX_BACK_OFF,
    Attempt,
    ModelNotConfigured,
    Provider,
    Route,
    UnknownModel,
    decode,
    guess_provider,
    provider_of,
    retry_after,
    route,
    text_of,
)
from cairn.steps.providers import anthropic as _anthropic
from cairn.steps.providers import openai as _openai
from cairn.steps.providers.transport import POOLS
from cairn.steps.window import json_size

if TYPE_CHECKING:
    from cairn.store.ratelimit import RateLimiter

__all__ = [
    "MAX_BACK_OFF",
    "POOLS",
    "PRICES",
    "ModelClient",
    "ModelNotConfigured",
    "RateLimited",
    "UnknownModel",
    "cost_of",
    "preload_sdk",
    "set_price",
    "text_of",
]

logger = logging.getLogger(__name__)

# observe(event, model, amount): "wait" (seconds a call waited for the limit), "deferred"
# (a call that would have waited too long: its step is retried later), "429" (answered).
Observe = Callable[[str, str, float], None]


class RateLimited(ModelUnavailable):
    """A model call would wait past CAIRN_RATE_WAIT_MAX for the fleet's rate limit: the
    step is retried later (a Transient, so its Retry policy counts it), freeing the worker."""

    def __init__(self, model: str, wait: float) -> None:
        super().__init__(f"model {model}: over the fleet's rate limit for {wait:.1f}s more")
        self.model, self.wait = model, wait


def _waiting(seconds: float, why: str) -> None:
    """A line as a model call's next try starts to wait: INFO for a wait anyone would
    notice (a second or more), DEBUG for the short waits of a busy rate limit."""
    logger.log(
        logging.INFO if seconds >= 1.0 else logging.DEBUG,
        "model call waits %.1fs %s before sending",
        seconds,
        why,
        extra={"action": "model_wait", "seconds": seconds},
    )


def preload_sdk() -> None:
    """Import the SDKs now (workers do, before their pool forks)."""
    import anthropic  # noqa: F401
    import openai  # noqa: F401


@dataclasses.dataclass(frozen=True)
class Admission:
    """A call booked with the fleet's rate limiter (ModelClient.admit): where it goes,
    whose key, the tokens booked, and the seconds to wait before sending it."""

    route: Route
    who: str
    booked: int
    wait: float
    tenant: str | None = None  # the run's tenant, whose own bucket it was booked in too


class _Theirs(BaseException):
    """What a stream's consumer (on_text, on_restart) raised, carried past the provider's
    and the retry policy's handlers untouched, and raised as itself at the end."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class ModelClient:
    """One model call (create, or stream) with tenacity retries; returns (answer, cost_usd).

    The provider is the one the model's name says, or the request's `provider=`; OpenAI's
    API the request's `api=` ("chat", the default, or "responses"; `input=` implies it).
    Keys come from the environment (ANTHROPIC_API_KEY, OPENAI_API_KEY), addresses from
    base_url/openai_base_url or ANTHROPIC_BASE_URL/OPENAI_BASE_URL.

    limiter: the fleet's rate limits (cairn.store.ratelimit), per provider, model and API
    key; each try of a call books its request and tokens there first, waiting up to
    wait_max seconds (past that it raises RateLimited), and the provider's rate-limit
    headers become fleet-wide back-offs. observe: told of waits, deferred calls and 429s
    (the worker's metrics). prices: the price table (default: the process's PRICES).

    Every try, the first and each retry, after whatever it waited (a back-off, the rate
    limit), goes out through cairn's transport, which checks the step's lease right
    before sending it (cairn.steps.context.fence): a worker paused in a wait past its
    lease sends nothing for a run another worker has taken over; the call raises LeaseLost.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        openai_api_key: str | None = None,
        openai_base_url: str | None = None,
        default_model: str = "claude-haiku-4-5",
        give_up_after: float = 60.0,
        timeout: float = 120.0,
        limiter: RateLimiter | None = None,
        wait_max: float = 10.0,
        observe: Observe | None = None,
        prices: Prices | None = None,
    ) -> None:
        provider_of(default_model)  # CAIRN_MODEL unroutable: an error at start, not per call
        self.providers: dict[str, Provider] = {
            "anthropic": _anthropic.AnthropicProvider(
                api_key=api_key, base_url=base_url, timeout=timeout
            ),
            "openai": _openai.OpenAIProvider(
                api_key=openai_api_key, base_url=openai_base_url, timeout=timeout
            ),
        }
        self.default_model = default_model
        self.give_up_after = give_up_after
        self.limiter, self.wait_max = limiter, wait_max
        self.prices = prices or PRICES
        self._observe = observe or (lambda event, model, amount: None)
        self._who: dict[str, str] = {}  # provider -> its API key's short hash

    @classmethod
    def from_settings(
        cls, settings: Any, redis_client: Any, observe: Observe | None = None
    ) -> ModelClient:
        """A worker's client: its model, API addresses, prices and rate limits from
        settings, the limits kept in Redis through redis_client (the leases' client)."""
        from cairn.store.ratelimit import RateLimiter

        return cls(
            base_url=settings.anthropic_base_url,
            openai_base_url=settings.openai_base_url,
            default_model=settings.model,
            limiter=RateLimiter.from_settings(settings, redis_client),
            wait_max=settings.rate_wait_max,
            observe=observe,
            prices=Prices(PRICES).load(settings.model_prices),
        )

    @staticmethod
    def check_settings(settings: Any) -> None:
        """Raise UnknownModel, naming the variable, for a CAIRN_MODEL or CAIRN_MODEL_PRICES
        entry no provider answers to: a worker checks at start (its client is built at the
        first run), so a misspelt setting is one line then, not a failure of every run."""
        if guess_provider(settings.model) is None:
            raise UnknownModel(
                f"CAIRN_MODEL={settings.model!r}: cairn cannot tell its provider from its "
                "name (claude-* is Anthropic's; gpt-*, o1/o3/o4* OpenAI's); name such a model "
                "in the call instead, with provider='anthropic' or 'openai'"
            )
        Prices(PRICES).load(settings.model_prices)

    @property
    def client(self) -> Any:
        """The anthropic SDK's client (what this class held before it had providers)."""
        return self.providers["anthropic"].client  # type: ignore[attr-defined]

    def close(self) -> None:
        for provider in self.providers.values():
            provider.close()

    # -- what a call costs ---------------------------------------------------------------
    def cost(self, route: Route, answer: Any, request: Mapping[str, Any]) -> float:
        """An answer's cost from its usage; an answer without one (a server that sent
        none) is priced as the request's worst case, never as free."""
        usage = getattr(answer, "usage", None)
        if usage is None:
            return self._worst(route, dict(request))
        return cost_of(route.model, usage, route.provider, self.prices)

    def worst_cost(self, **request: Any) -> float:
        """An upper estimate of a request's cost, for the budget check before the call: its
        prompt at 3 bytes a token (English and JSON run nearer 4), uncached, and the most
        output it allows as output. Raises UnknownModel for a request it cannot route."""
        request = dict(request)
        return self._worst(route(request, self.default_model), request)

    def worst_tokens(self, **request: Any) -> int:
        """An upper estimate of a request's tokens (its prompt and the most output it
        allows), for a token budget's check before the call, as worst_cost's."""
        return self._tokens(dict(request))

    def _worst(self, route: Route, request: dict[str, Any]) -> float:
        provider = self.providers[route.provider]
        price = self.prices.price(route.provider, route.model)
        tokens_in = json_size(provider.prompt(route.api, request)) // 3 + 1
        tokens_out = provider.max_output(route.api, request)
        return (tokens_in * price.input + tokens_out * price.output) / 1e6

    def _tokens(self, request: dict[str, Any], where: Route | None = None) -> int:
        """Tokens to book for a request: its prompt at 3 bytes a token (over, as in
        worst_cost) and the most output it allows; settled with the usage after."""
        if where is None:
            request = dict(request)
            where = route(request, self.default_model)
        provider = self.providers[where.provider]
        prompt = json_size(provider.prompt(where.api, request)) // 3 + 1
        return prompt + provider.max_output(where.api, request)

    # -- the fleet's rate limits ---------------------------------------------------------
    def account(self, provider: str) -> str:
        """The short hash of the key provider's calls authenticate with (limits are per
        provider, model and key). Raises ModelNotConfigured."""
        who = self._who.get(provider)
        if who is None:
            from cairn.store.ratelimit import account

            who = self._who[provider] = account(self.providers[provider].api_key)
        return who

    def admit(self, where: Route, tokens: int) -> Admission:
        """Book one try of a call with the limiter (none: nothing to book). Raises
        RateLimited when it would wait past wait_max; the caller sleeps admission.wait."""
        if self.limiter is None:
            return Admission(where, "", 0, 0.0)
        from cairn.steps.context import current  # not at the top: context imports this

        step = current()
        tenant = step.tenant if step is not None else None  # its tenant's limits too
        who = self.account(where.provider)
        ok, wait = self.limiter.take(
            where.provider, where.model, who, tokens, self.wait_max, tenant=tenant
        )
        if not ok:
            self._observe("deferred", where.model, 1)
            raise RateLimited(where.model, wait)
        if wait > 0:
            self._observe("wait", where.model, wait)
        return Admission(where, who, tokens, wait, tenant)

    def answered(
        self, admission: Admission, status: int, headers: Mapping[str, str] | None, usage: Any
    ) -> None:
        """What one try's answer tells the limiter: its headers' back-off (a 429's first),
        and the tokens booked and not used (usage: None when there was no answer)."""
        if self.limiter is None:
            return
        where = admission.route
        if status == 429:
            self._observe("429", where.model, 1)
        if headers is not None:
            seconds = self.providers[where.provider].back_off(headers, status)
            if seconds > 0:
                self.limiter.back_off(where.provider, where.model, admission.who, seconds)
                if status == 429:  # a limit we were not told of, or set too high: worth a line
                    logger.warning(
                        "%s model %s answered 429: every worker holds off %.1fs",
                        where.provider,
                        where.model,
                        seconds,
                        extra={
                            "action": "model_back_off",
                            "model": where.model,
                            "provider": where.provider,
                            "seconds": seconds,
                        },
                    )
        if usage is not None:
            used = tokens_of(usage).limited
            self.limiter.settle(
                where.provider, where.model, admission.who, admission.booked - used,
                tenant=admission.tenant,
            )  # fmt: skip

    @staticmethod
    def failure(exc: BaseException) -> tuple[int, Mapping[str, str] | None] | None:
        """(status, headers) of a failed try that had an HTTP answer, either SDK's error or
        pydantic-ai's ModelHTTPError; None for one that had none (a connection lost). A
        status of 200: an error reported after the stream began."""
        status = getattr(exc, "status_code", None)
        if not isinstance(status, int):
            return None
        headers = getattr(exc, "headers", None)
        if headers is None:
            headers = getattr(getattr(exc, "response", None), "headers", None)
        return status, headers

    # -- one call ------------------------------------------------------------------------
    def _retrying(self, retry: Callable[[BaseException], bool]) -> Retrying:
        return Retrying(
            retry=retry_if_exception(retry),
            wait=self._wait,
            # Before the sleep, not after it: a retry-after past give_up_after (a 429 of a
            # quota spent for the minute) gives up now instead of holding the worker for it.
            stop=stop_before_delay(self.give_up_after),
            before_sleep=self._backing_off,
            reraise=True,
        )

    @staticmethod
    def _backing_off(state: RetryCallState) -> None:
        """A line before a retry's back-off (the next try's lease check is the transport's)."""
        seconds = state.upcoming_sleep
        if seconds > 0:
            exc = state.outcome.exception() if state.outcome else None
            _waiting(seconds, f"after {type(exc).__name__} (try {state.attempt_number})")

    def _wait(self, state: RetryCallState) -> float:
        """Honour the server's retry-after; otherwise exponential backoff with jitter."""
        exc = state.outcome.exception() if state.outcome else None
        failed = self.failure(exc) if exc is not None else None
        if self.limiter is not None and failed is not None and failed[0] == 429:
            # Its back-off is in Redis now: the next try's booking waits it out, up to
            # wait_max, and past that frees the worker (RateLimited) instead of sleeping.
            return 0.0
        asked = retry_after(failed[1]) if failed is not None else None
        if asked is not None:
            return min(max(asked, 0.0), MAX_BACK_OFF)
        return wait_random_exponential(multiplier=0.5, max=20.0)(state)

    def _try(self, where: Route, request: dict[str, Any], send: Callable[[Attempt], Any]) -> Any:
        """One try of a call under the fleet's limits: booked (and waited for) before,
        its answer's headers and usage told to the limiter after."""
        admission = self.admit(where, self._tokens(request, where) if self.limiter else 0)
        if admission.wait > 0:
            _waiting(admission.wait, f"for the fleet's rate limit on {where.model}")
            time.sleep(admission.wait)
        attempt = Attempt()
        try:
            answer = send(attempt)
        except Exception as exc:
            failed = self.failure(exc)
            if failed is not None and failed[0] != 200:  # 200: mid-stream, no headers of its own
                self.answered(admission, failed[0], failed[1], None)
            raise
        self.answered(admission, 200, attempt.headers, getattr(answer, "usage", None))
        return answer

    def _call(
        self,
        request: dict[str, Any],
        send: Callable[[Provider, Route, dict[str, Any], Attempt], Any],
    ) -> tuple[Any, float]:
        """A call retried while its failures are transient; ModelUnavailable once they
        have gone on for give_up_after seconds, or the next wait would pass that."""
        where = route(request, self.default_model)
        provider = self.providers[where.provider]
        if where.provider == "anthropic":
            request.setdefault("max_tokens", _anthropic.DEFAULT_MAX_TOKENS)

        def worth(exc: BaseException) -> bool:  # a stream consumer's own error never is
            return not isinstance(exc, _Theirs) and provider.transient(exc)

        def attempt() -> Any:
            return self._try(where, request, lambda a: send(provider, where, request, a))

        try:
            answer = self._retrying(worth)(attempt)
        except Exception as exc:
            if worth(exc):
                raise ModelUnavailable(f"model API kept failing: {exc}") from exc
            raise
        return answer, self.cost(where, answer, request)

    def create(self, **request: Any) -> tuple[Any, float]:
        """One answer (the SDK's type: Message, ChatCompletion or Response) and its cost.

        Raises:
            ModelUnavailable: the API kept failing transiently for ``give_up_after`` seconds.
            UnknownModel, ModelNotConfigured: a call no provider can take.
        """
        return self._call(request, lambda p, r, body, a: p.create(r.api, body, a))

    def stream(
        self,
        on_text: Callable[[str], None],
        on_restart: Callable[[], None] | None = None,
        **request: Any,
    ) -> tuple[Any, float]:
        """A streamed answer with the same retry policy as create(): on_text(delta) for
        each text delta as it arrives; returns (the whole answer, its cost from the usage).

        Each retry streams the answer again from its start; if the failed try had passed
        text to on_text, on_restart() is called once before the new try's first delta (or
        before returning, if the new answer has no text), so the consumer drops what it
        showed.  An exception from on_text or on_restart propagates at once, unretried.

        Returns:
            The answer as create() returns it (a Message, a ChatCompletion, a Response) and
            its cost.

        Raises:
            ModelUnavailable: the API kept failing transiently for ``give_up_after`` seconds.
        """
        shown = False  # the consumer holds text passed to on_text and not yet dropped
        restart = False  # the try in hand owes the consumer a restart before its text

        def deliver(text: str | None) -> None:
            nonlocal shown, restart
            try:
                if restart:
                    shown = restart = False
                    if on_restart is not None:
                        on_restart()
                if text is not None:
                    shown = True
                    on_text(text)
            except BaseException as exc:  # noqa: BLE001 (carried out whole, raised as itself)
                raise _Theirs(exc) from None

        def send(p: Provider, r: Route, body: dict[str, Any], a: Attempt) -> Any:
            nonlocal restart
            restart = shown  # a failed try's text to drop before this one's
            answer = p.stream(r.api, body, a, deliver)
            if restart:  # the new answer had no text to replace the old with
                deliver(None)
            return answer

        try:
            return self._call(request, send)
        except _Theirs as theirs:
            error = theirs.error
        raise error  # outside the handler: their exception as it was, no context added

    # -- answers -------------------------------------------------------------------------
    @staticmethod
    def encode(answer: Any) -> Any:
        """An answer as the journal keeps it (JSON)."""
        if getattr(answer, "object", None) in ("chat.completion", "response"):
            return _openai.encode(answer)
        return answer.model_dump(mode="json")

    @staticmethod
    def decode(data: Any) -> Any:
        """A journaled answer as its SDK's own type again, whichever provider gave it."""
        return decode(data)

    @staticmethod
    def span_attributes(request: Mapping[str, Any], answer: Any) -> dict[str, Any]:
        """An answer's GenAI span attributes (gen_ai.provider.name, tokens, finish reasons)."""
        kind = getattr(answer, "object", None)
        if kind in ("chat.completion", "response"):
            api = "chat" if kind == "chat.completion" else "responses"
            attrs, provider = _openai.span_attributes(api, request, answer), "openai"
        else:
            attrs, provider = _anthropic.span_attributes(request, answer), "anthropic"
        model = getattr(answer, "model", None) or request.get("model")
        return {
            **attrs,
            "gen_ai.provider.name": provider,
            "gen_ai.system": provider,  # its name before provider.name: older backends read it
            "gen_ai.request.model": request.get("model") or model,
            "gen_ai.response.model": model,
        }
