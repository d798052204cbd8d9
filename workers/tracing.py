"""The loop's spans (cairn.core.tracing sets tracing up): `cairn.run` per delivery,
`cairn.step` per step attempt, one per journaled call, as a middleware the worker adds
when tracing is on."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from cairn.core import logs, tracing
from cairn.core.status import RunStatus
from cairn.workers.middleware import Middleware

if TYPE_CHECKING:
    from cairn.core.records import Checkpoint


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
        if entry is None or tracing._tracer is None:
            return None
        if entry[1] is None:
            context, trace = self._context, self._trace
            span = tracing._tracer.start_span(
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
        if (
            tracing._recorder is not None
        ):  # the SDK's tracer: the cheaper span (cairn/core/spans.py)
            # Under the delivery's span, whatever a step before it left current.
            span = tracing._recorder.start(
                name, run[3], _step_attributes(cp), links, up=run[1].get_span_context()
            )
        else:
            # The attributes go on at the end, in one call with the outcome: each set
            # costs the SDK a copy and a check of every value.
            span = tracing._tracer.start_span(name, context=run[3], links=links)
        token = context.attach(trace.set_span_in_context(span, run[3]))
        self._steps[(cp.run_id, threading.get_ident())] = (
            span,
            token,
            tracing._recorder is not None,
        )

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
        if tracing._tracer is None:
            return
        # Under the current span: the step's (an async step's task runs in a copy of its
        # pool thread's context, so there too).
        context, trace = self._context, self._trace
        model = name == "model"
        title = "chat" if model else f"cairn.call {name}"
        kind = trace.SpanKind.CLIENT if model else trace.SpanKind.INTERNAL
        attrs = {"cairn.call.name": name, "cairn.call.pos": pos}
        if tracing._recorder is not None:
            span = tracing._recorder.start(title, context.get_current(), attrs, kind=kind)
        else:
            span = tracing._tracer.start_span(title, kind=kind, attributes=attrs)
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
    from cairn.core.errors import RetryLater

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
