"""OpenTelemetry traces of runs (CAIRN_TRACING=1, the `otel` extra).

One trace per run, whatever happens to it: `cairn.enqueue` (a child of the caller's span,
a web request's) writes its W3C traceparent into the run's row, and every delivery's
`cairn.run` span, on whatever worker, after whatever kill, is a child of it. Under it:
`cairn.step <cursor>` per step attempt (cursor, visit, seq, attempt, outcome), `chat
<model>` per model call (OpenTelemetry's GenAI conventions: tokens, finish reason, and
cairn's cost), `cairn.call <name>` per journaled call, events for resumes, retries and
waits. A child run's trace goes on under the step that spawned it. A run enqueued without
tracing gets a trace id derived from its run id, so its deliveries still share one. The
step and call spans are cairn's own (cairn/_spans.py: cheaper on a step's path), ended
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
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from cairn import logs
from cairn.errors import CairnError
from cairn.status import RunStatus
from cairn.workers.middleware import Middleware

if TYPE_CHECKING:
    from cairn.store import Checkpoint
    from cairn.workers.settings import Settings

# Set by setup(): the glue below does nothing until then (no import, no span).
_tracer: Any = None
# The step and call spans' cheaper path for the SDK's tracer (cairn/_spans.py); None:
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
        from cairn import __version__

        use(trace.get_tracer("cairn", __version__))
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
        from cairn._spans import Recorder

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


def model_answered(request: dict[str, Any], message: Any, cost: float, stream: bool) -> None:
    """A model call's answer on its span, by the GenAI semantic conventions."""
    if _tracer is None:
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    model = getattr(message, "model", None) or request.get("model")
    usage = getattr(message, "usage", None)
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": request.get("model") or model,
        "gen_ai.request.max_tokens": request.get("max_tokens"),
        "gen_ai.response.model": model,
        "gen_ai.response.id": getattr(message, "id", None),
        "gen_ai.usage.input_tokens": getattr(usage, "input_tokens", None),
        "gen_ai.usage.output_tokens": getattr(usage, "output_tokens", None),
        "cairn.cost_usd": cost,
        "cairn.stream": stream,
    }
    reason = getattr(message, "stop_reason", None)
    if reason:
        attrs["gen_ai.response.finish_reasons"] = [reason]
    span.set_attributes({k: v for k, v in attrs.items() if v is not None})
    if model:
        span.update_name(f"chat {model}")


# -- the worker's side -------------------------------------------------------------------
def _parent(cp: Checkpoint) -> Any:
    """The context a delivery's span goes under: the enqueuer's span, or (a run enqueued
    without tracing) a remote one derived from the run id, the same for every delivery."""
    from opentelemetry import propagate, trace

    if cp.traceparent:
        return propagate.extract({"traceparent": cp.traceparent})
    trace_id, span_id = logs.run_trace(cp.run_id)
    span = trace.NonRecordingSpan(
        trace.SpanContext(
            trace_id=trace_id,
            span_id=span_id,
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
    )
    return trace.set_span_in_context(span)


class Tracing(Middleware):
    """The loop's spans: `cairn.run` per delivery, `cairn.step` per step attempt, one per
    journaled call (`chat <model>` for ctx.model). Each is the current span while it lasts,
    so a step's own spans (an HTTP client's, a user's) nest under it."""

    def __init__(self) -> None:
        # (run id, thread): a delivery's span and its start; a step's; (run id, pos): a
        # call's. Keyed, not stacked: a deferred duplicate delivery of the same run may
        # overlap on another thread, and an async step's calls run on the loop's thread.
        self._runs: dict[tuple[str, int], list[Any]] = {}
        self._steps: dict[tuple[str, int], tuple[Any, Any, bool]] = {}
        self._calls: dict[tuple[str, int], tuple[Any, Any]] = {}
        # Made only with tracing on; held here, not imported in each hook: a hook's import
        # statement is a measurable part of a no-op step's cost.
        from opentelemetry import context, trace

        self._context, self._trace = context, trace

    def before_run(self, run_id: str) -> None:
        # The span starts once the checkpoint (and its trace) is read; it is dated here.
        self._runs[(run_id, threading.get_ident())] = [time.time_ns(), None, None]

    def _run(self, cp: Checkpoint) -> list[Any] | None:
        """The delivery's [start, span, token, context], its span started on first use."""
        entry = self._runs.get((cp.run_id, threading.get_ident()))
        if entry is None or _tracer is None:
            return None
        if entry[1] is None:
            context, trace = self._context, self._trace
            span = _tracer.start_span(
                "cairn.run",
                context=_parent(cp),
                kind=trace.SpanKind.CONSUMER,
                start_time=entry[0],
                attributes={
                    "cairn.run_id": cp.run_id,
                    "cairn.workflow": cp.workflow,
                    "cairn.epoch": cp.epoch,
                    "cairn.resumes": cp.resumes,
                },
            )
            here = trace.set_span_in_context(span)
            entry[1:] = [span, context.attach(here), here]
        return entry

    def resumed(self, cp: Checkpoint) -> None:
        run = self._run(cp)
        if run is not None:
            run[1].set_attribute("cairn.resumed", True)
            run[1].add_event("resumed", {"cairn.cursor": cp.cursor, "cairn.seq": cp.seq})

    def before_step(self, cp: Checkpoint) -> None:
        run = self._run(cp)
        if run is None:
            return
        context, trace = self._context, self._trace
        links = None
        if cp.signal and cp.signal.get("traceparent"):
            # The request that sent the signal is another trace: a link, not a parent.
            from opentelemetry.propagate import extract

            sender = extract({"traceparent": cp.signal["traceparent"]})
            links = [
                trace.Link(
                    trace.get_current_span(sender).get_span_context(), {"cairn.link": "signal"}
                )
            ]
        name = f"cairn.step {cp.cursor}"
        if _recorder is not None:  # the SDK's tracer: the cheaper span (cairn/_spans.py)
            # Under the delivery's span, whatever a step before it left current.
            span = _recorder.start(
                name, run[3], _step_attributes(cp), links, up=run[1].get_span_context()
            )
        else:
            # The attributes go on at the end, in one call with the outcome: each set
            # costs the SDK a copy and a check of every value.
            span = _tracer.start_span(name, context=run[3], links=links)
        token = context.attach(trace.set_span_in_context(span, run[3]))
        self._steps[(cp.run_id, threading.get_ident())] = (span, token, _recorder is not None)

    def after_step(
        self,
        cp: Checkpoint,
        *,
        saved: Checkpoint | None,
        exception: BaseException | None,
        seconds: float,
    ) -> None:
        found = self._steps.pop((cp.run_id, threading.get_ident()), None)
        if found is None:
            return
        span, token, recorded = found
        self._context.detach(token)
        attrs = {} if recorded else _step_attributes(cp)  # a recorded one has them already
        # cairn's own values go on a recorded span unchecked; any other tracer's checks them
        put = getattr(span, "put", span.set_attributes) if recorded else span.set_attributes
        if saved is not None:
            attrs["cairn.outcome"] = "saved"
            attrs["cairn.next"] = saved.cursor
            if saved.cost_usd != cp.cost_usd:  # the step's own model cost, when it had one
                attrs["cairn.cost_usd"] = saved.cost_usd - cp.cost_usd
            put(attrs)
            if saved.wait_event:
                span.add_event("wait", {"cairn.event": saved.wait_event})
        else:
            put(attrs)
            _failed(span, exception)
        span.end()

    def before_call(self, cp: Checkpoint, name: str, pos: int) -> None:
        if _tracer is None:
            return
        # Under the current span: the step's (an async step's task runs in a copy of its
        # pool thread's context, so there too).
        context, trace = self._context, self._trace
        model = name == "model"
        title = "chat" if model else f"cairn.call {name}"
        kind = trace.SpanKind.CLIENT if model else trace.SpanKind.INTERNAL
        attrs = {"cairn.call.name": name, "cairn.call.pos": pos}
        if _recorder is not None:
            span = _recorder.start(title, context.get_current(), attrs, kind=kind)
        else:
            span = _tracer.start_span(title, kind=kind, attributes=attrs)
        self._calls[(cp.run_id, pos)] = (span, context.attach(trace.set_span_in_context(span)))

    def after_call(
        self, cp: Checkpoint, name: str, pos: int, *, exception: BaseException | None
    ) -> None:
        found = self._calls.pop((cp.run_id, pos), None)
        if found is None:
            return
        span, token = found
        context = self._context

        context.detach(token)
        if exception is not None:
            _failed(span, exception)
        span.end()

    def after_run(
        self, run_id: str, *, status: str | None, exception: BaseException | None
    ) -> None:
        entry = self._runs.pop((run_id, threading.get_ident()), None)
        if entry is None or entry[1] is None:
            return  # deferred, or nothing to do: no step, no span
        span, token = entry[1], entry[2]
        context = self._context

        context.detach(token)
        if status is not None:
            span.set_attribute("cairn.status", str(status))
        else:
            span.set_attribute("cairn.outcome", _kind(exception))
            if exception is not None and hasattr(exception, "delay"):
                span.add_event("retry", {"cairn.delay_s": float(exception.delay)})
        span.end()


def _step_attributes(cp: Checkpoint) -> dict[str, Any]:
    """A step span's own (its run id and epoch are its delivery span's)."""
    attrs: dict[str, Any] = {
        "cairn.cursor": cp.cursor,
        "cairn.visit": cp.visits.get(cp.cursor, 0),
        "cairn.seq": cp.seq,
        "cairn.attempt": cp.attempts + 1,
    }
    if cp.signal:
        attrs["cairn.signal_id"] = cp.signal["id"]
    return attrs


def _kind(exc: BaseException | None) -> str:
    from cairn.errors import RetryLater

    if isinstance(exc, RetryLater):
        return "retry"
    return type(exc).__name__.lower() if exc is not None else "error"


def _failed(span: Any, exc: BaseException | None) -> None:
    from opentelemetry.trace import Status, StatusCode

    outcome = _kind(exc)
    status = getattr(exc, "status", None)  # the loop's Stop: how the run stops
    span.set_attribute("cairn.outcome", str(status) if status is not None else outcome)
    cause = exc.__cause__ if exc is not None and exc.__cause__ is not None else exc
    if cause is not None:
        span.record_exception(cause)
        # A retry will go on, a cancel or a budget is the run stopped on purpose: not errors.
        if outcome != "retry" and status not in (RunStatus.CANCELLED, RunStatus.BUDGET_EXCEEDED):
            span.set_status(Status(StatusCode.ERROR, str(cause)[:200]))
