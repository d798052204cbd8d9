"""What every stand-in shares: a threading HTTP server on loopback that reads the whole
request, hands it to the stand-in's ``_handle`` and writes its answer (JSON, or a chunked
event stream), and the lifecycle (start, stop, url, a context manager)."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class _Cut(Exception):
    """Raised by a streamed answer's events to drop the connection mid-answer."""


@dataclass(frozen=True)
class _EventStream:
    """A streamed answer: SSE events, each written as one chunk as soon as it is made."""

    events: Iterator[bytes]


class _Handler(BaseHTTPRequestHandler):
    """Reads the whole request, hands it to the owning stand-in, writes its answer."""

    # HTTP/1.1 so the SDK's connection pool can keep connections alive; every answer
    # carries Content-Length or is chunked, and the body is always read so the stream
    # stays in sync.
    protocol_version = "HTTP/1.1"
    # Idle keep-alive connections must not pin a thread forever.
    timeout = 60
    server_version = "cairn-standin/1"

    def setup(self) -> None:
        super().setup()
        # Headers and body go out as separate writes; without TCP_NODELAY, Nagle plus the
        # client's delayed ACK adds ~40 ms to every request on loopback.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _dispatch(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        standin: _StandIn = self.server.standin  # type: ignore[attr-defined]
        status, payload, headers = standin._handle(
            self.command, self.path.split("?", 1)[0], dict(self.headers.items()), raw
        )
        if isinstance(payload, _EventStream):
            self._write_events(status, payload.events, headers)
            return
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _write_events(self, status: int, events: Iterator[bytes], headers: dict[str, str]) -> None:
        # Chunked: the length is unknown until the answer ends, and unlike marking the end
        # by closing, chunks leave the connection in the client's pool for the next call.
        self.send_response(status)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        try:
            for event in events:
                # One write per event (wfile is unbuffered, TCP_NODELAY is on): the client
                # reads each token as it is made, not when the answer ends.
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        except _Cut:
            # No closing chunk: the client sees the body end early, as when a proxy drops it.
            self.close_connection = True
            return
        self.wfile.write(b"0\r\n\r\n")

    do_GET = do_POST = do_PUT = do_DELETE = _dispatch

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.standin.verbose:  # type: ignore[attr-defined]
            super().log_message(format, *args)


class _Server(ThreadingHTTPServer):
    """ThreadingHTTPServer that stays quiet when a client hangs up mid-answer."""

    daemon_threads = True
    # A fleet of runs calls at once: the default backlog of 5 would make clients wait
    # for SYN retries, a second each, that no real API imposes.
    request_queue_size = 1024

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that time out or get killed mid-request are the point of delay_ms;
        # a traceback per dropped connection would only be noise.
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class _StandIn:
    """Thread and lifecycle plumbing shared by every stand-in."""

    name = "standin"

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, delay_ms: int = 0, verbose: bool = False
    ) -> None:
        self.host = host
        self.port = port
        # Plain attribute, read on every request, so a test may change it while running.
        self.delay_ms = delay_ms
        self.verbose = verbose
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> Self:
        """Bind and serve in a daemon thread; returns self."""
        if self._httpd is not None:
            return self
        httpd = _Server((self.host, self.port), _Handler)
        httpd.standin = self  # type: ignore[attr-defined]
        # Remember the port so a stop()/start() cycle (simulated outage) comes back on
        # the same URL even when port=0 picked an ephemeral one.
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"{self.name}-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket (state is kept)."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321`` (only once started)."""
        if self._httpd is None:
            raise RuntimeError(f"{type(self).__name__} is not running; call start() first")
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _sleep(self, delay_ms: int | None = None) -> None:
        """delay_ms: the delay as it was when the request came (default: as it is now)."""
        delay_ms = self.delay_ms if delay_ms is None else delay_ms
        if delay_ms > 0:
            time.sleep(delay_ms / 1000)

    def _handle(
        self, method: str, path: str, headers: dict[str, str], raw: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        raise NotImplementedError


def _parse_json_object(raw: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None if it is not one."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None
