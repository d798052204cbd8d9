"""The loop's spans (a step's, a journaled call's), made by cairn and ended into the
application's span processors.

Why not the SDK's `Tracer.start_span`: a no-op step is one Postgres round trip (about half
a millisecond on loopback), and the SDK's span cost 44-48 µs of it between two round trips
(its code is cold there; 18 µs in a tight loop): the lock, the copy and check of every
attribute (`BoundedAttributes`), a snapshot at the end. This span keeps what a step's span
needs in plain fields and hands the processors the SDK's own `ReadableSpan` when it ends,
through the same public pieces the SDK's Tracer holds: its sampler (asked for every span,
by its name, kind, parent and links: a sampler that drops `cairn.step` spans drops them),
id generator, span processor (`on_start` and `on_end`), resource and instrumentation
scope. cairn's own attributes are plain values and go in as they are; any other value set on it (a user's, through
`trace.get_current_span()`) makes it check them all with the SDK's `BoundedAttributes`
at the end, as a set on an SDK span would at once. Limits come from the OTEL_*_LIMIT
variables (`SpanLimits()`), not from limits passed in code to the application's provider.

Only imported while tracing is on (it imports the SDK); `Recorder.of` returns None for a
tracer that is not the SDK's, and cairn then uses `start_span` as before.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode
from opentelemetry.util import types

# Values every exporter takes as they are; anything else is checked by BoundedAttributes.
_PLAIN = frozenset((str, int, float, bool))
_RANDOM = getattr(TraceFlags, "RANDOM_TRACE_ID", 0)  # W3C level 2, where the API has it
_UNSET = Status(StatusCode.UNSET)
_FLAGS = [TraceFlags(f) for f in range(256)]  # made once: a span's flags are one of these


class Recorder:
    """Starts the loop's spans for one SDK tracer (see the module's docstring)."""

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer  # its resource is read at each span's end, as the SDK's is
        self.sampler = tracer.sampler
        self.ids = tracer.id_generator
        self.processor = tracer.span_processor
        info = tracer.instrumentation_info
        self.scope = InstrumentationScope(info.name, info.version, info.schema_url)
        self.limits = SpanLimits()

    @classmethod
    def of(cls, tracer: Any) -> Recorder | None:
        """A recorder for the SDK's tracer; None for any other tracer."""
        from opentelemetry.sdk.trace import Tracer

        return cls(tracer) if isinstance(tracer, Tracer) else None

    def start(
        self,
        name: str,
        parent: Context,
        attributes: dict[str, Any],
        links: Sequence[Link] | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        up: SpanContext | None = None,
    ) -> trace.Span:
        """A span under `parent`'s current span (or `up`, that span's context, when the
        caller holds it: a delivery's), started now, with `attributes` (plain values,
        taken as they are); a NonRecordingSpan when the sampler drops it. The sampler is
        asked as the SDK asks it, with the span's name, kind, parent and links; not with
        these attributes, which the SDK's copy through the sampler's result cost a
        no-op step 2 µs (the step's cursor is in its name)."""
        if up is None:
            up = trace.get_current_span(parent).get_span_context()
        if up.is_valid:
            trace_id, above = up.trace_id, up
        else:  # no span above it: the root of a trace of its own
            trace_id, above = self.ids.generate_trace_id(), None
        found = self.sampler.should_sample(parent, trace_id, name, kind, None, links or ())
        flags = TraceFlags.SAMPLED if found.decision.is_sampled() else TraceFlags.DEFAULT
        if _RANDOM and (up.trace_flags & _RANDOM if above else self.ids.is_trace_id_random()):
            flags |= _RANDOM
        context = SpanContext(
            trace_id,
            self.ids.generate_span_id(),
            is_remote=False,
            trace_flags=_FLAGS[flags],
            trace_state=found.trace_state,
        )
        if not found.decision.is_recording():
            return NonRecordingSpan(context)
        if found.attributes:  # a sampler's own, as the SDK puts them on its span
            attributes.update(found.attributes)
        span = RecordedSpan(self, name, kind, context, above, attributes, tuple(links or ()))
        self.processor.on_start(span, parent_context=parent)
        return span


class RecordedSpan(trace.Span):
    """A recording span that becomes a `ReadableSpan` for the processors at its end."""

    __slots__ = (
        "_attrs",
        "_context",
        "_end",
        "_events",
        "_kind",
        "_links",
        "_name",
        "_parent",
        "_plain",
        "_rec",
        "_start",
        "_status",
    )  # fmt: skip

    def __init__(
        self,
        rec: Recorder,
        name: str,
        kind: SpanKind,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: dict[str, Any],
        links: tuple[Link, ...],
    ) -> None:
        self._rec, self._name, self._kind = rec, name, kind
        self._context, self._parent = context, parent
        self._attrs, self._plain = attributes, True
        self._events: list[tuple[str, types.Attributes, int]] = []
        self._links = links
        self._status = _UNSET
        self._start, self._end = time.time_ns(), 0

    # -- what a processor's on_start may read ------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def kind(self) -> SpanKind:
        return self._kind

    @property
    def attributes(self) -> Mapping[str, Any]:
        return dict(self._attrs)

    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return not self._end

    # -- the API -----------------------------------------------------------------------
    def set_attribute(self, key: str, value: types.AnyValue) -> None:
        if self._end:
            return
        self._attrs[key] = value
        if type(value) not in _PLAIN or type(key) is not str:
            self._plain = False

    def set_attributes(self, attributes: Mapping[str, types.AnyValue]) -> None:
        for key, value in attributes.items():
            self.set_attribute(key, value)

    def put(self, attributes: Mapping[str, Any]) -> None:
        """cairn's own attributes (plain values), taken as they are."""
        if not self._end:
            self._attrs.update(attributes)

    def add_event(
        self, name: str, attributes: types.Attributes = None, timestamp: int | None = None
    ) -> None:
        if not self._end:
            self._events.append((name, attributes, timestamp or time.time_ns()))

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        if not self._end and context.is_valid:
            self._links = (*self._links, Link(context, attributes))

    def update_name(self, name: str) -> None:
        if not self._end:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        # As the SDK's: UNSET changes nothing, and an OK status is final.
        if self._end or self._status.status_code is StatusCode.OK:
            return
        if isinstance(status, StatusCode):
            status = Status(status, description)
        if status.status_code is not StatusCode.UNSET:
            self._status = status

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        kind = type(exception)
        module = kind.__module__
        event: dict[str, Any] = {
            "exception.type": f"{module}.{kind.__qualname__}"
            if module and module != "builtins"
            else kind.__qualname__,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        event.update(attributes or {})
        self.add_event("exception", event, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._end:
            return
        self._end = end_time or time.time_ns()
        rec, limits = self._rec, self._rec.limits
        attrs: types.Attributes = self._attrs
        most = limits.max_span_attributes
        if (
            not self._plain
            or limits.max_span_attribute_length is not None
            or (most is not None and len(self._attrs) > most)
        ):
            attrs = BoundedAttributes(
                limits.max_span_attributes,
                self._attrs,
                immutable=True,
                max_value_len=limits.max_span_attribute_length,
            )
        events = [
            Event(
                name,
                BoundedAttributes(
                    limits.max_event_attributes,
                    values,
                    immutable=True,
                    max_value_len=limits.max_attribute_length,
                ),
                at,
            )
            for name, values, at in self._events[: limits.max_events]
        ]
        rec.processor.on_end(
            ReadableSpan(
                name=self._name,
                context=self._context,
                parent=self._parent,
                resource=rec.tracer.resource,
                attributes=attrs,
                events=events,
                links=self._links[: limits.max_links],
                kind=self._kind,
                status=self._status,
                start_time=self._start,
                end_time=self._end,
                instrumentation_scope=rec.scope,
            )
        )
