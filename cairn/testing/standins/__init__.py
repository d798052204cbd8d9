"""Loopback stand-ins for the outside services cairn talks to (mail API, model APIs).

The machines that run the demo and the tests have no internet, so these two small
stdlib HTTP servers play the outside world:

* ``MailServer`` -- a transactional-mail API that records every request and dedupes on
  the ``Idempotency-Key`` header, so a test can count both *attempts* (what the worker
  tried) and *deliveries* (what a user would have received).
* ``ModelServer`` -- on one port, enough of the Anthropic Messages API and of OpenAI's
  Chat Completions and Responses APIs for the real SDKs to work
  (``anthropic.Anthropic(api_key="local", base_url=server.url)``,
  ``openai.OpenAI(api_key="local", base_url=server.openai_url)``), with deterministic
  replies, streaming, tool calls, a rate limit and injectable 429/5xx failures.

Each: ``__init__(host="127.0.0.1", port=0, **options)``, ``.start()`` (daemon thread,
returns self), ``.stop()``, ``.url``, ``.stats()``, context manager.  From a shell::

    python -m cairn.testing.standins mail  --port 8025 [--delay-ms D]
    python -m cairn.testing.standins model --port 8026 [--delay-ms D] [--token-ms T]
                                           [--fail-every N --fail-status 429]
                                           [--rpm R [--burst B]] [--tpm T]

The first stdout line is the URL (flushed), so a script can wait for it; the OpenAI
SDK's base URL is that URL + ``/v1``.

The package: server (the HTTP server and lifecycle every stand-in shares), mail
(MailServer), model (ModelServer: routes, counts, rate limit, injected failures, pacing
and cuts, the same for every API), api (what an API the model speaks provides), anthropic
(the Messages API's wire format), openai (Chat Completions' and Responses'; the SDKs'
reactions to the failures are written down in these two), replies (what a stand-in model
answers, whatever API it speaks), cli (main, for ``python -m`` and ``cairn standin``).
"""

from __future__ import annotations

from cairn.testing.standins.cli import main
from cairn.testing.standins.mail import MailServer
from cairn.testing.standins.model import ModelServer
from cairn.testing.standins.replies import reply_for

__all__ = ["MailServer", "ModelServer", "main", "reply_for"]
