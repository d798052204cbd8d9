"""One settings object, read from CAIRN_* environment variables at the edge.

This is the one place defaults live: each field names its environment variable and says
what it does, the docs' settings table is generated from them (a test keeps the two
equal), the CLI layers its options on top (`with_options`), and the app factory, the
Client and the tests take a Settings. Nothing else reads CAIRN_*.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import typing
from collections.abc import Mapping
from typing import Any

from cairn.core.redisurl import RedisUrlError, is_sentinel, parse_sentinel, with_master


def _setting(default: Any, env: str, help: str, **kwargs: Any) -> Any:
    factory = {"default_factory": default} if callable(default) else {"default": default}
    return dataclasses.field(**factory, metadata={"env": env, "help": help}, **kwargs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    database_url: str = _setting(
        "postgresql://postgres@127.0.0.1:54329/cairn",
        "CAIRN_DATABASE_URL",
        "the checkpoint store; a libpq multi-host URL (`postgresql://u@pg-a,pg-b/cairn"
        "?target_session_attrs=read-write`) follows a promoted standby (a failover)",
    )
    listen_url: str | None = _setting(
        None,
        "CAIRN_LISTEN_URL",
        "where LISTEN goes (default: the database URL): beat's, for runs enqueued in a "
        "caller's transaction, and a client's one connection for its waits; straight to "
        "Postgres when the database URL goes through PgBouncer in transaction mode",
    )
    database_read_url: str | None = _setting(
        None,
        "CAIRN_DATABASE_READ_URL",
        "a read replica of the database: `cairn serve` reads runs, their steps and calls "
        "there (a run not on it yet is read from the primary); writes stay on the primary",
    )
    redis_url: str = _setting(
        "redis://127.0.0.1:63790/0",
        "CAIRN_REDIS_URL",
        "leases, events, rate limits, and the broker unless `CAIRN_BROKER_URL` is set; "
        "Sentinel as kombu writes it: `sentinel://[:password@]host:26379[/db];"
        "sentinel://host2:26379...` with `CAIRN_REDIS_SENTINEL_MASTER`",
    )
    redis_sentinel_master: str | None = _setting(
        None,
        "CAIRN_REDIS_SENTINEL_MASTER",
        "the master's name when `CAIRN_REDIS_URL` lists sentinels (kombu's `master_name` "
        "transport option, which the broker is given too)",
    )
    broker_url: str | None = _setting(
        None,
        "CAIRN_BROKER_URL",
        "the Celery broker (default: the Redis URL); `amqp://` for RabbitMQ's quorum queues",
    )
    workflows: tuple[str, ...] = _setting(
        (),
        "CAIRN_WORKFLOWS",
        "comma-separated modules imported at start so their workflows register",
    )
    middleware: tuple[str, ...] = _setting(
        (),
        "CAIRN_MIDDLEWARE",
        "comma-separated `module:Class` middleware the workers call around every run and step",
    )
    code_version: str | None = _setting(
        None,
        "CAIRN_CODE_VERSION",
        "this worker's code version, recorded on the runs it starts and the steps it saves "
        "(default: a hash of its registered workflows' and steps' names; set it per release)",
    )
    pin_orphan_after: float = _setting(
        600.0,
        "CAIRN_PIN_ORPHAN_AFTER",
        "seconds a code version may have no live worker while runs pinned to it "
        '(versions="pin") are under way, before they are reported orphaned',
    )
    # Recovery from a lost worker takes about this plus the reaper interval.
    lease_ttl: float = _setting(
        10.0, "CAIRN_LEASE_TTL", "seconds a lease lives without a heartbeat (renewed every TTL/3)"
    )
    # Long on purpose: shorter than a run, and Celery starts the same task twice while the
    # first still runs. Crash recovery comes from the lease and the reaper, not from this.
    visibility_timeout: float = _setting(
        3600.0,
        "CAIRN_VISIBILITY_TIMEOUT",
        "seconds a worker may hold a run's message: Redis visibility timeout, RabbitMQ "
        "consumer timeout (see below)",
    )
    broker_transport_options: dict[str, Any] = _setting(  # noqa: RUF009 (a field())
        dict,
        "CAIRN_BROKER_TRANSPORT_OPTIONS",
        'more kombu transport options as JSON, e.g. `{"unacked_restore_interval": 1}` (Redis)',
    )
    reaper_interval: float = _setting(2.0, "CAIRN_REAPER_INTERVAL", "seconds between reaper passes")
    # A run never taken waits while the broker holds a message for it, however long: the
    # reaper sends one again only when the broker holds fewer messages than such runs
    # (lost_after). What it sends itself waits untaken this long at most before another.
    pending_after: float = _setting(
        300.0,
        "CAIRN_PENDING_AFTER",
        "the longest a message the reaper sent waits untaken before it sends another (the "
        "waits double from max(CAIRN_LEASE_TTL, CAIRN_LOST_AFTER) up to this)",
    )
    lost_after: float = _setting(
        10.0,
        "CAIRN_LOST_AFTER",
        "seconds before pending runs the broker holds no message for are sent again",
    )
    defer_seconds: float = _setting(
        2.0, "CAIRN_DEFER_SECONDS", "countdown when another live worker holds the run"
    )
    transient_retries: int = _setting(
        30, "CAIRN_TRANSIENT_RETRIES", "task retries through Postgres/Redis outages"
    )
    max_deliveries: int = _setting(
        10,
        "CAIRN_MAX_DELIVERIES",
        "deliveries without finishing a step before a run fails as poison",
    )
    max_cost_usd: float = _setting(
        0.0, "CAIRN_MAX_COST_USD", "default per-run model cost cap in USD (0: none)"
    )
    max_input_bytes: int = _setting(
        1_000_000, "CAIRN_MAX_INPUT_BYTES", "largest run input (as JSON) the Client accepts"
    )
    max_spawn_depth: int = _setting(
        10,
        "CAIRN_MAX_SPAWN_DEPTH",
        "child runs below a first run before a spawn fails (a workflow that spawns itself)",
    )
    # A web request should fail fast; workers ride out restarts (store_give_up_after).
    client_give_up_after: float = _setting(
        4.0,
        "CAIRN_CLIENT_GIVE_UP_AFTER",
        "seconds a Client call (and `cairn worker`'s start-up check) waits for Postgres or the broker",
    )
    store_give_up_after: float = _setting(
        30.0, "CAIRN_STORE_GIVE_UP_AFTER", "seconds one store call retries before the task retries"
    )
    retention: float = _setting(
        7 * 24 * 3600.0, "CAIRN_RETENTION_SECONDS", "terminal runs older than this are swept hourly"
    )
    window_budget_tokens: int = _setting(
        50_000, "CAIRN_WINDOW_BUDGET_TOKENS", "compaction budget for the model window"
    )
    max_window_bytes: int = _setting(
        2_000_000,
        "CAIRN_MAX_WINDOW_BYTES",
        "a window larger than this after compaction fails the run",
    )
    events_maxlen: int = _setting(
        10_000,
        "CAIRN_EVENTS_MAXLEN",
        "run events kept per run in Redis for live readers (oldest trimmed; 0: events off)",
    )
    events_ttl: float = _setting(
        24 * 3600.0, "CAIRN_EVENTS_TTL", "seconds a run's event stream lives after its last event"
    )
    max_event_bytes: int = _setting(
        65_536, "CAIRN_MAX_EVENT_BYTES", "largest `ctx.emit` event (its data as JSON)"
    )
    max_events: int = _setting(
        100_000,
        "CAIRN_MAX_EVENTS",
        "events (`ctx.emit`, model tokens) one run may emit; past it `ctx.emit` raises",
    )
    sse_keepalive: float = _setting(
        15.0, "CAIRN_SSE_KEEPALIVE", "`cairn serve`: seconds between keep-alives on an idle stream"
    )
    model: str = _setting(
        "claude-haiku-4-5",
        "CAIRN_MODEL",
        "default model for `ctx.model` (its name says its provider: `claude-*`, `gpt-*`, `o4-*`...)",
    )
    anthropic_base_url: str | None = _setting(
        None,
        "ANTHROPIC_BASE_URL",
        "the Messages API (default: Anthropic's; the demo and tests use a local stand-in)",
    )
    openai_base_url: str | None = _setting(
        None,
        "OPENAI_BASE_URL",
        "the OpenAI API, `/v1` included (default: OpenAI's; the tests use a local stand-in)",
    )
    model_prices: dict[str, Any] = _setting(  # noqa: RUF009 (a field())
        dict,
        "CAIRN_MODEL_PRICES",
        "USD per million tokens for models cairn has no price for, as JSON, e.g. "
        '`{"gpt-4o-mini": {"input": 0.15, "output": 0.6, "cache_read": 0.075}}`',
    )
    mail_url: str = _setting(
        "http://127.0.0.1:8025",
        "CAIRN_MAIL_URL",
        "the mail API of the demo workflows (invoice, agent)",
    )
    # Agent runs mostly wait on the model: a thread per run holds hundreds per process.
    pool: str = _setting(
        "prefork",
        "CAIRN_POOL",
        "`cairn worker`: `prefork` (a process per run) or `threads` (many runs per process)",
    )
    concurrency: int = _setting(
        2, "CAIRN_CONCURRENCY", "`cairn worker`: runs at once (processes, or threads)"
    )
    database_pool_size: int = _setting(
        4,
        "CAIRN_DATABASE_POOL_SIZE",
        "Postgres connections per worker process, whatever the concurrency",
    )
    database_prepare: bool = _setting(
        True,
        "CAIRN_DATABASE_PREPARE",
        "server-side prepared statements; `0` behind PgBouncer < 1.21 in transaction mode",
    )
    loglevel: str = _setting("INFO", "CAIRN_LOGLEVEL", "`cairn worker` and `cairn beat`: log level")
    metrics_port: int = _setting(
        0, "CAIRN_METRICS_PORT", "`cairn worker` serves Prometheus metrics on this port (0: off)"
    )
    # A secret: never in repr, logs or `cairn settings` (masked there).
    api_token: str | None = _setting(
        None,
        "CAIRN_API_TOKEN",
        "`cairn serve`: the bearer token every request but `/healthz` must carry",
        repr=False,
    )
    # A secret too. Read from the environment by every process that writes or reads
    # payloads (cairn.core.sealing.ring); checked here so a bad ring fails at start.
    payload_keys: str | None = _setting(
        None,
        "CAIRN_PAYLOAD_KEYS",
        "payloads encrypted at rest (input, state, window, journaled results, signals, "
        "errors, events): comma-separated `<id>:<key>`, the first sealing, all opening; "
        "`cairn db new-key` makes a key",
        repr=False,
    )
    web_host: str = _setting("127.0.0.1", "CAIRN_WEB_HOST", "`cairn serve`: address to listen on")
    web_port: int = _setting(8000, "CAIRN_WEB_PORT", "`cairn serve`: port to listen on")
    web_session_seconds: float = _setting(
        12 * 3600.0,
        "CAIRN_WEB_SESSION_SECONDS",
        "`cairn serve`: seconds a page session (a login) lasts; logging out, or revoking its "
        "token, ends it sooner",
    )
    web_secure_cookies: bool = _setting(
        False,
        "CAIRN_WEB_SECURE_COOKIES",
        "`cairn serve`: mark the pages' cookies `Secure` (sent over HTTPS only) on every "
        "answer; unset, they are `Secure` when the request came over HTTPS, directly or as a "
        "trusted proxy's `X-Forwarded-Proto` says",
    )
    web_trusted_proxies: tuple[str, ...] = _setting(
        (),
        "CAIRN_WEB_TRUSTED_PROXIES",
        "`cairn serve`: comma-separated addresses or networks (`10.0.0.0/8`) of the reverse "
        "proxies whose `X-Forwarded-Proto` is believed; from any other peer it is ignored",
    )
    tenant_concurrency: int = _setting(
        0,
        "CAIRN_TENANT_CONCURRENCY",
        "runs of one tenant that hold a slot at a time, over all its workflows (a concurrency "
        "key of its own: the others wait as queued; 0: no limit)",
    )
    tenant_model_rpm: int = _setting(
        0,
        "CAIRN_TENANT_MODEL_RPM",
        "model requests a minute of one tenant's runs, per model, fleet-wide, on top of the "
        "fleet's limits (0: no limit)",
    )
    tenant_model_tpm: int = _setting(
        0,
        "CAIRN_TENANT_MODEL_TPM",
        "model tokens a minute of one tenant's runs, per model, fleet-wide, on top of the "
        "fleet's limits (0: no limit)",
    )
    model_rpm: int = _setting(
        0,
        "CAIRN_MODEL_RPM",
        "model requests a minute, per model and API key, the whole fleet together (0: no limit)",
    )
    model_tpm: int = _setting(
        0,
        "CAIRN_MODEL_TPM",
        "model tokens (prompt and answer) a minute, per model and API key, fleet-wide (0: no limit)",
    )
    rate_limits: dict[str, Any] = _setting(  # noqa: RUF009 (a field())
        dict,
        "CAIRN_RATE_LIMITS",
        "limits per model (a name covers the versions it prefixes) as JSON, e.g. "
        '`{"claude-sonnet-4-5": {"rpm": 50, "tpm": 40000}}`',
    )
    rate_wait_max: float = _setting(
        10.0,
        "CAIRN_RATE_WAIT_MAX",
        "seconds a model call over the rate limit waits in its worker; past it the step is "
        "retried later",
    )

    # A tick fires up to this late; each pass is one indexed query when nothing is due.
    schedule_tick: float = _setting(
        1.0,
        "CAIRN_SCHEDULE_TICK",
        "`cairn beat`: seconds between passes that fire due schedules and wake the runs whose "
        "sleep or wait timeout is over",
    )

    # Observability (cairn.otel): spans through OpenTelemetry's own OTEL_* variables.
    tracing: bool = _setting(
        False,
        "CAIRN_TRACING",
        "OpenTelemetry spans for enqueues, runs, steps, model and journaled calls (the "
        "`otel` extra; exporter and endpoint from the standard `OTEL_*` variables)",
    )
    log_format: str = _setting(
        "text",
        "CAIRN_LOG_FORMAT",
        "`text` for a terminal, or `json`: one object a line with run id, workflow, cursor, "
        "seq, attempt, worker, trace and span ids",
    )
    trace_url_template: str | None = _setting(
        None,
        "CAIRN_TRACE_URL_TEMPLATE",
        "the run page links a run's trace here, e.g. `http://jaeger:16686/trace/{trace_id}`",
    )

    def __post_init__(self) -> None:
        _check_rate_limits(self)
        _check_prices(self)
        if self.payload_keys:
            from cairn.core.sealing import KeyRing

            KeyRing(self.payload_keys)  # PayloadKeyError says what is wrong with it
        _check_web(self)
        _check_redis(self)
        if self.log_format not in ("text", "json"):
            raise ValueError(f"CAIRN_LOG_FORMAT={self.log_format!r}: use text or json")
        template = self.trace_url_template
        if template is not None and "{trace_id}" not in template:
            raise ValueError(
                f"CAIRN_TRACE_URL_TEMPLATE={template!r} has no {{trace_id}} to fill in"
            )

    @property
    def broker(self) -> str:
        return self.broker_url or self.redis_url

    @property
    def redis(self) -> str:
        """The URL cairn's own Redis clients take (cairn.store.redisconn): CAIRN_REDIS_URL,
        a Sentinel one with its master's name in it."""
        if self.redis_sentinel_master and is_sentinel(self.redis_url):
            return with_master(self.redis_url, self.redis_sentinel_master)
        return self.redis_url

    @property
    def resend_window(self) -> float:
        """How long a sent resume message may wait untaken before the reaper (or a lost
        pool process's request) sends another."""
        return max(self.lease_ttl, self.lost_after)

    def with_options(self, **options: Any) -> Settings:
        """These settings with the options that were given (None: not given) on top."""
        return dataclasses.replace(self, **{k: v for k, v in options.items() if v is not None})

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        hints = typing.get_type_hints(cls)
        values = {}
        for f in dataclasses.fields(cls):
            raw = env.get(f.metadata["env"])
            if raw:  # neither unset nor empty
                values[f.name] = _parse(f.metadata["env"], raw, hints[f.name])
        try:
            return cls(**values)
        except ValueError as exc:  # a value that parses and means nothing (a limit of -1)
            raise SystemExit(str(exc)) from None


def _parse(name: str, raw: str, kind: Any) -> Any:
    if kind in (str, str | None):
        return raw
    if kind is bool:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise SystemExit(f"{name}={raw!r} is not one of 1/0, true/false, yes/no, on/off")
    if kind == tuple[str, ...]:
        return tuple(m.strip() for m in raw.split(",") if m.strip())
    if kind == dict[str, Any]:
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"{name} is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise SystemExit(f"{name} must be a JSON object")
        return value
    try:
        number = float(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not a number") from None
    if kind is int:
        if number != int(number):
            raise SystemExit(f"{name}={raw!r} is not a whole number")
        return int(number)
    return number


def _check_redis(s: Settings) -> None:
    """RedisUrlError (a ValueError), in one line, for a Sentinel setting cairn cannot use."""
    if is_sentinel(s.redis_url):
        parse_sentinel(with_master(s.redis_url, s.redis_sentinel_master or ""))
    elif s.redis_sentinel_master:
        raise RedisUrlError(
            "CAIRN_REDIS_SENTINEL_MASTER is set but CAIRN_REDIS_URL lists no sentinel "
            "(sentinel://host:26379;sentinel://...)"
        )


def _check_rate_limits(s: Settings) -> None:
    """ValueError, naming the variable, for a rate limit that means nothing."""

    def count(name: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}={value!r}: a whole number per minute, >= 0 (0: no limit)")

    count("CAIRN_MODEL_RPM", s.model_rpm)
    count("CAIRN_MODEL_TPM", s.model_tpm)
    for model, limit in s.rate_limits.items():
        where = f"CAIRN_RATE_LIMITS[{model!r}]"
        if not model:
            raise ValueError("CAIRN_RATE_LIMITS: a model name is empty")
        if not isinstance(limit, dict) or not limit or set(limit) - {"rpm", "tpm"}:
            raise ValueError(f'{where}={limit!r}: want {{"rpm": N, "tpm": N}} (either or both)')
        for field, value in limit.items():
            count(f"{where}.{field}", value)
    if s.rate_wait_max < 0:
        raise ValueError(f"CAIRN_RATE_WAIT_MAX={s.rate_wait_max!r}: seconds, >= 0")


def _check_web(s: Settings) -> None:
    """ValueError, naming the variable, for a web setting that means nothing."""
    if not s.web_session_seconds > 0:
        raise ValueError(f"CAIRN_WEB_SESSION_SECONDS={s.web_session_seconds!r}: seconds, > 0")
    for proxy in s.web_trusted_proxies:
        try:
            ipaddress.ip_network(proxy, strict=False)
        except ValueError:
            raise ValueError(
                f"CAIRN_WEB_TRUSTED_PROXIES: {proxy!r} is not an address or a network "
                "(e.g. 10.0.0.5 or 10.0.0.0/8)"
            ) from None


_PRICE_FIELDS = {"input", "output", "cache_write", "cache_read"}


def _check_prices(s: Settings) -> None:
    """ValueError, naming the variable, for a price that means nothing."""
    for model, price in s.model_prices.items():
        where = f"CAIRN_MODEL_PRICES[{model!r}]"
        if not model:
            raise ValueError("CAIRN_MODEL_PRICES: a model name is empty")
        if (
            not isinstance(price, dict)
            or not {"input", "output"} <= set(price)
            or set(price) - _PRICE_FIELDS
        ):
            raise ValueError(
                f'{where}={price!r}: want {{"input": USD, "output": USD}} per million tokens, '
                '"cache_write" and "cache_read" optional'
            )
        for field, value in price.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{where}.{field}={value!r}: USD per million tokens, >= 0")


def markdown_table() -> str:
    """The docs' settings table (docs/reference/settings.md), from the fields themselves."""
    rows = ["| variable | default | what it does |", "|---|---|---|"]
    for f in dataclasses.fields(Settings):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
        if isinstance(default, tuple):
            default = ",".join(default)
        shown = (
            ""
            if default in (None, "", {})
            else f"`{json.dumps(default) if isinstance(default, dict) else _plain(default)}`"
        )
        rows.append(f"| `{f.metadata['env']}` | {shown} | {f.metadata['help']} |")
    return "\n".join(rows)


def _plain(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
