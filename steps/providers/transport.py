"""The HTTP transport both SDKs send through (each takes an httpx2 transport)."""

from __future__ import annotations

import itertools
import socket
import threading
from typing import Any

POOLS = 64

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
            return self._pool().handle_request(request)

        def close(self) -> None:
            for pool in self._pools:
                if pool is not None:
                    pool.close()

    return Spread()
