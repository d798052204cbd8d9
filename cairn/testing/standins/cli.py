"""``python -m cairn.testing.standins`` and ``cairn standin``: one stand-in in the
foreground until SIGINT or SIGTERM, its URL the first line on stdout."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from cairn.testing.standins.mail import MailServer
from cairn.testing.standins.model import ModelServer
from cairn.testing.standins.server import _StandIn


def main(argv: list[str] | None = None) -> int:
    """Run one stand-in in the foreground until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m cairn.testing.standins", description="Run a cairn loopback stand-in."
    )
    sub = parser.add_subparsers(dest="which", required=True)
    for which in ("mail", "model"):
        p = sub.add_parser(which, help=f"run the {which} stand-in")
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, default=0, help="0 picks a free port")
        p.add_argument("--delay-ms", type=int, default=0)
        p.add_argument("--quiet", action="store_true", help="don't log requests to stderr")
        if which == "model":
            p.add_argument(
                "--token-ms", type=int, default=0, help="sleep between streamed text deltas"
            )
            p.add_argument("--fail-every", type=int, default=0)
            p.add_argument("--fail-status", type=int, default=429, choices=[429, 500, 503, 529])
            p.add_argument("--rpm", type=int, default=0, help="requests a minute (0: no limit)")
            p.add_argument("--burst", type=int, default=None, help="rpm bucket (default: rpm)")
            p.add_argument(
                "--tpm", type=int, default=0, help="prompt tokens a minute (0: no limit)"
            )
    args = parser.parse_args(argv)

    server: _StandIn
    if args.which == "mail":
        server = MailServer(args.host, args.port, delay_ms=args.delay_ms, verbose=not args.quiet)
    else:
        server = ModelServer(
            args.host,
            args.port,
            delay_ms=args.delay_ms,
            token_ms=args.token_ms,
            fail_every=args.fail_every,
            fail_status=args.fail_status,
            rpm=args.rpm,
            burst=args.burst,
            tpm=args.tpm,
            verbose=not args.quiet,
        )

    stop = threading.Event()
    # SIGTERM (docker stop, kill) should close the socket as cleanly as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.start()
    print(server.url, flush=True)
    if isinstance(server, ModelServer):
        # For a person reading along; a script reads the URL on stdout.
        print(
            f"Messages API: ANTHROPIC_BASE_URL={server.url}  "
            f"Chat Completions, Responses: OPENAI_BASE_URL={server.openai_url}",
            file=sys.stderr,
            flush=True,
        )
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
