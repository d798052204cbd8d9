"""Payloads encrypted at rest: run input, state, window messages, journaled results and
errors, effect results, signal, steer and approval payloads, session items, schedule
inputs, event data, and the texts of errors and cancel reasons are sealed (AES-256-GCM,
from `cryptography`) before they reach Postgres or Redis, when CAIRN_PAYLOAD_KEYS holds a
key.

Every payload is written through dump() and read through load(), psycopg's way (every
value passes one Dumper.dump): the store's jsonb parameters call dump (store/payloads.py),
its connections' json loader calls load_text, the event stream calls both for an event's
data. dump gives the sealed form, a JSON object of one member,
{"cairn.sealed": "v1.<key id>.<base64>"}, which fits the jsonb columns and the stream
entries as they are; without a key the value itself. load opens what dump sealed, found
by that name wherever SQL put it (a window's messages aggregated, a signal in a claim).

The envelope cannot be forged: a user's object whose only member is "cairn.sealed" (at
any depth) is escaped by dump, with a key or without, as {"cairn.sealed": [<its value>]},
and load gives it back as it was; inside a sealed value nothing is opened. A check for
the name in the raw bytes comes first, so a value without it costs one search more.

The key ring is a list: the first key seals, every key opens, so keys rotate (`cairn db
rotate-key` seals again under the first). A value sealed under a key the ring lacks
raises KeyMissing, an Interrupted: a worker hands the run back to one that has the key.

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

from cairn.core.errors import CairnError, Interrupted

SEALED = "cairn.sealed"
MARK = b'"cairn.sealed"'
_VERSION = "v1"
_KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_CLEAR = json.JSONEncoder(separators=(",", ":"))


class PayloadKeyError(CairnError, ValueError):
    """A sealed payload that does not open (altered, or sealed under another key of the
    same id, or of an unknown form), or a malformed key ring; KeyMissing: its key id is
    not in the ring."""


class KeyMissing(PayloadKeyError, Interrupted):
    """A payload is sealed under a key id CAIRN_PAYLOAD_KEYS lacks. To a worker, an
    Interrupted: the delivery ends and the run goes back to the queue, for a worker that
    has the key (a key deploy under way), never failed. key_id: the id it lacks."""

    def __init__(self, message: str, key_id: str) -> None:
        super().__init__(message)
        self.key_id = key_id

    def __reduce__(self) -> tuple[Any, ...]:  # pickled across Celery's pool
        return (type(self), (str(self), self.key_id))


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

    @property
    def ids(self) -> tuple[str, ...]:
        """The key ids this ring opens, the sealing one first."""
        return tuple(self._keys)

    def seal(self, value: Any) -> Any:
        """value as a sealed object under the first key (nothing in it is opened again);
        value itself without keys. Through dump() only: dump escapes first."""
        if self.sealing is None:
            return value
        nonce = os.urandom(12)
        aead = self._keys[self.sealing]
        box = aead.encrypt(nonce, _JSON.encode(value).encode(), self.sealing.encode())
        token = base64.urlsafe_b64encode(nonce + box).decode()
        return {SEALED: f"{_VERSION}.{self.sealing}.{token}"}

    def open(self, token: str) -> Any:
        """The value a sealed object's token holds."""
        version, _, rest = token.partition(".")
        kid, _, body = rest.partition(".")
        if version != _VERSION or not kid:
            raise PayloadKeyError(f"a sealed payload of an unknown form ({version!r})")
        aead = self._keys.get(kid)
        if aead is None:
            raise KeyMissing(
                f"a payload is sealed under key {kid!r}, which CAIRN_PAYLOAD_KEYS does not "
                "hold: set it to the key ring the data was written with (its ids: "
                f"{', '.join(self._keys) or 'none set'})",
                kid,
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

    def dump(self, value: Any) -> Any:
        """value as it is stored: sealed under the first key, or without keys the value
        with its envelope-shaped objects escaped."""
        return self.seal(value) if self.sealing is not None else escape(value)

    def load(self, value: Any) -> Any:
        """A stored value (or one SQL built of stored values) as dump was given it."""
        if isinstance(value, dict):
            if len(value) == 1 and SEALED in value:
                token = value[SEALED]
                if isinstance(token, str):
                    return self.open(token)
                if isinstance(token, list) and len(token) == 1:  # a user's, escaped
                    return {SEALED: self.load(token[0])}
                raise PayloadKeyError(f"a sealed payload of an unknown form ({token!r:.40})")
            return {k: self.load(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.load(v) for v in value]
        return value


def escape(value: Any) -> Any:
    """value with every object whose only member is "cairn.sealed" (the envelope's shape)
    made {"cairn.sealed": [<its value>]}: load() gives it back, never opens it. The
    common case (no such name in it) is one search of its JSON."""
    if MARK.decode() not in _CLEAR.encode(value):
        return value
    return _escaped(value)


def _escaped(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and SEALED in value:
            return {SEALED: [_escaped(value[SEALED])]}
        return {k: _escaped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escaped(v) for v in value]
    return value


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


def dump(value: Any) -> Any:
    """value as stored (sealed, or escaped without keys): the one way a payload is
    written (store/payloads.py; event data)."""
    return ring().dump(value)


def dumps(value: Any) -> str:
    """dump(value) as JSON text, value encoded once: the store's jsonb parameters."""
    keys = ring()
    if keys.sealing is not None:
        return _JSON.encode(keys.seal(value))
    return clear_dumps(value)


def clear_dumps(value: Any) -> str:
    """escape(value) as JSON text, value encoded once: JSON cairn's SQL reads, never
    sealed. (NaN passes, as json.dumps lets it: Postgres refuses it in its own words.)"""
    text = _CLEAR.encode(value)
    return text if MARK.decode() not in text else _CLEAR.encode(_escaped(value))


def load(value: Any) -> Any:
    """A stored value as it was given to dump (opened, unescaped)."""
    return ring().load(value) if is_sealed(_CLEAR.encode(value)) else value


def open_text(raw: bytes | str) -> Any:
    """JSON text parsed, its sealed objects opened: unsealed text costs one search more."""
    value = json.loads(raw)
    return ring().load(value) if is_sealed(raw) else value


def is_sealed(raw: bytes | str) -> bool:
    """Whether the JSON text may hold a sealed or escaped object (the name is in it)."""
    return (MARK in raw) if isinstance(raw, bytes) else (MARK.decode() in raw)
