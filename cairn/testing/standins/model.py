"""ModelServer: one loopback server that speaks the Anthropic Messages API
(``POST /v1/messages``, cairn.testing.standins.anthropic) and OpenAI's Chat Completions
and Responses APIs (``POST /v1/chat/completions``, ``POST /v1/responses``,
cairn.testing.standins.openai) with deterministic replies, streaming, one rate limit and
the same injectable failures for all three, so the real SDKs run with no key and no
network::

    anthropic.Anthropic(api_key="local", base_url=server.url)
    openai.OpenAI(api_key="local", base_url=server.openai_url)    # server.url + "/v1"

What every API shares
---------------------
* Replies, tool calls and usage follow the directives of cairn.testing.standins.replies
  (``REPLY:``, ``TOOLS:``, ``TOKEN_MS:``, ``CACHED:``, ``REASONING:`` lines in the first
  user message).
* ``fail_every=N`` fails requests N, 2N, 3N, ... (counted over all APIs) with
  ``fail_status``; :meth:`ModelServer.control` or ``POST /_control`` queues the next k
  failures, or a cut of the next streamed answer, whichever API it goes to. An injected
  failure is the API's own error body with that status (a 429 with ``retry-after: 0``;
  queued with ``retry_after=s``, each says ``retry-after: s``, whatever its status).
  Injected failures win over checking the body, like a real overloaded front end.
* ``delay_ms`` sleeps before every answer (before the first event of a stream), each
  request for the delay set when ``stats()`` first counted it (so a test can hold one
  request in flight and let the next answer at once); ``token_ms`` between the text deltas of a stream (a ``TOKEN_MS: n`` line overrides it).
* ``cut_after=k`` breaks off the next streamed answer after k deltas (its opening event
  always goes out, its closing one never): the connection dropped without the closing
  chunk, or with ``cut_status`` an error event in the API's own shape.
* Rate limit: ``rpm=R`` (``--rpm``) is a bucket of ``burst`` requests (default R: a
  minute's) refilled at R a minute, and ``tpm=T`` (``--tpm``) one of T prompt tokens (the
  estimate usage reports) refilled at T a minute, shared by all the APIs as by one
  account. A request that finds a bucket empty is answered 429 in the API's shape with
  its ``retry-after``, and counted in ``stats()["rate_limited"]``; every answer carries
  the API's rate-limit headers while a limit is set.
* ``stats()`` (``GET /_stats``) counts requests, injected failures (cuts included) and
  streams over all the APIs, and per API under ``by_api`` once an OpenAI API was asked.
* Billing: :meth:`ModelServer.billed` lists the usage of every answer made, each billed
  once per ``Idempotency-Key`` header (a request whose key was billed is answered again,
  unbilled, as by a provider that honours the key; cairn sends one per journaled model
  call, the same on every attempt at it), or once per request without one.
* ``GET /_stats`` and ``POST /_control`` answer in the Anthropic shape; an unknown route
  is a 404 in the shape of the API its path belongs to.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from cairn.testing.standins.anthropic import MessagesApi
from cairn.testing.standins.api import _Api, _Event, _Limit
from cairn.testing.standins.openai import ChatCompletionsApi
from cairn.testing.standins.replies import _TOKEN_MS_LINE
from cairn.testing.standins.responses import ResponsesApi
from cairn.testing.standins.server import _Cut, _EventStream, _parse_json_object, _StandIn

_APIS: tuple[_Api, ...] = (MessagesApi(), ChatCompletionsApi(), ResponsesApi())
_ROUTES = {api.path: api for api in _APIS}

_FAIL_MESSAGES: dict[int, str] = {
    400: "Injected invalid request.",
    401: "Injected authentication failure.",
    403: "Injected permission failure.",
    404: "Injected not found.",
    413: "Injected request too large.",
    429: "Number of requests has exceeded your rate limit (injected by stand-in).",
    500: "Internal server error (injected by stand-in).",
    503: "Service unavailable (injected by stand-in).",
    529: "Overloaded (injected by stand-in).",
}

_CONTROL_FIELDS = {
    "fail_next",
    "status",
    "fail_every",
    "fail_status",
    "delay_ms",
    "token_ms",
    "cut_after",
    "cut_status",
    "retry_after",
    "reset",
}


def _check_status(status: Any) -> None:
    if isinstance(status, bool) or not isinstance(status, int) or status not in _FAIL_MESSAGES:
        raise ValueError(f"status must be one of {sorted(_FAIL_MESSAGES)}, got {status!r}")


def _paced(
    events: list[_Event],
    *,
    token_ms: int,
    cut_after: int | None,
    cut: Callable[[int], bytes] | None,
) -> Iterator[bytes]:
    """``events`` on the wire, token_ms apart between text deltas.  With cut_after the
    answer breaks off after that many deltas (before the closing event at the latest, so
    a cut always fails the call): the connection dropped, or ``cut(events sent)``."""
    deltas = texts = 0
    for at, event in enumerate(events):
        if cut_after is not None and not event.opening and (deltas >= cut_after or event.closing):
            if cut is None:
                raise _Cut
            yield cut(at)
            return
        if event.delta:
            if event.text:
                if texts and token_ms > 0:
                    time.sleep(token_ms / 1000)
                texts += 1
            deltas += 1
        yield event.wire


def _counts() -> dict[str, int]:
    return {"requests": 0, "failures": 0, "streamed": 0, "rate_limited": 0}


class ModelServer(_StandIn):
    """Model API stand-in (Messages, Chat Completions, Responses) with deterministic replies,
    a rate limit and failure injection; see the module docstring.

    ``fail_every=N`` fails requests N, 2N, 3N, ... with ``fail_status``; ``POST /_control``
    (or :meth:`control`) queues the next k failures, or a cut of the next streamed answer.
    ``token_ms`` paces the text deltas of streamed answers; ``rpm``/``burst`` and ``tpm``
    set a rate limit.
    """

    name = "model"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        delay_ms: int = 0,
        token_ms: int = 0,
        fail_every: int = 0,
        fail_status: int = 429,
        rpm: int = 0,
        burst: int | None = None,
        tpm: int = 0,
        verbose: bool = False,
    ) -> None:
        super().__init__(host, port, delay_ms=delay_ms, verbose=verbose)
        _check_status(fail_status)
        if rpm < 0 or tpm < 0 or (burst is not None and burst < 1):
            raise ValueError(
                f"rpm and tpm must be >= 0 and burst >= 1, got rpm={rpm}, tpm={tpm}, burst={burst}"
            )
        # Plain attribute like delay_ms: read on every streamed request.
        self.token_ms = token_ms
        self.fail_every = fail_every
        self.fail_status = fail_status
        self.rpm, self.burst, self.tpm = rpm, burst or rpm, tpm
        self._reset_state()

    @property
    def openai_url(self) -> str:
        """The OpenAI SDK's base URL (``OPENAI_BASE_URL``): ``url`` + ``/v1``, as the SDK
        joins paths such as ``chat/completions`` to it."""
        return f"{self.url}/v1"

    def _reset_state(self) -> None:
        self._requests = 0
        self._failures = 0
        self._rate_limited = 0
        self._by_api = {api.name: _counts() for api in _APIS}
        now = time.time()
        self._bucket, self._tokens, self._bucket_at = float(self.burst), float(self.tpm), now
        self._streamed = 0
        self._served = 0
        self._fail_next = 0
        self._fail_next_status = 429
        self._fail_next_after: float | None = None  # their retry-after (None: the default)
        self._cut_after: int | None = None
        self._cut_status: int | None = None
        self._received: list[tuple[str, dict[str, Any]]] = []
        self._billed: dict[str, tuple[Any, Any]] = {}  # key (or request no) -> (model, usage)

    def stats(self) -> dict[str, Any]:
        """Same dict as ``GET /_stats``: requests (streamed ones included), injected
        failures (cuts included), how many requests asked for a stream, and with a rate
        limit set, how many were answered 429 by it (``rate_limited``), over all APIs.

        Once a request reached an OpenAI API, ``by_api`` holds the same counts per API
        (``messages``, ``chat.completions``, ``responses``); a server only ever asked the
        Messages API leaves it out, so its stats read as they always have.
        """
        limited = bool(self.rpm or self.tpm)
        with self._lock:
            stats: dict[str, Any] = {
                "requests": self._requests,
                "failures": self._failures,
                "streamed": self._streamed,
            }
            if limited:
                stats["rate_limited"] = self._rate_limited
            if self._requests > self._by_api[MessagesApi.name]["requests"]:
                stats["by_api"] = {
                    name: {k: v for k, v in counts.items() if limited or k != "rate_limited"}
                    for name, counts in self._by_api.items()
                }
            return stats

    def billed(self) -> list[tuple[Any, Any]]:
        """(model, usage) of each answer billed, oldest first: once per Idempotency-Key."""
        with self._lock:
            return list(self._billed.values())

    def received(self, api: str | None = None) -> list[dict[str, Any]]:
        """Bodies of the requests seen so far (JSON objects only), oldest first; with
        ``api`` (``"messages"``, ``"chat.completions"``, ``"responses"``) that API's only."""
        with self._lock:
            return [body for name, body in self._received if api is None or name == api]

    def control(
        self,
        *,
        fail_next: int | None = None,
        status: int | None = None,
        fail_every: int | None = None,
        fail_status: int | None = None,
        delay_ms: int | None = None,
        token_ms: int | None = None,
        cut_after: int | None = None,
        cut_status: int | None = None,
        retry_after: float | None = None,
        reset: bool = False,
    ) -> None:
        """Change failure injection and pacing at run time (same fields as ``POST /_control``).

        Args:
            fail_next: fail the next k requests, to whichever API, with ``status`` (default 429).
            fail_every: fail every Nth request with ``fail_status`` (0: never).
            delay_ms: sleep before every answer.
            token_ms: sleep between the text deltas of a streamed answer.
            cut_after: break off the next streamed answer after k deltas by dropping the
                connection, or with ``cut_status`` (default none) by an error event of
                that status's type, in the shape of the API that streams it.
            retry_after: the seconds the failures fail_next queues ask the client to wait
                (``retry-after`` and ``retry-after-ms``), whatever their status; without
                it a 429 says 0 and other statuses say nothing.
            reset: forget counts, received bodies and queued failures and cuts first.
        """
        for s in (status, fail_status, cut_status):
            if s is not None:
                _check_status(s)
        if cut_after is not None and (
            isinstance(cut_after, bool) or not isinstance(cut_after, int)
        ):
            raise ValueError(f"cut_after must be an integer, got {cut_after!r}")
        if retry_after is not None and (
            isinstance(retry_after, bool)
            or not isinstance(retry_after, int | float)
            or not 0 <= retry_after <= 3600
        ):
            raise ValueError(f"retry_after must be seconds from 0 to 3600, got {retry_after!r}")
        with self._lock:
            if reset:
                self._reset_state()
            if fail_next is not None:
                self._fail_next = max(0, int(fail_next))
                self._fail_next_status = status if status is not None else 429
                self._fail_next_after = retry_after
            if fail_every is not None:
                self.fail_every = max(0, int(fail_every))
            if fail_status is not None:
                self.fail_status = fail_status
            if delay_ms is not None:
                self.delay_ms = max(0, int(delay_ms))
            if token_ms is not None:
                self.token_ms = max(0, int(token_ms))
            if cut_after is not None:
                self._cut_after = max(0, cut_after)
                self._cut_status = cut_status

    def _handle(
        self, method: str, path: str, headers: dict[str, str], raw: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        api = _ROUTES.get(path)
        if method == "POST" and api is not None:
            key = next((v for k, v in headers.items() if k.lower() == "idempotency-key"), None)
            return self._serve(api, raw, key)
        if method == "GET" and path == "/_stats":
            return 200, self.stats(), {"request-id": "req_local_stats"}
        if method == "POST" and path == "/_control":
            return self._control(raw)
        return self._no_route(method, path)

    def _no_route(self, method: str, path: str) -> tuple[int, Any, dict[str, str]]:
        owner = next((a for a in _APIS if path.startswith(a.path)), None)
        if owner is None and path.startswith(("/chat/", "/responses")):
            # The OpenAI SDK joins its paths to the base URL, which ends in /v1.
            owner = _ROUTES[ResponsesApi.path]
            why = f"no route {method} {path}: the OpenAI base URL is {self.url}/v1"
        else:
            why = f"no route {method} {path}"
        owner = owner or _ROUTES[MessagesApi.path]
        return 404, owner.error(404, why), {owner.request_id_header: "req_local_404"}

    def _control(self, raw: bytes) -> tuple[int, Any, dict[str, str]]:
        data = _parse_json_object(raw)
        hdrs = {"request-id": "req_local_control"}
        messages = _ROUTES[MessagesApi.path]
        if data is None:
            return 400, messages.error(400, "body must be a JSON object"), hdrs
        unknown = set(data) - _CONTROL_FIELDS
        if unknown:
            return 400, messages.error(400, f"unknown control fields: {sorted(unknown)}"), hdrs
        try:
            self.control(**data)
        except (TypeError, ValueError) as exc:
            return 400, messages.error(400, str(exc)), hdrs
        with self._lock:
            state = {
                "fail_next": self._fail_next,
                "status": self._fail_next_status,
                "fail_every": self.fail_every,
                "fail_status": self.fail_status,
                "delay_ms": self.delay_ms,
                "token_ms": self.token_ms,
                "cut_after": self._cut_after,
                "cut_status": self._cut_status,
                "retry_after": self._fail_next_after,
            }
        return 200, state, hdrs

    def _serve(
        self, api: _Api, raw: bytes, key: str | None = None
    ) -> tuple[int, Any, dict[str, str]]:
        data = _parse_json_object(raw)
        with self._lock:
            counts = self._by_api[api.name]
            self._requests += 1
            counts["requests"] += 1
            n = self._requests
            # Counted and paced together: a test that sees the request counted and then
            # sets delay_ms again changes the later requests, never this one.
            delay_ms = self.delay_ms
            if data is not None:
                self._received.append((api.name, data))
                if data.get("stream") is True:
                    self._streamed += 1
                    counts["streamed"] += 1
            # The limit comes first, as the API's front end answers before anything else.
            limit = None
            if self.rpm or self.tpm:
                limit = self._take(api.prompt_tokens(data) if data is not None else 1)
            fail_status: int | None = None
            retry_after: float | None = None
            if limit is not None and limit.refused:
                self._rate_limited += 1
                counts["rate_limited"] += 1
            elif self._fail_next > 0:
                self._fail_next -= 1
                fail_status = self._fail_next_status
                retry_after = self._fail_next_after
            elif self.fail_every > 0 and n % self.fail_every == 0:
                fail_status = self.fail_status
            if fail_status is not None:
                self._failures += 1
                counts["failures"] += 1
        headers = api.limit_headers(limit) if limit is not None else {}
        headers[api.request_id_header] = f"req_local_{n}"
        if limit is not None and limit.refused:
            body, extra = api.rate_limited(limit)
            return 429, body, headers | extra
        self._sleep(delay_ms)
        if fail_status is not None:
            if fail_status == 429:
                headers |= api.injected_429_headers()
            if retry_after is not None:
                headers |= {
                    "retry-after": f"{retry_after:g}",
                    "retry-after-ms": str(int(retry_after * 1000)),
                }
            return fail_status, api.error(fail_status, _FAIL_MESSAGES[fail_status]), headers

        problem = api.check(data)
        if problem is not None:
            param, message = problem
            return 400, api.error(400, message, param=param), headers
        assert data is not None
        with self._lock:
            self._served += 1
            no = self._served
        answer = api.answer(data, no)
        with self._lock:
            self._billed.setdefault(
                key or f"request {n}", (answer.get("model"), answer.get("usage"))
            )
        if not data.get("stream"):
            return 200, answer, headers
        with self._lock:
            # A cut is for the next stream actually answered, not one failed above.
            cut_after, self._cut_after = self._cut_after, None
            cut_status, self._cut_status = self._cut_status, None
            if cut_after is not None:
                self._failures += 1
                counts["failures"] += 1
            token_ms = self.token_ms
        m = _TOKEN_MS_LINE.search(api.directives(data))
        if m:
            token_ms = int(m.group(1))
        cut = None
        if cut_status is not None:
            cut = functools.partial(api.cut_event, cut_status, _FAIL_MESSAGES[cut_status])
        events = _paced(api.events(answer, data), token_ms=token_ms, cut_after=cut_after, cut=cut)
        return 200, _EventStream(events), headers

    def _take(self, tokens: int) -> _Limit:
        """Take a request and its prompt tokens from the buckets (under the lock)."""
        now = time.time()
        elapsed, self._bucket_at = now - self._bucket_at, now
        per_s, tokens_per_s = self.rpm / 60, self.tpm / 60
        if self.rpm:
            self._bucket = min(self.burst, self._bucket + elapsed * per_s)
        if self.tpm:
            self._tokens = min(self.tpm, self._tokens + elapsed * tokens_per_s)
        refused: str | None = None
        retry_after = 0.0
        if self.rpm and self._bucket < 1:
            refused, retry_after = "requests", (1 - self._bucket) / per_s
        elif self.tpm and self._tokens < min(tokens, self.tpm):
            # A prompt larger than the whole budget waits for a full bucket, not forever.
            refused, retry_after = "tokens", (min(tokens, self.tpm) - self._tokens) / tokens_per_s
        else:
            self._bucket -= 1 if self.rpm else 0
            self._tokens -= tokens if self.tpm else 0
            self._tokens = max(self._tokens, 0.0)
        return _Limit(
            refused=refused,
            requests=self.rpm,
            requests_left=self._bucket,
            requests_full_s=(self.burst - self._bucket) / per_s if self.rpm else 0.0,
            tokens=self.tpm,
            tokens_left=self._tokens,
            tokens_full_s=(self.tpm - self._tokens) / tokens_per_s if self.tpm else 0.0,
            retry_after_s=retry_after,
        )
