"""API tokens (`cairn tokens create`): a tenant's, or an admin's, each shown once and kept
only as the SHA-256 of its secret (a stolen table opens nothing).

A token reads `cairn_<id>_<secret>`: the id finds its row, and the secret's hash is
compared in constant time, so a wrong token costs what a right one does.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import hmac
import secrets
from typing import Any

from cairn.store.db import Database

PREFIX = "cairn_"


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
    return (token_id, secret) if token_id and secret else None


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
        row = self.db.one("token_get", {"id": token_id})
        if row is None or row["revoked_at"] is not None:
            return None
        return ApiToken.from_row(row), bytes(row["hash"])

    def list_tokens(self) -> list[ApiToken]:
        """Every token, oldest first (revoked ones with when)."""
        return [ApiToken.from_row(r) for r in self.db.all("token_list")]

    def revoke(self, token_id: str) -> ApiToken | None:
        """Revoke it (again changes nothing); None: no such token."""
        row = self.db.one("token_revoke", {"id": token_id})
        return ApiToken.from_row(row) if row else None
