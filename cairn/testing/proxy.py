"""A TCP proxy in front of Postgres that loses a commit's reply on purpose.

    proxy = CutProxy("127.0.0.1", 54329).start()
    store = PgStore(Database(proxy.url(database_url), prepare=False))
    proxy.arm(b"INSERT INTO journal")    # the next statement holding these bytes...
    store.record_call(...)               # ...runs and commits; its reply never arrives

Armed with a pattern, it forwards the client's message that holds it, waits for the
server's ReadyForQuery (sent after an autocommit statement has committed), and drops both
connections without passing the reply on: the COMMIT reached Postgres, then the link
went. The client sees a dropped connection and retries, which is the case every "same
writer again" path exists for; without the proxy it happens only by chance. Use it with
prepare=False, so every statement's text crosses the wire.
"""

from __future__ import annotations

import socket
import threading
from typing import Self
from urllib.parse import urlsplit, urlunsplit

READY = b"Z\x00\x00\x00\x05"  # ReadyForQuery: the server is done with the statement


class CutProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._armed: list[bytes] = []
        self.cuts = 0  # replies lost so far
        self._closed = False

    def url(self, database_url: str) -> str:
        """database_url, pointed at this proxy."""
        parts = urlsplit(database_url)
        auth = parts.netloc.rpartition("@")[0]
        netloc = (auth + "@" if auth else "") + f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def arm(self, pattern: bytes) -> None:
        """Lose the reply of the next statement whose message holds pattern."""
        with self._lock:
            self._armed.append(pattern)

    def start(self) -> Self:
        threading.Thread(target=self._accept, daemon=True, name="cut-proxy").start()
        return self

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            cut = threading.Event()  # set: the server's next ReadyForQuery is not passed on
            threading.Thread(target=self._up, args=(client, server, cut), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, cut), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, cut: threading.Event) -> None:
        """Client to server: forward, and arm the cut when a message holds the pattern."""
        try:
            while data := client.recv(65536):
                with self._lock:
                    hit = next((p for p in self._armed if p in data), None)
                    if hit is not None:
                        self._armed.remove(hit)
                        cut.set()
                server.sendall(data)
        except OSError:
            pass
        finally:
            _close(client, server)

    def _down(self, server: socket.socket, client: socket.socket, cut: threading.Event) -> None:
        """Server to client: forward, unless the cut is armed; then swallow up to the
        statement's ReadyForQuery (it has committed) and drop both ends."""
        held = b""
        try:
            while data := server.recv(65536):
                if not cut.is_set():
                    client.sendall(data)
                    continue
                held += data
                if READY in held:
                    with self._lock:
                        self.cuts += 1
                    break
        except OSError:
            pass
        finally:
            _close(client, server)


def _close(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
