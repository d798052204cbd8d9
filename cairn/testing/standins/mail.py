"""MailServer: a transactional-mail API that records every request and dedupes on the
``Idempotency-Key`` header, so a test can count both attempts (what the worker tried) and
deliveries (what a user would have received)."""

from __future__ import annotations

from typing import Any

from cairn.testing.standins.server import _parse_json_object, _StandIn


class MailServer(_StandIn):
    """Mail API stand-in: counts attempts, deliveries and duplicate deliveries per ``ref``.

    ``delay_ms`` sleeps *after* the delivery is recorded and before the answer is sent:
    that is the interesting crash window (the email went out, the sender never heard),
    which only an idempotency key can make safe on retry.
    """

    name = "mail"

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, delay_ms: int = 0, verbose: bool = False
    ) -> None:
        super().__init__(host, port, delay_ms=delay_ms, verbose=verbose)
        self._reset_state()

    def _reset_state(self) -> None:
        self._attempts = 0
        self._deduplicated = 0
        self._keys: dict[str, str] = {}  # Idempotency-Key -> message id
        self._messages: list[dict[str, Any]] = []
        self._by_ref: dict[str, int] = {}

    def stats(self) -> dict[str, Any]:
        """Same dict as ``GET /v1/stats``."""
        with self._lock:
            by_ref = dict(self._by_ref)
            return {
                "attempts": self._attempts,
                "deliveries": len(self._messages),
                "deduplicated": self._deduplicated,
                "duplicate_deliveries": sum(max(0, n - 1) for n in by_ref.values()),
                "by_ref": by_ref,
            }

    def messages(self) -> list[dict[str, Any]]:
        """Delivered messages in order (id, to, subject, body, ref, idempotency_key)."""
        with self._lock:
            return [dict(m) for m in self._messages]

    def reset(self) -> None:
        """Forget everything (same as ``POST /v1/reset``)."""
        with self._lock:
            self._reset_state()

    def _handle(
        self, method: str, path: str, headers: dict[str, str], raw: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        if method == "POST" and path == "/v1/send":
            return self._send(headers, raw)
        if method == "GET" and path == "/v1/stats":
            return 200, self.stats(), {}
        if method == "POST" and path == "/v1/reset":
            self.reset()
            return 200, {"ok": True}, {}
        return 404, _mail_error("not_found", f"no route {method} {path}"), {}

    def _send(self, headers: dict[str, str], raw: bytes) -> tuple[int, Any, dict[str, str]]:
        # Header names arrive as sent; match case-insensitively like any HTTP server.
        key = next((v for k, v in headers.items() if k.lower() == "idempotency-key"), "")
        key = key.strip()
        data = _parse_json_object(raw)
        with self._lock:
            self._attempts += 1  # every POST counts, even a rejected one
            if data is None:
                return 400, _mail_error("invalid_request", "body must be a JSON object"), {}
            to = data.get("to")
            if not isinstance(to, str) or not to:
                return 400, _mail_error("invalid_request", "'to' is required"), {}
            # Check-and-record under one lock so concurrent retries with one key deliver once.
            if key and key in self._keys:
                self._deduplicated += 1
                result = {"id": self._keys[key], "deduplicated": True}
            else:
                msg_id = f"msg_{len(self._messages) + 1}"
                ref = data.get("ref")
                self._messages.append(
                    {
                        "id": msg_id,
                        "to": to,
                        "subject": data.get("subject"),
                        "body": data.get("body"),
                        "ref": ref,
                        "idempotency_key": key or None,
                    }
                )
                # A message without a ref is delivered but not part of duplicate counting.
                if isinstance(ref, str) and ref:
                    self._by_ref[ref] = self._by_ref.get(ref, 0) + 1
                if key:
                    self._keys[key] = msg_id
                result = {"id": msg_id, "deduplicated": False}
        self._sleep()
        return 200, result, {}


def _mail_error(kind: str, message: str) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message}}
