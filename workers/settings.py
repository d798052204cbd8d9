"""One settings object, read from CAIRN_* environment variables at the edge.

This is the one place defaults live: the CLI layers its options on top (`with_options`),
the app factory, the Client and the tests take a Settings, nothing else reads CAIRN_*.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not a number") from None


def _json(env: Mapping[str, str], name: str) -> dict[str, Any]:
    raw = env.get(name, "")
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{name} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise SystemExit(f"{name} must be a JSON object")
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    database_url: str = "postgresql://postgres@127.0.0.1:54329/cairn"
    redis_url: str = "redis://127.0.0.1:63790/0"
    broker_url: str | None = None  # default: redis_url
    workflows: tuple[str, ...] = ()
    # A lease expires this long after its last renewal; recovery from a lost worker
    # takes about this plus the reaper interval.
    lease_ttl: float = 10.0
    # Redis broker: how long an unacked message waits before redelivery. Long on purpose:
    # shorter than a run, and Celery starts the same task twice while the first still
    # runs. Crash recovery comes from the lease and the reaper, not from this.
    visibility_timeout: float = 3600.0
    # Extra kombu Redis transport options, e.g. unacked_restore_interval (how often an
    # unacked message past the visibility timeout is looked for).
    broker_transport_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    reaper_interval: float = 2.0
    pending_after: float = 300.0  # a pending run untouched this long is re-enqueued
    defer_seconds: float = 2.0  # countdown when another live worker holds the run
    transient_retries: int = 30  # task retries through Postgres/Redis outages
    # A run delivered this many times more than its recorded failures, with no step saved
    # in between, is poison (its step kills the process): it fails instead of looping.
    max_deliveries: int = 10
    max_cost_usd: float = 0.0  # default per-run cost cap in USD (0: none)
    max_input_bytes: int = 1_000_000  # a run's input as JSON; larger data goes by reference
    # A Client call (enqueue, get, ...) gives up this soon when Postgres or the broker
    # cannot be reached: a web request should fail fast; workers ride out restarts.
    client_give_up_after: float = 4.0
    store_give_up_after: float = 30.0  # tenacity budget for one store call
    retention: float = 7 * 24 * 3600.0  # terminal runs older than this are swept
    window_budget_tokens: int = 50_000
    max_window_bytes: int = 2_000_000
    model: str = "claude-haiku-4-5"
    anthropic_base_url: str | None = None
    mail_url: str = "http://127.0.0.1:8025"
    concurrency: int = 2  # cairn worker: processes in the pool
    loglevel: str = "INFO"
    metrics_port: int = 0  # cairn worker: Prometheus metrics on this port (0: off)

    @property
    def broker(self) -> str:
        return self.broker_url or self.redis_url

    def with_options(self, **options: Any) -> Settings:
        """These settings with the options that were given (None: not given) on top."""
        return dataclasses.replace(self, **{k: v for k, v in options.items() if v is not None})

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        d = cls()
        return cls(
            database_url=env.get("CAIRN_DATABASE_URL", d.database_url),
            redis_url=env.get("CAIRN_REDIS_URL", d.redis_url),
            broker_url=env.get("CAIRN_BROKER_URL") or None,
            workflows=tuple(
                m.strip() for m in env.get("CAIRN_WORKFLOWS", "").split(",") if m.strip()
            ),
            lease_ttl=_float(env, "CAIRN_LEASE_TTL", d.lease_ttl),
            visibility_timeout=_float(env, "CAIRN_VISIBILITY_TIMEOUT", d.visibility_timeout),
            broker_transport_options=_json(env, "CAIRN_BROKER_TRANSPORT_OPTIONS"),
            reaper_interval=_float(env, "CAIRN_REAPER_INTERVAL", d.reaper_interval),
            pending_after=_float(env, "CAIRN_PENDING_AFTER", d.pending_after),
            defer_seconds=_float(env, "CAIRN_DEFER_SECONDS", d.defer_seconds),
            transient_retries=int(_float(env, "CAIRN_TRANSIENT_RETRIES", d.transient_retries)),
            max_deliveries=int(_float(env, "CAIRN_MAX_DELIVERIES", d.max_deliveries)),
            max_cost_usd=_float(env, "CAIRN_MAX_COST_USD", d.max_cost_usd),
            max_input_bytes=int(_float(env, "CAIRN_MAX_INPUT_BYTES", d.max_input_bytes)),
            client_give_up_after=_float(env, "CAIRN_CLIENT_GIVE_UP_AFTER", d.client_give_up_after),
            store_give_up_after=_float(env, "CAIRN_STORE_GIVE_UP_AFTER", d.store_give_up_after),
            retention=_float(env, "CAIRN_RETENTION_SECONDS", d.retention),
            window_budget_tokens=int(
                _float(env, "CAIRN_WINDOW_BUDGET_TOKENS", d.window_budget_tokens)
            ),
            max_window_bytes=int(_float(env, "CAIRN_MAX_WINDOW_BYTES", d.max_window_bytes)),
            model=env.get("CAIRN_MODEL", d.model),
            anthropic_base_url=env.get("ANTHROPIC_BASE_URL") or None,
            mail_url=env.get("CAIRN_MAIL_URL", d.mail_url),
            concurrency=int(_float(env, "CAIRN_CONCURRENCY", d.concurrency)),
            loglevel=env.get("CAIRN_LOGLEVEL", d.loglevel),
            metrics_port=int(_float(env, "CAIRN_METRICS_PORT", d.metrics_port)),
        )
