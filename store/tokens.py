"""API tokens (`cairn tokens create`): a tenant's, or an admin's, each shown once and kept
only as the SHA-256 of its secret (a stolen table opens nothing).

A token reads `cairn_<id>_<secret>`: the id finds its row, and the secret's hash is
compared in constant time, so a wrong token costs what a right one does. An id that is
not one this module makes (NUL, any other byte, a megabyte) is no token, never a query.

The pages' sessions (PageSessions) live beside them: a login's random cookie value, kept
as its SHA-256 only, ended by logging out and by revoking the token it came from.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import hmac
import re
import secrets
from typing import Any

from cairn.store.db import Database

PREFIX = "cairn_"
ID = re.compile(r"[0-9a-f]{12}")  # secrets.token_hex(6), as create makes them
SESSION = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ApiToken:
    """A token as listed: never its secret nor its hash."""

    id: str
    name: str
    tenant: str | None  # the tenant it acts for; None: an admin's, which sees all
    admin: bool
    created_at: dt.datetime
    revoked_at: dt.datetime | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ApiToken:
        return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls)})

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in ("created_at", "revoked_at"):
            out[key] = out[key].isoformat() if out[key] is not None else None
        return out


def _hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def parse(token: str) -> tuple[str, str] | None:
    """(id, secret) of a token this module made, else None."""
    if not token.startswith(PREFIX):
        return None
    token_id, _, secret = token[len(PREFIX) :].partition("_")
    return (token_id, secret) if ID.fullmatch(token_id) and secret else None


class Tokens:
    """The api_tokens table (migration 0021)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def create(
        self, tenant: str | None, name: str = "", admin: bool = False
    ) -> tuple[ApiToken, str]:
        """A new token: (its record, the token itself, which is shown this once)."""
        token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
        params = {
            "id": token_id,
            "name": name,
            "tenant": None if admin else tenant,
            "admin": admin,
            "hash": _hash(secret),
        }
        row = self.db.one("token_create", params)
        assert row is not None
        return ApiToken.from_row(row), f"{PREFIX}{token_id}_{secret}"

    def check(self, token: str) -> ApiToken | None:
        """The live token this is, or None (unknown, wrong or revoked)."""
        parts = parse(token)
        if parts is None:
            return None
        row = self.db.one("token_get", {"id": parts[0]})
        if row is None or not hmac.compare_digest(bytes(row["hash"]), _hash(parts[1])):
            return None
        return ApiToken.from_row(row) if row["revoked_at"] is None else None

    def live(self, token_id: str) -> tuple[ApiToken, bytes] | None:
        """A live token by id, with what its page session is derived from (its stored
        hash); None if there is none or it was revoked."""
        if not ID.fullmatch(token_id):
            return None
        row = self.db.one("token_get", {"id": token_id})
        if row is None or row["revoked_at"] is not None:
            return None
        return ApiToken.from_row(row), bytes(row["hash"])

    def list_tokens(self) -> list[ApiToken]:
        """Every token, oldest first (revoked ones with when)."""
        return [ApiToken.from_row(r) for r in self.db.all("token_list")]

    def revoke(self, token_id: str) -> ApiToken | None:
        """Revoke it, and end its page sessions (again changes nothing); None: no such
        token."""
        if not ID.fullmatch(token_id):
            return None
        row = self.db.one("token_revoke", {"id": token_id})
        return ApiToken.from_row(row) if row else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PageSession:
    """A live page session: the token it was made from (None: CAIRN_API_TOKEN), what it
    was made from (owner), and whom it acts for."""

    token_id: str | None
    owner: bytes
    tenant: str | None
    admin: bool


class PageSessions:
    """The page_sessions table (migration 0027): a session is a random value the
    browser's cookie holds; the table holds its SHA-256."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def create(self, token_id: str | None, owner: bytes, seconds: float) -> str:
        """A new session for token_id (None: CAIRN_API_TOKEN's) that ends in seconds: the
        cookie's value, which is kept nowhere."""
        value = secrets.token_urlsafe(32)
        params = {"hash": _hash(value), "token_id": token_id, "owner": owner, "seconds": seconds}
        self.db.one("page_session_create", params)
        return value

    def get(self, value: str) -> PageSession | None:
        """The live session this value opens, or None (unknown, ended, expired, its token
        revoked or replaced, or not a value create makes)."""
        if not SESSION.fullmatch(value):
            return None
        row = self.db.one("page_session_get", {"hash": _hash(value)})
        if row is None:
            return None
        return PageSession(
            token_id=row["token_id"],
            owner=bytes(row["owner"]),
            tenant=row["tenant"],
            admin=row["admin"],
        )

    def end(self, value: str) -> None:
        """End the session (again, or an unknown one, changes nothing)."""
        if SESSION.fullmatch(value):
            self.db.one("page_session_end", {"hash": _hash(value)})
