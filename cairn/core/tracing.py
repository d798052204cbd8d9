"""OpenTelemetry traces of runs (CAIRN_TRACING=1, the `otel` extra).

One trace per run, whatever happens to it: `cairn.enqueue` (a child of the caller's span,
a web request's) writes its W3C traceparent into the run's row, and every delivery's
`cairn.run` span, on whatever worker, after whatever kill, is a child of it. Under it:
`cairn.step <cursor>` per step attempt (cursor, visit, seq, attempt, outcome), `chat
<model>` per model call (OpenTelemetry's GenAI conventions: tokens, finish reason, and
cairn's cost), `cairn.call <name>` per journaled call, events for resumes, retries and
waits. A child run's trace goes on under the step that spawned it. A run enqueued without
tracing gets a trace id derived from its run id, so its deliveries still share one. The
step and call spans are cairn's own (cairn/core/spans.py: cheaper on a step's path), ended
into the SDK's span processors as its ReadableSpans.

The exporter is the SDK's, configured by the standard variables: OTEL_TRACES_EXPORTER
(otlp, the default: OTLP over HTTP to OTEL_EXPORTER_OTLP_ENDPOINT; console; none),
OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER... Nothing else to set in
cairn. With tracing off (the default) nothing here imports OpenTelemetry, and the glue
functions the loop and the Client call return at their first line.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from cairn.core.errors import CairnError

if TYPE_CHECKING:
    from cairn.core.settings import Settings

# Set by setup(): the glue below does nothing until then (no import, no span).
_tracer: Any = None
# The step and call spans' cheaper path for the SDK's tracer (cairn/core/spans.py); None:
# the tracer's start_span.
_recorder: Any = None
_setup_lock = threading.Lock()
EXTRA_HINT = "CAIRN_TRACING=1 needs the otel extra: pip install 'cairn[otel]'"


def setup(settings: Settings, service: str) -> bool:
    """Start tracing in this process if settings.tracing: the SDK's TracerProvider with
    the exporter OTEL_TRACES_EXPORTER names, unless the application set one up already
    (then cairn's spans go to the application's). Idempotent; False if tracing is off.
    Raises CairnError naming the extra when it is not installed."""
    if not settings.tracing:
        return False
    with _setup_lock:
        if _tracer is not None:
            return True
        try:
            from opentelemetry import trace
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise CairnError(f"{EXTRA_HINT} ({exc})") from None
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            os.environ.setdefault("OTEL_SERVICE_NAME", service)
            provider = TracerProvider(resource=Resource.create())
            exporter = _exporter()
            if exporter is not None:
                # Batched on a thread of its own (restarted in each forked pool process).
                provider.add_span_processor(BatchSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
        from importlib.metadata import version

        use(trace.get_tracer("cairn", version("cairn")))
        return True


def _exporter() -> Any:
    name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")[0].strip().lower()
    if name == "none":
        return None
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise CairnError(f"OTEL_TRACES_EXPORTER={name!r}: cairn ships otlp, console or none")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def use(tracer: Any) -> None:
    """Trace with this tracer (a test's, over an in-memory exporter); None: stop."""
    global _tracer, _recorder
    if tracer is not None:
        from cairn.core.spans import Recorder

        _recorder = Recorder.of(tracer)
    else:
        _recorder = None
    _tracer = tracer


def active() -> bool:
    return _tracer is not None


# -- the Client's side -------------------------------------------------------------------
def enqueuing(workflow: str, run_id: str, **attributes: Any) -> Any:
    """A `cairn.enqueue` span around writing the run, a child of the current span (a web
    request's); yields its traceparent, for the run's row (None: tracing is off)."""
    return spanning("cairn.enqueue", producer=True, run_id=run_id, workflow=workflow, **attributes)


@contextlib.contextmanager
def spanning(name: str, *, producer: bool = False, **attributes: Any) -> Iterator[str | None]:
    """A span of the caller's (an enqueue, a fork, a signal sent) with cairn.<name>
    attributes: yields its traceparent, to store (None: tracing is off)."""
    if _tracer is None:
        yield None
        return
    from opentelemetry.trace import SpanKind

    kind = SpanKind.PRODUCER if producer else SpanKind.INTERNAL
    attrs = {f"cairn.{k}": v for k, v in attributes.items() if v is not None}
    with _tracer.start_as_current_span(name, kind=kind, attributes=attrs):
        yield traceparent()


def traceparent() -> str | None:
    """The current span's context as a W3C traceparent (None: none, or tracing off)."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


@contextlib.contextmanager
def continuing(headers: Any) -> Iterator[None]:
    """Run the block in the trace context the request's headers carry (traceparent), so
    an enqueue over HTTP joins the caller's trace."""
    if _tracer is None:
        yield
        return
    from opentelemetry import context, propagate

    token = context.attach(propagate.extract(dict(headers)))
    try:
        yield
    finally:
        context.detach(token)


def note(**attributes: Any) -> None:
    """Set cairn.<name> attributes on the current span (a step's, a call's)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    for key, value in attributes.items():
        if value is not None:
            span.set_attribute(f"cairn.{key}", value)


def model_answered(attributes: dict[str, Any], cost: float, stream: bool) -> None:
    """A model call's answer on its span, by the GenAI semantic conventions: attributes are
    its provider's reading of it (gen_ai.provider.name, model, tokens, finish reasons)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    attrs = {**attributes, "cairn.cost_usd": cost, "cairn.stream": stream}
    span.set_attributes({k: v for k, v in attrs.items() if v is not None})
    model = attributes.get("gen_ai.response.model") or attributes.get("gen_ai.request.model")
    if model:
        span.update_name(f"{attributes.get('gen_ai.operation.name', 'chat')} {model}")
