"""A loopback OTLP/HTTP trace receiver: what an OpenTelemetry Collector would get from
cairn's processes, decoded from the protocol's protobuf, and a trace drawn as text.

    with TraceReceiver() as receiver:     # OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url
        ...
        print(receiver.tree(trace_id))

Needs the `otel` extra (opentelemetry-proto comes with the OTLP exporter).
"""

from __future__ import annotations

import gzip
import http.server
import threading
from typing import Any, Self

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class TraceReceiver(http.server.ThreadingHTTPServer):
    """POST /v1/traces on a free loopback port; `spans` holds each span received, as a
    dict: name, trace_id, span_id, parent (hex, "" for a root), start and end (ns),
    attrs, events, links (span ids), service."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._add(request)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    def __enter__(self) -> Self:
        threading.Thread(target=self.serve_forever, name="otlp-receiver", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()

    @property
    def url(self) -> str:
        """The endpoint for OTEL_EXPORTER_OTLP_ENDPOINT (the exporter adds /v1/traces)."""
        return f"http://127.0.0.1:{self.server_address[1]}"

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        """The spans received of one trace (hex id), oldest start first."""
        with self.lock:
            return sorted((s for s in self.spans if s["trace_id"] == trace_id), key=_start)

    def tree(self, trace_id: str) -> str:
        """The trace drawn as an indented tree: each span's offset from the trace's first
        start, its duration, name, service and a few attributes. A span whose parent never
        arrived (its process was killed before exporting it) is drawn under a `?` line."""
        spans = self.trace(trace_id)
        if not spans:
            return ""
        t0 = spans[0]["start"]
        ids = {s["span_id"] for s in spans}
        kids: dict[str, list[dict[str, Any]]] = {}
        for s in spans:
            kids.setdefault(s["parent"] if s["parent"] in ids else "", []).append(s)
        lost = sorted({s["parent"] for s in spans if s["parent"] and s["parent"] not in ids})
        lines: list[str] = []

        def draw(span: dict[str, Any], depth: int) -> None:
            at, took = (span["start"] - t0) / 1e6, (span["end"] - span["start"]) / 1e6
            lines.append(
                f"{at:8.1f} ms {took:8.1f} ms  {'  ' * depth}{span['name']}"
                f"  [{span['service']}]{_shown(span)}"
            )
            for kid in kids.get(span["span_id"], []):
                draw(kid, depth + 1)

        for root in kids.get("", []):
            if root["parent"] and root["parent"] in lost:
                continue
            draw(root, 0)
        for parent in lost:
            lines.append(f"{'':>22}? {parent} (never exported: its process was killed)")
            for orphan in (s for s in spans if s["parent"] == parent):
                draw(orphan, 1)
        return "\n".join(lines)

    def _add(self, request: ExportTraceServiceRequest) -> None:
        for resource in request.resource_spans:
            service = next(
                (
                    a.value.string_value
                    for a in resource.resource.attributes
                    if a.key == "service.name"
                ),
                "",
            )
            for scope in resource.scope_spans:
                for s in scope.spans:
                    span = {
                        "name": s.name,
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent": s.parent_span_id.hex(),
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                        "attrs": {a.key: _value(a.value) for a in s.attributes},
                        "events": [e.name for e in s.events],
                        "links": [link.span_id.hex() for link in s.links],
                        "service": service,
                    }
                    with self.lock:
                        self.spans.append(span)


_SHOWN = (
    "cairn.cursor",
    "cairn.outcome",
    "cairn.resumed",
    "cairn.status",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "cairn.cost_usd",
)


def _shown(span: dict[str, Any]) -> str:
    attrs = span["attrs"]
    parts = [f"{k.split('.')[-1]}={attrs[k]}" for k in _SHOWN if k in attrs]
    parts += [f"event:{e}" for e in span["events"]]
    return ("  " + " ".join(parts)) if parts else ""


def _start(span: dict[str, Any]) -> int:
    return int(span["start"])


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None
