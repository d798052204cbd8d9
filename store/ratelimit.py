"""Fleet-wide model rate limits in Redis: requests and tokens per minute per provider,
model and API key, and the back-off the provider's headers ask for (store/lua/ratelimit.lua)."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from typing import Any

import redis

from cairn.store import keys
from cairn.store.lease import _script, translated


def key(provider: str, bucket: str, who: str) -> str:
    """A bucket's state (ratelimit.lua): it expires once the bucket is full again, so an
    idle model keeps no key. `who` is account(api_key), never the key itself."""
    return f"{keys.PREFIX}:ratelimit:{provider}:{bucket}:{who}"


@dataclasses.dataclass(frozen=True)
class Limit:
    """Requests and tokens per minute (0: no limit)."""

    rpm: int = 0
    tpm: int = 0


def account(api_key: str) -> str:
    """A short, one-way name for an API key: Redis keys and logs never hold the key."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:12]


# How long a bucket with no limit of its own, found with no back-off, is taken for clear
# without asking Redis: its only state is a back-off another worker's 429 set, which this
# process then learns of this much later at most (a call of its own may meet the 429).
CLEAR_FOR = 0.1


class RateLimiter:
    """Books model calls against limits every worker shares.

    limits: per model name (a name also covers the dated versions it prefixes, the
    longest name winning: "claude-haiku-4-5" covers "claude-haiku-4-5-20251001", in one
    bucket), or "provider:name" for one provider's; default: every other model, each in a
    bucket of its own. A bucket is per provider and API key as well.
    """

    def __init__(
        self,
        client: redis.Redis,
        default: Limit = Limit(),
        limits: dict[str, Limit] | None = None,
        tenant: Limit = Limit(),
    ) -> None:
        self.client, self.default = client, default
        # Each tenant's own bucket per model (CAIRN_TENANT_MODEL_RPM/TPM), booked after the
        # fleet's: a tenant's calls pass both.
        self.tenant = tenant
        # The name that says most of the model first, whether or not it names a provider;
        # of two that say as much, the one naming a provider ("openai:gpt-4o" over "gpt-4o").
        self.limits = dict(
            sorted(
                (limits or {}).items(),
                key=lambda kv: (-len(kv[0].partition(":")[2] or kv[0]), ":" not in kv[0]),
            )
        )
        self._script = _script(client, "ratelimit.lua")
        self._clear_until: dict[str, float] = {}  # unlimited buckets' keys: CLEAR_FOR

    @classmethod
    def from_settings(cls, settings: Any, client: redis.Redis) -> RateLimiter:
        limits = {m: Limit(**v) for m, v in settings.rate_limits.items()}
        default = Limit(settings.model_rpm, settings.model_tpm)
        tenant = Limit(settings.tenant_model_rpm, settings.tenant_model_tpm)
        return cls(client, default, limits, tenant)

    def bucket(self, provider: str, model: str) -> tuple[str, Limit]:
        """The bucket a provider's model's calls count in, and its limit."""
        qualified = f"{provider}:{model}"
        name = next(
            (n for n in self.limits if qualified.startswith(n) or model.startswith(n)), None
        )
        return (name, self.limits[name]) if name is not None else (model, self.default)

    def take(
        self,
        provider: str,
        model: str,
        who: str,
        tokens: int,
        longest: float,
        tenant: str | None = None,
    ) -> tuple[bool, float]:
        """Book one call of about `tokens` tokens. Returns (True, seconds to wait before
        sending it), or (False, seconds it would have waited) when that is past `longest`
        and nothing was booked. A call of more tokens than a minute allows books a
        whole minute's: it waits for a full bucket instead of forever. With a tenant and
        a tenant limit, the call is booked in the tenant's bucket too, after the fleet's
        (refused there, the fleet's booking stands: a slot spent, never one too many)."""
        name, limit = self.bucket(provider, model)
        booked, wait = self._take(key(provider, name, who), limit, tokens, longest)
        if not booked or tenant is None or not (self.tenant.rpm or self.tenant.tpm):
            return booked, wait
        where = key(provider, name, f"tenant:{tenant}")
        booked, also = self._take(where, self.tenant, tokens, longest)
        return booked, max(wait, also)

    def _take(self, where: str, limit: Limit, tokens: int, longest: float) -> tuple[bool, float]:
        unlimited = not (limit.rpm or limit.tpm)
        if unlimited and time.monotonic() < self._clear_until.get(where, 0.0):
            return True, 0.0  # nothing to book, and no back-off a moment ago
        per_req = 60_000 / limit.rpm if limit.rpm else 0
        per_tok = 60_000 / limit.tpm if limit.tpm else 0
        tokens = min(tokens, limit.tpm) if limit.tpm else 0
        asked = time.monotonic()
        with translated():
            booked, wait_us = self._script(
                keys=[where], args=["take", per_req, per_tok, tokens, int(longest * 1000)]
            )
        if unlimited and booked and not wait_us:
            self._clear_until[where] = asked + CLEAR_FOR
        return bool(booked), wait_us / 1e6

    def settle(
        self, provider: str, model: str, who: str, unused: int, tenant: str | None = None
    ) -> None:
        """Give back the tokens a call booked and did not use (negative: it used more), in
        the fleet's bucket and the tenant's."""
        name, limit = self.bucket(provider, model)
        buckets = [(key(provider, name, who), limit)]
        if tenant is not None:
            buckets.append((key(provider, name, f"tenant:{tenant}"), self.tenant))
        for where, each in buckets:
            if each.tpm and unused:
                with translated():
                    self._script(keys=[where], args=["settle", 60_000 / each.tpm, unused])

    def back_off(self, provider: str, model: str, who: str, seconds: float) -> None:
        """No call of this bucket starts, on any worker, for `seconds` from now."""
        name, _ = self.bucket(provider, model)
        where = key(provider, name, who)
        self._clear_until.pop(where, None)
        with translated():
            self._script(keys=[where], args=["backoff", max(int(seconds * 1000), 1)])
