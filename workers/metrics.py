"""Prometheus metrics of the step loop, served by `cairn worker --metrics-port`.

Celery's prefork pool runs steps in child processes, so the metrics use
prometheus_client's multiprocess mode: each process writes to files under
PROMETHEUS_MULTIPROC_DIR, and the worker's main process serves their sum. The directory
must be set before prometheus_client is imported, which `cairn worker` does.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, multiprocess, start_http_server

from cairn.core.errors import Deferred, HandOff, RetryLater, Superseded, Transient
from cairn.workers.middleware import Middleware

if TYPE_CHECKING:
    from cairn.core.records import Checkpoint

STEPS = Counter("cairn_steps_total", "Steps saved.", ["workflow", "step"])
STEP_SECONDS = Histogram(
    "cairn_step_seconds",
    "Time from a step's start to its saved checkpoint.",
    ["workflow"],
    buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 2, 10, 60, 300),
)
RUNS = Counter(
    "cairn_runs_total",
    "Run task deliveries by how they ended (done, failed, deferred, lost, retry, error).",
    ["outcome"],
)
STARTED = Counter(
    "cairn_runs_started_total",
    "Runs whose first step was saved, by workflow and the saving worker's code version.",
    ["workflow", "code_version"],
)
RESUMES = Counter("cairn_resumes_total", "Runs resumed after their worker was lost.", ["workflow"])
COST = Counter("cairn_model_cost_usd_total", "Model cost counted from usage.", ["workflow"])
RATE_WAITS = Counter(
    "cairn_model_rate_waits_total", "Model calls that waited for the fleet's rate limit.", ["model"]
)
RATE_WAIT_SECONDS = Counter(
    "cairn_model_rate_wait_seconds_total",
    "Seconds model calls waited for the rate limit.",
    ["model"],
)
RATE_DEFERRED = Counter(
    "cairn_model_rate_deferred_total",
    "Model calls over the rate limit past CAIRN_RATE_WAIT_MAX: their steps retried later.",
    ["model"],
)
BUDGET_SOFT = Counter(
    "cairn_budget_soft_crossed_total",
    "Budgets whose soft limit a journaled call's cost crossed (each once).",
    ["workflow"],
)
RATE_429 = Counter(
    "cairn_model_429_total", "429 (rate limited) answers from the model API.", ["model"]
)


# Label children by label values: `labels()` validates and hashes its arguments under a
# lock on every call, a tenth of a no-op step's Python. A child is the same object every
# time (in multiprocess mode it follows a fork by itself), so caching it changes nothing
# but the cost. Workflows and steps are few, so the dict stays small.
_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *values: str) -> Any:
    key = (metric, *values)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*values)
    return child


def step_saved(workflow: str, step: str, seconds: float, cost_usd: float) -> None:
    """Count a saved step: its time from start to save, and the model cost it added."""
    _child(STEPS, workflow, step).inc()
    _child(STEP_SECONDS, workflow).observe(seconds)
    if cost_usd > 0:
        _child(COST, workflow).inc(cost_usd)


def model_rate(event: str, model: str, amount: float) -> None:
    """ModelClient's observe: a wait for the rate limit (amount: seconds), a call
    deferred past CAIRN_RATE_WAIT_MAX, or a 429 from the API."""
    if event == "wait":
        _child(RATE_WAITS, model).inc()
        _child(RATE_WAIT_SECONDS, model).inc(amount)
    elif event == "deferred":
        _child(RATE_DEFERRED, model).inc()
    elif event == "429":
        _child(RATE_429, model).inc()


def run_ended(outcome: str) -> None:
    _child(RUNS, outcome).inc()


# How a delivery that did not return a status ended, by the kind of its exception.
_OUTCOMES: tuple[tuple[type[BaseException], str], ...] = (
    (Deferred, "deferred"),
    (RetryLater, "retry"),
    (Transient, "retry"),
    (HandOff, "handed_off"),
    (Superseded, "lost"),
)


def outcome(status: str | None, exception: BaseException | None) -> str:
    """The cairn_runs_total label of a delivery: its run's status, or how it was cut."""
    if exception is None:
        return str(status)
    return next((name for kind, name in _OUTCOMES if isinstance(exception, kind)), "error")


class Metrics(Middleware):
    """The loop's Prometheus metrics, as a middleware; code_version: the worker's
    (CAIRN_CODE_VERSION), the label of the runs it starts."""

    def __init__(self, code_version: str | None = None) -> None:
        self.code_version = code_version or ""

    def resumed(self, cp: Checkpoint) -> None:
        _child(RESUMES, cp.workflow).inc()

    def budget_crossed(self, cp: Checkpoint, scope: str) -> None:
        _child(BUDGET_SOFT, cp.workflow).inc()

    def after_step(
        self,
        cp: Checkpoint,
        *,
        saved: Checkpoint | None,
        exception: BaseException | None,
        seconds: float,
    ) -> None:
        if saved is not None:
            step_saved(cp.workflow, cp.cursor, seconds, saved.cost_usd - cp.cost_usd)
            if cp.seq == 0:  # the run's first step: this version started it
                _child(STARTED, cp.workflow, self.code_version).inc()

    def after_run(
        self, run_id: str, *, status: str | None, exception: BaseException | None
    ) -> None:
        run_ended(outcome(status, exception))


def serve(port: int) -> None:
    """Expose the summed metrics of every process of this worker on :port/metrics."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    start_http_server(port, registry=registry)


def process_exited(pid: int) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(pid)
