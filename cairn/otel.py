"""OpenTelemetry traces of runs (CAIRN_TRACING=1, the `otel` extra): one trace per run,
whatever happens to its workers. `setup` starts tracing from the OTEL_* environment (the
workers and the server call it); `use(tracer)` hands cairn an application's own tracer
(a test's in-memory one, say); `Tracing` is the workers' middleware that makes the run,
step and call spans. The glue is cairn.core.tracing, the spans cairn.workers.tracing.
"""

from cairn.core.tracing import active, setup, traceparent, use
from cairn.workers.tracing import Tracing

__all__ = ["Tracing", "active", "setup", "traceparent", "use"]
