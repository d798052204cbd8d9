"""OpenTelemetry traces from real workers over OTLP/HTTP to a receiver that decodes the
protocol, with a worker killed mid-step.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import tests.helpers.flows  # noqa: F401 (probe, square)
from cairn import otel
from cairn.client.client import Client
from cairn.core.status import RunStatus
from cairn.store import Leases
from cairn.testing.otlp import TraceReceiver
from tests.helpers.runs import holder_pid, step_log, wait_for


# -- over the wire, from real workers ----------------------------------------------------
@pytest.fixture
def receiver() -> Iterator[TraceReceiver]:
    with TraceReceiver() as server:
        yield server


def test_spans_arrive_over_otlp_from_a_worker_killed_mid_step_and_its_successor(
    receiver: TraceReceiver,
    client: Client,
    start_worker: Callable[..., Any],
    start_beat: Callable[[], Any],
    worker_env: dict[str, str],
    leases: Leases,
    tmp_path: Path,
) -> None:
    """A real worker exports over OTLP/HTTP; its pool process is SIGKILLed asleep in step
    two, the worker sends the run again, and it ends. The receiver decodes one trace:
    the test's request span, the enqueue, every step (two's first attempt lost with its
    process), the model call with tokens, and the resumed delivery. Beat's passes (the
    reaper, the schedule firer) are spans of their own, each a trace."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces"))
    )
    tracer = provider.get_tracer("test")
    otel.use(tracer)
    try:
        # The worker's and beat's (which runs the reaper and the firer on its threads).
        worker_env.update(
            CAIRN_TRACING="1",
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
            OTEL_SERVICE_NAME="worker-under-test",
            OTEL_BSP_SCHEDULE_DELAY="100",
        )
        start_worker(concurrency=1)
        start_beat()
        log = tmp_path / "steps.log"
        with tracer.start_as_current_span("POST /orders") as web:
            run_id = client.enqueue("probe", {"log": str(log), "before": {"two": 60}})
        wait_for(lambda: any(c == "two" for c, *_ in step_log(log)), 30, "step two")
        # Step one's span is exported in the batch after it ended (100 ms): a process
        # killed sooner loses it, as any batching exporter would.
        wait_for(lambda: any(s["name"] == "cairn.step one" for s in receiver.spans), 10, "step one")
        pid = wait_for(lambda: holder_pid(leases, run_id), 10, "the lease holder")
        os.kill(pid, signal.SIGKILL)
        assert client.wait(run_id, timeout=60).status == RunStatus.DONE
    finally:
        otel.use(None)
        provider.shutdown()
    trace_id = f"{web.get_span_context().trace_id:032x}"

    wait_for(lambda: any(s["name"] == "cairn.run" for s in receiver.trace(trace_id)), 15, "run")
    got = receiver.trace(trace_id)
    assert {s["trace_id"] for s in receiver.spans if s["attrs"].get("cairn.run_id") == run_id} == {
        trace_id
    }  # every span of the run, from both processes, in the request's trace
    names = [s["name"] for s in got]
    assert names.count("cairn.enqueue") == 1 and "POST /orders" in names
    steps = [s["attrs"]["cairn.cursor"] for s in got if s["name"].startswith("cairn.step")]
    assert sorted(steps) == sorted(["one", "two", "mail", "ledger", "once"])
    (run,) = [s for s in got if s["name"] == "cairn.run"]  # the killed one never ended
    assert run["attrs"]["cairn.resumed"] is True and "resumed" in run["events"]
    assert run["service"] == "worker-under-test"
    (chat,) = [s for s in got if s["name"].startswith("chat ")]
    assert chat["attrs"]["gen_ai.usage.output_tokens"] > 0
    tree = receiver.tree(trace_id)
    print(tree)  # the README's rendering of a resumed run's trace comes from here
    lines = tree.splitlines()
    assert "POST /orders" in lines[0] and "cairn.enqueue" in lines[1]
    assert any("never exported: its process was killed" in line for line in lines)
    assert any("cairn.run" in line and "resumed=True" in line for line in lines)
    for name, counted in (("cairn.reap", "runs_sent"), ("cairn.schedules.fire", "runs_started")):
        wait_for(lambda n=name: any(s["name"] == n for s in receiver.spans), 15, name)
        span = next(s for s in receiver.spans if s["name"] == name)
        assert span["service"] == "worker-under-test" and span["trace_id"] != trace_id
        assert isinstance(span["attrs"][f"cairn.{counted}"], int)
