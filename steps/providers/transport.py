"""The HTTP transport both SDKs send through (each takes an httpx2 transport): every model
request cairn makes, a retry too, passes its handle_request, where the step's lease is
checked right before the request goes out (cairn.steps.context.fence)."""

from __future__ import annotations

import importlib
import itertools
import os
import socket
import threading
from typing import Any

from cairn.steps.context import fence

POOLS = 64

# The headers of the last answer the spread transport had in this thread: how a plain
# create() (the SDKs' raw-response wrapper costs ~0.25 ms a call) still tells the rate
# limiter what the provider said.
_answer = threading.local()


def answered_headers() -> Any:
    """The headers of the answer this thread's last request through the spread transport
    got, once (None: none since the last ask)."""
    headers = getattr(_answer, "headers", None)
    _answer.headers = None
    return headers


# TCP keepalive as the SDKs' default transport sets it: a long model call on an idle
# connection is not dropped by a NAT or load balancer on the way.
_KEEPALIVE = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)] + [
    (socket.IPPROTO_TCP, getattr(socket, name), value)
    for name, value in (("TCP_KEEPINTVL", 60), ("TCP_KEEPCNT", 5))
    if hasattr(socket, name)
]


def spread_transport() -> Any:
    """The SDK's HTTP transport as POOLS connection pools, each thread keeping to one.

    httpcore's pool looks at every connection it holds for every request and response,
    so with hundreds of runs calling the model at once in one process (the threads pool)
    one shared pool cost more CPU than the rest of the step: about 6.7 CPU ms a call at
    500 threads, against 0.85 ms for one thread. A pool per thread would make a TLS
    context each; POOLS pools bound the scan at about concurrency / POOLS connections.
    """
    import httpx2  # the SDKs' own HTTP package: their DefaultHttpxClient takes its transports

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
            # Every request either SDK sends passes here, each retry too, right before it
            # goes out: the one place the lease is checked for all of them (context.fence).
            fence()
            response = self._pool().handle_request(request)
            _answer.headers = response.headers
            return response

        def close(self) -> None:
            for pool in self._pools:
                if pool is not None:
                    pool.close()

    return Spread()


async def _afenced(request: Any) -> None:
    fence()


def _fenced(request: Any) -> None:
    fence()


def fence_requests(client: Any) -> bool:
    """Check the step's lease right before each request of an SDK client cairn did not
    make (an agent framework's own, cairn.pydantic_ai), as the spread transport checks
    cairn's: a request hook on the client's httpx2 client, which runs for every try the
    SDK's own retry loop sends, after its back-off. client: anthropic's or openai's client
    (its HTTP client is its `_client`, as pydantic-ai's with_max_retries reads it too), or
    an httpx2 client. Once per HTTP client. False for one it cannot hook (another SDK's):
    its requests keep the checks made before the call only."""
    import httpx2

    http = client if isinstance(client, httpx2.Client | httpx2.AsyncClient) else None
    http = http or getattr(client, "_client", None)
    if isinstance(http, httpx2.AsyncClient):
        hook: Any = _afenced
    elif isinstance(http, httpx2.Client):
        hook = _fenced
    else:
        return False
    hooks = http.event_hooks
    if hook not in hooks["request"]:
        http.event_hooks = {**hooks, "request": [*hooks["request"], hook]}
    return True


class SdkClient:
    """A provider's SDK client, made at its first call from the key and address given or
    in the environment, with the SDK's own retries off (one retry policy, ModelClient's,
    which the task can see) and the spread transport; what both providers share."""

    sdk = ""  # the SDK's module, imported at the first call: a worker that never calls a
    # provider never loads its SDK
    title = ""  # the provider as its error messages name it
    client_class = ""

    def __init__(
        self, *, api_key: str | None = None, base_url: str | None = None, timeout: float = 120.0
    ) -> None:
        self._key, self._url, self._timeout = api_key, base_url, timeout
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The SDK's client, made at the first call."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make()
        return self._client

    def _make(self) -> Any:
        from cairn.steps.providers import ModelNotConfigured

        key_var, url_var = f"{self.sdk.upper()}_API_KEY", f"{self.sdk.upper()}_BASE_URL"
        key = self._key or os.environ.get(key_var)
        url = self._url or os.environ.get(url_var) or None  # "" is unset
        if not key and not url:
            raise ModelNotConfigured(
                f"an {self.title} model call needs {key_var} (or {url_var} for a stand-in) "
                "in the worker's environment"
            )
        sdk = importlib.import_module(self.sdk)
        return getattr(sdk, self.client_class)(
            api_key=key or "local-stand-in",  # a stand-in at `url` takes any key
            base_url=url,
            max_retries=0,
            timeout=self._timeout,
            http_client=sdk.DefaultHttpxClient(transport=spread_transport()),
        )

    @property
    def api_key(self) -> str:
        return str(self.client.api_key or "")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
