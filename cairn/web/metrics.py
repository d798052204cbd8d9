"""The server's Prometheus metrics (GET /metrics): requests by route and status, their
latency, and the runs by status, read from Postgres at scrape time."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cairn.client.client import Client
from cairn.core import logs
from cairn.core.errors import CairnError

log = logging.getLogger("cairn.web")


class Metrics:
    """One app's registry: its own, so two apps in a process (tests) count apart."""

    def __init__(self, client: Client) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "cairn_http_requests_total",
            "HTTP requests by route and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "cairn_http_request_seconds",
            "HTTP request latency by route.",
            ["route"],
            registry=self.registry,
            buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
        )
        self.registry.register(RunGauge(client))
        self.registry.register(VersionGauge(client))

    def text(self) -> bytes:
        """Everything, in Prometheus' text format."""
        return generate_latest(self.registry)


class RunGauge:
    """cairn_runs{status}: read from Postgres at scrape time, so every server agrees."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily("cairn_runs", "Runs by status.", labels=["status"])
        try:
            counts = self.client.counts()
        except CairnError as exc:  # the scrape still answers, without this family
            log.warning("cairn_runs not collected: %s", exc, extra=logs.run(None, "metrics_failed"))
            return
        for status, n in sorted(counts.items()):
            gauge.add_metric([status], n)
        yield gauge


class VersionGauge:
    """cairn_runs_pinned{version} and cairn_runs_orphaned_versions{version}: the runs
    pinned to each code version (versions="pin") under way, and those of a version with no
    live worker for over CAIRN_PIN_ORPHAN_AFTER, from Postgres and the workers' beats."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from cairn.store.fleet import fleet_versions

        s = self.client.settings
        try:
            versions = fleet_versions(self.client.store, s.redis, s.pin_orphan_after)
        except CairnError as exc:
            log.warning(
                "cairn_runs_pinned not collected: %s", exc, extra=logs.run(None, "metrics_failed")
            )
            return
        pinned = GaugeMetricFamily(
            "cairn_runs_pinned", "Runs under way pinned to a code version.", labels=["version"]
        )
        orphaned = GaugeMetricFamily(
            "cairn_runs_orphaned_versions",
            "Runs pinned to a code version with no live worker past CAIRN_PIN_ORPHAN_AFTER.",
            labels=["version"],
        )
        for v in versions:
            if v.pinned:
                pinned.add_metric([v.version], v.pinned)
                orphaned.add_metric([v.version], v.pinned if v.orphaned else 0)
        yield pinned
        yield orphaned


class Measured:
    """Counts and times every request, refused ones too, as plain ASGI (a
    BaseHTTPMiddleware would cost a third of a small request)."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            # The route the router chose, once it has: a refused request never gets one.
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(scope["method"], route, str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - started)
