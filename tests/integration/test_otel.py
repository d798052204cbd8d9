"""OpenTelemetry traces (cairn.otel): spans from the SDK's in-memory exporter in this
process. From real workers over OTLP/HTTP, with one killed mid-step:
tests/fleet/test_otel.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tests.helpers.flows  # noqa: F401 (probe, square)
from cairn import StepResult, otel, workflow
from cairn.client.client import Client
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.steps.context import Context
from cairn.store import Leases, PgStore
from cairn.workers import loop
from cairn.workers.middleware import Chain, Middleware


@pytest.fixture
def spans() -> Iterator[tuple[Any, InMemorySpanExporter]]:
    """cairn traced by a tracer over an in-memory exporter: (tracer, exporter)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    otel.use(tracer)
    yield tracer, exporter
    otel.use(None)
    provider.shutdown()


def _traced(deps: loop.Deps, *more: Middleware) -> loop.Deps:
    return loop.Deps(
        settings=deps.settings,
        store=deps.store,
        leases=deps.leases,
        model=deps.model,
        middleware=Chain([otel.Tracing(), *more]),
    )


def _by_name(finished: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in finished if s.name.startswith(prefix)]


class _DieAt(Middleware):
    """The first delivery dies at the start of a step (a BaseException passes the
    middleware guard and ends the delivery; a real kill is the OTLP test below)."""

    def __init__(self, cursor: str) -> None:
        self.cursor, self.fired = cursor, False

    def before_step(self, cp: Any) -> None:
        if cp.cursor == self.cursor and not self.fired:
            self.fired = True
            raise SystemExit("killed")


def test_a_run_that_died_mid_step_and_resumed_elsewhere_is_one_trace_under_the_request(
    spans: Any, deps: loop.Deps, client: Client, tmp_path: Path
) -> None:
    tracer, exporter = spans
    with tracer.start_as_current_span("POST /orders") as web:
        run_id = client.enqueue("probe", {"log": str(tmp_path / "log")})
    with pytest.raises(SystemExit):
        loop.run(run_id, _traced(deps, _DieAt("two")))
    other = dataclasses.replace(deps, leases=Leases.from_url(deps.settings.redis_url))
    assert loop.run(run_id, _traced(other)) == RunStatus.DONE  # another worker goes on
    finished = exporter.get_finished_spans()
    trace_id = web.get_span_context().trace_id
    assert {s.context.trace_id for s in finished} == {trace_id}  # one trace, none orphaned
    (enqueue,) = _by_name(finished, "cairn.enqueue")
    assert enqueue.parent is not None and enqueue.parent.span_id == web.get_span_context().span_id
    died, resumed = _by_name(finished, "cairn.run")
    assert {died.parent.span_id, resumed.parent.span_id} == {enqueue.context.span_id}  # type: ignore[union-attr]
    assert (
        died.attributes["cairn.outcome"] == "systemexit" and "cairn.resumed" not in died.attributes
    )
    assert resumed.attributes["cairn.resumed"] is True
    assert resumed.attributes["cairn.status"] == "done"
    assert [e.name for e in resumed.events] == ["resumed"]
    steps = [
        (s.attributes["cairn.cursor"], s.attributes["cairn.outcome"])
        for s in _by_name(finished, "cairn.step")
    ]
    assert steps == [
        ("one", "saved"), ("two", "systemexit"), ("two", "saved"), ("mail", "saved"),
        ("ledger", "saved"), ("once", "saved"),
    ]  # fmt: skip
    mail = next(
        s for s in _by_name(finished, "cairn.step") if s.attributes["cairn.cursor"] == "mail"
    )
    assert mail.parent is not None and mail.parent.span_id == resumed.context.span_id
    assert mail.attributes["cairn.effect_key"] == f"cairn:{run_id}:mail:0"
    stored = client.get(run_id)
    assert stored is not None and stored.traceparent is not None
    assert stored.traceparent.split("-")[1] == f"{trace_id:032x}"


def test_model_spans_carry_tokens_and_the_cost_the_run_counted(
    spans: Any, deps: loop.Deps, store: PgStore, tmp_path: Path
) -> None:
    _, exporter = spans
    store.create_run("m1", "probe", {"log": str(tmp_path / "log")})
    assert loop.run("m1", _traced(deps)) == RunStatus.DONE
    (chat,) = _by_name(exporter.get_finished_spans(), "chat ")
    attrs = chat.attributes
    assert chat.name == f"chat {attrs['gen_ai.response.model']}"
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.max_tokens"] == 16
    assert attrs["gen_ai.usage.input_tokens"] > 0 and attrs["gen_ai.usage.output_tokens"] > 0
    run = store.get("m1")
    assert run is not None and run.cost_usd > 0
    assert attrs["cairn.cost_usd"] == pytest.approx(run.cost_usd)
    (step,) = [
        s
        for s in _by_name(exporter.get_finished_spans(), "cairn.step")
        if s.attributes["cairn.cursor"] == "two"
    ]
    assert chat.parent is not None and chat.parent.span_id == step.context.span_id


def test_a_requests_traceparent_reaches_the_run_through_the_api(
    spans: Any, settings: Settings
) -> None:
    from fastapi.testclient import TestClient

    from cairn.web.api import create_app

    _, exporter = spans
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with TestClient(create_app(settings, insecure_no_auth=True)) as api:
        body = api.post(
            "/runs", json={"workflow": "square", "input": {"n": 3}}, headers={"traceparent": caller}
        ).json()
        run = api.app.state.client.get(body["run_id"])  # type: ignore[attr-defined]
    (enqueue,) = _by_name(exporter.get_finished_spans(), "cairn.enqueue")
    assert f"{enqueue.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert enqueue.parent is not None and f"{enqueue.parent.span_id:016x}" == "b7ad6b7169203331"
    assert run.traceparent.split("-")[1] == "0af7651916cd43dd8448eb211c80319c"


def test_the_step_a_signal_wakes_links_to_the_signals_trace(
    spans: Any, deps: loop.Deps, client: Client
) -> None:
    """A signal sent from another request (another trace): the run stays in its own
    trace, and the step the signal wakes carries a link to the sender's span."""
    tracer, exporter = spans
    data = {"customer": "acme", "email": "ap@acme.test", "await_payment": True}
    run_id = client.enqueue("invoice", data)
    traced = _traced(deps)
    assert loop.run(run_id, traced) == RunStatus.WAITING
    with tracer.start_as_current_span("POST /webhooks/payment") as webhook:
        client.signal(run_id, "payment", {"amount_cents": 100})
    assert loop.run(run_id, traced) == RunStatus.DONE
    finished = exporter.get_finished_spans()
    (settle,) = [
        s for s in _by_name(finished, "cairn.step") if s.attributes["cairn.cursor"] == "settle"
    ]
    (signal,) = _by_name(finished, "cairn.signal")
    assert signal.parent is not None and signal.parent.span_id == webhook.get_span_context().span_id
    (link,) = settle.links
    assert link.context.span_id == signal.context.span_id
    assert link.context.trace_id != settle.context.trace_id  # the run's trace is its own
    (enqueue,) = _by_name(finished, "cairn.enqueue")
    assert settle.context.trace_id == enqueue.context.trace_id
    wait = next(
        s
        for s in _by_name(finished, "cairn.step")
        if s.attributes["cairn.cursor"] == "await_payment"
    )
    assert [e.name for e in wait.events] == ["wait"]


def test_without_tracing_nothing_is_traced_or_stored(client: Client, deps: loop.Deps) -> None:
    assert not otel.active() and otel.traceparent() is None
    run_id = client.enqueue("square", {"n": 2})
    assert client.get(run_id).traceparent is None  # type: ignore[union-attr]
    assert loop.run(run_id, deps) == RunStatus.DONE
    assert otel.setup(client.settings, "x") is False


# -- the loop's spans: cairn's recorder into the SDK's processors ------------------------
_APP: dict[str, Any] = {}  # the tracer the step below makes its own spans with
# Values the SDK checks as it sets them (a list becomes a tuple, an object not an
# attribute value is replaced): the step's span must end with what the SDK's would.
_ODD: dict[str, Any] = {"app.tags": ["a", "b"], "app.map": {"k": 1}, "app.obj": object()}
user_spans = workflow("otel_user_spans")


@user_spans.step()
def work(ctx: Context) -> StepResult:
    """A step as an application writes one: attributes on the current span (the step's),
    and a span of its own under it."""
    from opentelemetry import trace

    here = trace.get_current_span()
    here.set_attribute("app.tenant", "acme")
    here.set_attributes(_ODD)
    with _APP["tracer"].start_as_current_span("app.lookup") as mine:
        mine.set_attribute("app.rows", 3)
    return StepResult(cursor="done")


def test_a_steps_own_spans_and_attributes_land_under_and_on_its_span(
    spans: Any, deps: loop.Deps, store: PgStore
) -> None:
    """The step's span is cairn's recorded one (not the SDK's Span), yet what a step does
    with the current span is kept: its attributes, checked as the SDK's span checks them,
    and a child span nested under it."""
    from cairn.core.spans import RecordedSpan, Recorder

    tracer, exporter = spans
    assert Recorder.of(tracer) is not None
    _APP["tracer"] = tracer
    seen: list[Any] = []
    store.create_run("u1", "otel_user_spans", {})
    assert loop.run("u1", _traced(deps, _Spy(seen))) == RunStatus.DONE
    assert [type(s) for s in seen] == [RecordedSpan]  # the span current in the step
    finished = exporter.get_finished_spans()
    (step,) = _by_name(finished, "cairn.step")
    (mine,) = _by_name(finished, "app.lookup")
    (run,) = _by_name(finished, "cairn.run")
    assert mine.parent is not None and mine.parent.span_id == step.context.span_id
    assert step.parent is not None and step.parent.span_id == run.context.span_id
    sdk = tracer.start_span("the SDK's own")
    sdk.set_attributes(_ODD)
    assert step.attributes["app.tenant"] == "acme"
    assert {k: step.attributes[k] for k in _ODD} == dict(sdk.attributes)
    assert step.attributes["app.tags"] == ("a", "b")
    assert step.attributes["cairn.outcome"] == "saved" and step.attributes["cairn.seq"] == 0
    assert step.instrumentation_scope is not None and step.instrumentation_scope.name == "test"
    assert step.resource is run.resource and step.start_time < mine.start_time  # type: ignore[operator]
    assert mine.end_time <= step.end_time  # type: ignore[operator]


class _Spy(Middleware):
    """Keeps the span current when a step starts (after the tracing middleware's)."""

    def __init__(self, seen: list[Any]) -> None:
        self.seen = seen

    def before_step(self, cp: Any) -> None:
        from opentelemetry import trace

        self.seen.append(trace.get_current_span())


def test_the_applications_sampler_and_processors_see_the_loops_spans(
    deps: loop.Deps, store: PgStore, tmp_path: Path
) -> None:
    """The loop's spans go through the application's provider as the SDK's would: its
    sampler decides each (here: drop step two, by its name), its
    processors' on_start sees each recorded one, on_end each ended one."""
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

    class NotTwo(Sampler):
        def should_sample(
            self,
            parent_context: Any,
            trace_id: int,
            name: str,
            kind: Any = None,
            attributes: Any = None,
            links: Any = None,
            trace_state: Any = None,
        ) -> SamplingResult:
            two = name == "cairn.step two"
            return SamplingResult(Decision.DROP if two else Decision.RECORD_AND_SAMPLE, attributes)

        def get_description(self) -> str:
            return "NotTwo"

    class Started(SpanProcessor):
        def __init__(self) -> None:
            self.ids: list[int] = []

        def on_start(self, span: Any, parent_context: Any = None) -> None:
            self.ids.append(span.get_span_context().span_id)

    exporter, started = InMemorySpanExporter(), Started()
    provider = TracerProvider(sampler=NotTwo())
    provider.add_span_processor(started)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.use(provider.get_tracer("test"))
    try:
        store.create_run("s1", "probe", {"log": str(tmp_path / "log")})
        assert loop.run("s1", _traced(deps)) == RunStatus.DONE
    finally:
        otel.use(None)
        provider.shutdown()
    finished = exporter.get_finished_spans()
    steps = [s.attributes["cairn.cursor"] for s in _by_name(finished, "cairn.step")]
    assert steps == ["one", "mail", "ledger", "once"]  # two: dropped by the sampler
    # each span started through the processors once, the recorded ones too
    assert sorted(started.ids) == sorted(s.context.span_id for s in finished)
    (chat,) = _by_name(finished, "chat ")  # the model call inside the dropped step
    assert chat.kind.name == "CLIENT" and chat.attributes["gen_ai.usage.output_tokens"] > 0


def test_a_failed_step_records_its_exception_and_error_status(
    spans: Any, deps: loop.Deps, store: PgStore
) -> None:
    _, exporter = spans
    store.create_run("f1", "bad", {"mode": "raise"})
    loop.run("f1", _traced(deps))
    (step, *_) = _by_name(exporter.get_finished_spans(), "cairn.step")
    assert step.status.status_code.name == "ERROR" and "the step blew up" in (
        step.status.description or ""
    )
    (event,) = step.events
    assert event.name == "exception" and event.attributes is not None
    assert event.attributes["exception.type"] == "RuntimeError"
    assert "the step blew up" in str(event.attributes["exception.stacktrace"])


def test_a_recorded_span_with_no_span_above_it_starts_a_trace(spans: Any) -> None:
    from opentelemetry.context import Context

    from cairn.core.spans import Recorder

    tracer, exporter = spans
    recorder = Recorder.of(tracer)
    assert recorder is not None
    span = recorder.start("alone", Context(), {"cairn.n": 1})
    span.end()
    span.set_attribute("cairn.late", True)  # after its end: ignored, as the SDK's
    (done,) = exporter.get_finished_spans()
    assert done.parent is None and done.context.is_valid and done.context.trace_flags.sampled
    assert dict(done.attributes or {}) == {"cairn.n": 1}


class _NotTheSdks:
    """A tracer that is not the SDK's (an application's own, a vendor's): cairn starts
    its spans through start_span, as it would any tracer's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.start_as_current_span(*args, **kwargs)


def test_another_tracer_gets_the_same_spans_through_start_span(
    spans: Any, deps: loop.Deps, store: PgStore
) -> None:
    from cairn.core.spans import Recorder

    tracer, exporter = spans
    wrapped = _NotTheSdks(tracer)
    assert Recorder.of(wrapped) is None
    otel.use(wrapped)
    store.create_run("w1", "square", {"n": 4})
    assert loop.run("w1", _traced(deps)) == RunStatus.DONE
    finished = exporter.get_finished_spans()
    (step,) = _by_name(finished, "cairn.step")
    (run,) = _by_name(finished, "cairn.run")
    assert type(step).__name__ != "RecordedSpan" and step.parent.span_id == run.context.span_id  # type: ignore[union-attr]
    assert {k: step.attributes[k] for k in ("cairn.cursor", "cairn.seq", "cairn.outcome")} == {
        "cairn.cursor": "sq",
        "cairn.seq": 0,
        "cairn.outcome": "saved",
    }
