"""Payloads encrypted at rest: run input, state, window messages, journaled results, effect
results, signal and steer payloads, and event data are sealed (AES-256-GCM, from
`cryptography`) before they reach Postgres or Redis, when CAIRN_PAYLOAD_KEYS holds a key.

A sealed value is a JSON object of one member, {"cairn.sealed": "v1.<key id>.<base64>"},
so it fits the jsonb columns and the stream entries as they are, and reading code finds
it by that name: the store's connections open every sealed value they load (a check for
the name in the raw bytes first, so an unsealed payload costs nothing more), and the
event readers open event data. The key ring is a list: the first key seals, every key
opens, so keys rotate (`cairn db rotate-key` seals again under the first).

CAIRN_PAYLOAD_KEYS: comma-separated `<id>:<key>`, the key 32 bytes in urlsafe base64
(`cairn db new-key` prints one); the id names the key in each value it sealed.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import threading
from typing import Any

from cairn.core.errors import CairnError

SEALED = "cairn.sealed"
MARK = b'"cairn.sealed"'
_VERSION = "v1"
_KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


class PayloadKeyError(CairnError, ValueError):
    """A sealed payload whose key CAIRN_PAYLOAD_KEYS lacks, a value that does not open
    (altered, or sealed under another key of the same id), or a malformed key ring."""


def new_key() -> str:
    """A fresh key, as CAIRN_PAYLOAD_KEYS wants it after `<id>:`."""
    return base64.urlsafe_b64encode(os.urandom(32)).decode()


class KeyRing:
    """The keys payloads are sealed and opened with: the first seals, all open."""

    def __init__(self, spec: str | None) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._keys: dict[str, AESGCM] = {}
        self.sealing: str | None = None
        for part in (spec or "").split(","):
            part = part.strip()
            if not part:
                continue
            kid, sep, key = part.partition(":")
            if not sep or not _KEY_ID.fullmatch(kid):
                raise PayloadKeyError(
                    "CAIRN_PAYLOAD_KEYS: want comma-separated <id>:<key> (id: letters, digits, "
                    "_ or -; key: 32 bytes, urlsafe base64, as `cairn db new-key` prints)"
                )
            try:
                raw = base64.urlsafe_b64decode(key.encode())
            except (binascii.Error, ValueError):
                raw = b""
            if len(raw) != 32:
                raise PayloadKeyError(
                    f"CAIRN_PAYLOAD_KEYS: key {kid!r} is not 32 bytes of urlsafe base64 "
                    "(`cairn db new-key` prints one)"
                )
            if kid in self._keys:
                raise PayloadKeyError(f"CAIRN_PAYLOAD_KEYS: key id {kid!r} appears twice")
            self._keys[kid] = AESGCM(raw)
            self.sealing = self.sealing or kid

    def __bool__(self) -> bool:
        return self.sealing is not None

    def __repr__(self) -> str:  # never the keys
        return f"KeyRing(ids={list(self._keys)})"

    def seal(self, value: Any) -> Any:
        """value as a sealed object under the first key; value itself without keys."""
        if self.sealing is None:
            return value
        nonce = os.urandom(12)
        aead = self._keys[self.sealing]
        box = aead.encrypt(nonce, _JSON.encode(value).encode(), self.sealing.encode())
        token = base64.urlsafe_b64encode(nonce + box).decode()
        return {SEALED: f"{_VERSION}.{self.sealing}.{token}"}

    def open(self, value: Any) -> Any:
        """value with every sealed object in it opened (the first level that is one)."""
        if isinstance(value, dict):
            if len(value) == 1 and SEALED in value:
                return self._open_one(value[SEALED])
            return {k: self.open(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.open(v) for v in value]
        return value

    def _open_one(self, token: Any) -> Any:
        version, _, rest = str(token).partition(".")
        kid, _, body = rest.partition(".")
        if version != _VERSION or not kid:
            raise PayloadKeyError(f"a sealed payload of an unknown form ({version!r})")
        aead = self._keys.get(kid)
        if aead is None:
            raise PayloadKeyError(
                f"a payload is sealed under key {kid!r}, which CAIRN_PAYLOAD_KEYS does not "
                "hold: set it to the key ring the data was written with (its ids: "
                f"{', '.join(self._keys) or 'none set'})"
            )
        from cryptography.exceptions import InvalidTag

        try:
            raw = base64.urlsafe_b64decode(body.encode())
            plain = aead.decrypt(raw[:12], raw[12:], kid.encode())
        except (InvalidTag, binascii.Error, ValueError):
            raise PayloadKeyError(
                f"a payload sealed under key {kid!r} does not open: altered, or sealed "
                "with another key of that id"
            ) from None
        return json.loads(plain)


_ring: KeyRing | None = None
_lock = threading.Lock()


def ring() -> KeyRing:
    """This process's key ring, from CAIRN_PAYLOAD_KEYS (read once)."""
    global _ring
    if _ring is None:
        with _lock:
            if _ring is None:
                _ring = KeyRing(os.environ.get("CAIRN_PAYLOAD_KEYS"))
    return _ring


def use(keys: KeyRing | None) -> None:
    """Set this process's key ring (tests; None: read CAIRN_PAYLOAD_KEYS again)."""
    global _ring
    with _lock:
        _ring = keys


def seal(value: Any) -> Any:
    return ring().seal(value)


def open_text(raw: bytes | str) -> Any:
    """JSON text parsed, its sealed objects opened: unsealed text costs one search more."""
    value = json.loads(raw)
    return ring().open(value) if is_sealed(raw) else value


def is_sealed(raw: bytes | str) -> bool:
    return (MARK in raw) if isinstance(raw, bytes) else (MARK.decode() in raw)
