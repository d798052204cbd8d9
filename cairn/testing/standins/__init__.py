"""Loopback stand-ins for the outside services cairn talks to (mail API, Anthropic API).

The machines that run the demo and the tests have no internet, so these two small
stdlib HTTP servers play the outside world:

* ``MailServer`` -- a transactional-mail API that records every request and dedupes on
  the ``Idempotency-Key`` header, so a test can count both *attempts* (what the worker
  tried) and *deliveries* (what a user would have received).
* ``ModelServer`` -- enough of the Anthropic Messages API for the real ``anthropic`` SDK
  (``anthropic.Anthropic(api_key="local", base_url=server.url)``) to work, with
  deterministic replies, streaming, and injectable 429/529/500 failures.

Each: ``__init__(host="127.0.0.1", port=0, **options)``, ``.start()`` (daemon thread,
returns self), ``.stop()``, ``.url``, ``.stats()``, context manager.  From a shell::

    python -m cairn.testing.standins mail  --port 8025 [--delay-ms D]
    python -m cairn.testing.standins model --port 8026 [--delay-ms D] [--token-ms T]
                                           [--fail-every N --fail-status 429]

The first stdout line is the URL (flushed), so a script can wait for it.

The package: server (the HTTP server and lifecycle every stand-in shares), mail
(MailServer), anthropic (ModelServer: the Messages API, streaming, rate limit, injected
failures; the SDK's reactions to them are written down there), replies (what a stand-in
model answers, whatever API it speaks), cli (main, for ``python -m`` and ``cairn standin``).
"""

from __future__ import annotations

from cairn.testing.standins.anthropic import ModelServer
from cairn.testing.standins.cli import main
from cairn.testing.standins.mail import MailServer
from cairn.testing.standins.replies import reply_for

__all__ = ["MailServer", "ModelServer", "main", "reply_for"]
