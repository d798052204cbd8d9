"""Structured logs (CAIRN_LOG_FORMAT=json): the formatter alone, and the lines a delivery
logs. From a real worker, beat and `cairn serve`: tests/fleet/test_logs.py."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tests.helpers.flows  # noqa: F401  (registers square)
from cairn.core import logs
from cairn.core.records import Checkpoint
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.steps.context import Context
from cairn.steps.registry import StepResult, workflow
from cairn.store import Leases, PgStore
from cairn.workers import celerylog, loop

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
# Celery's own text format: "[2025-01-01 12:00:00,000: INFO/MainProcess] ..."
CELERY_TEXT = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+: [A-Z]+/")


@pytest.fixture
def emit() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger whose one handler writes JSON lines to a buffer."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("cairn.test_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, out
    logger.removeHandler(handler)


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _cp() -> Checkpoint:
    return Checkpoint(
        run_id="r-1", workflow="square", input={}, seq=3, cursor="sq", state={}, visits={},
        window=(), win_start=0, cost_usd=0.0, epoch=7,
    )  # fmt: skip


# -- the formatter -------------------------------------------------------------------------
def test_a_record_is_one_json_line_with_its_cairn_fields(emit) -> None:
    logger, out = emit
    when = dt.datetime(2025, 1, 2, tzinfo=dt.UTC)
    logger.warning(
        "run %s: retry %d",
        "r-1",
        2,
        extra=logs.at(_cp(), "retry", attempt=2, lost=None, due=when),
    )
    (text,) = out.getvalue().splitlines()
    line = json.loads(text)
    assert line["level"] == "WARNING" and line["logger"] == "cairn.test_logs"
    assert line["message"] == "run r-1: retry 2"  # the sentence, formatted
    stamp = dt.datetime.fromisoformat(line["ts"])
    assert stamp.utcoffset() == dt.timedelta(0)
    assert abs((dt.datetime.now(dt.UTC) - stamp).total_seconds()) < 60
    fields = {k: line[k] for k in logs.FIELDS}
    assert fields == {"run_id": "r-1", "cursor": "sq", "seq": 3, "epoch": 7, "action": "retry"}
    assert line["attempt"] == 2 and line["pid"] == os.getpid()
    assert line["due"] == str(when)  # not JSON: its str
    assert "lost" not in line  # None is left out
    assert "exception" not in line and "trace_id" not in line  # no exception, no span
    assert list(line)[:10] == ["ts", "level", "logger", "message", *logs.FIELDS, "attempt"]


def test_a_line_not_about_a_run_is_json_too(emit) -> None:
    logger, out = emit
    logger.info("sweep: %d runs deleted", 5, extra=logs.run(None, "sweep", deleted=5))
    logger.info("plain, %s", {"no": "extras"})
    swept, plain = _lines(out.getvalue())
    assert swept["action"] == "sweep" and swept["deleted"] == 5 and "run_id" not in swept
    assert plain["message"] == "plain, {'no': 'extras'}" and "action" not in plain


def test_an_extra_never_hides_the_message_and_odd_values_still_make_a_line(emit) -> None:
    logger, out = emit
    logger.info("the sentence", extra={"level": "mine", "odd": {(1, 2): "tuple key"}})
    (line,) = _lines(out.getvalue())
    assert line["level"] == "INFO" and line["message"] == "the sentence"
    assert line["odd"] == str({(1, 2): "tuple key"})  # not JSON-able as is: its str


def test_an_exception_is_in_the_line(emit) -> None:
    logger, out = emit
    try:
        raise ZeroDivisionError("nothing to share")
    except ZeroDivisionError:
        logger.exception("run %s step raised", "r-2", extra=logs.run("r-2", "step_raised"))
    (line,) = _lines(out.getvalue())
    assert line["run_id"] == "r-2" and line["level"] == "ERROR"
    assert line["exception"].startswith("Traceback (most recent call last):")
    assert "ZeroDivisionError: nothing to share" in line["exception"]


def test_the_current_span_gives_the_trace_and_span_ids(emit) -> None:
    pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace import TracerProvider

    logger, out = emit
    tracer = TracerProvider().get_tracer("tests")  # not the global provider: no leftovers
    with tracer.start_as_current_span("cairn.step") as span:
        logger.info("inside", extra=logs.at(_cp(), "step"))
    logger.info("after")
    inside, after = _lines(out.getvalue())
    ctx = span.get_span_context()
    assert inside["trace_id"] == format(ctx.trace_id, "032x")
    assert inside["span_id"] == format(ctx.span_id, "016x")
    assert "trace_id" not in after and "span_id" not in after


# -- trace_id_of ---------------------------------------------------------------------------
def test_trace_id_of_a_traceparent() -> None:
    assert logs.trace_id_of(TRACEPARENT) == TRACE_ID
    assert logs.trace_id_of(None) is None
    for bad in (
        "",
        "garbage",
        TRACE_ID,
        TRACEPARENT.upper(),  # W3C: lowercase hex only
        TRACEPARENT[:-1],
        TRACEPARENT + "-00",
        f"00-{'0' * 32}-00f067aa0ba902b7-01",  # the invalid all-zero trace id
        " " + TRACEPARENT,
    ):
        assert logs.trace_id_of(bad) is None, bad


# -- a run's lines (cairn.workers.runlog), in process -----------------------------------
parks = workflow("logs_parks")  # four steps, then a wait; woken, one more


@parks.step()
def tick(ctx: Context) -> StepResult:
    n = ctx.state.get("n", 0) + 1
    if n < 4:
        return StepResult(cursor="tick", state={"n": n})
    return StepResult.wait("go", cursor="last", state={"n": n})


@parks.step()
def last(ctx: Context) -> StepResult:
    return StepResult(cursor="done", cost_usd=0.25)


def _about(records: list[logging.LogRecord], run_id: str) -> list[logging.LogRecord]:
    return [r for r in records if getattr(r, "run_id", None) == run_id]


def test_a_delivery_logs_its_start_and_stop_at_info_and_each_step_at_debug(
    caplog: pytest.LogCaptureFixture, settings: Settings, store: PgStore, leases: Leases
) -> None:
    deps = loop.Deps(settings=settings, store=store, leases=leases, model=None)
    store.create_run("parks-1", "logs_parks", {})
    with caplog.at_level(logging.DEBUG, logger="cairn.workers.runlog"):
        assert loop.run("parks-1", deps) == RunStatus.WAITING
    started, *steps, stopped = _about(caplog.records, "parks-1")
    assert [r.levelno for r in (started, stopped)] == [logging.INFO, logging.INFO]
    assert (
        started.getMessage() == "run parks-1 (logs_parks) starts at its first step (seq 0, epoch 1)"
    )
    assert (started.action, started.workflow, started.cursor, started.seq, started.epoch) == (  # type: ignore[attr-defined]
        "started", "logs_parks", "", 0, 1,
    )  # fmt: skip
    assert [(r.levelno, r.action, r.cursor, r.seq, r.next) for r in steps] == [  # type: ignore[attr-defined]
        (logging.DEBUG, "step", "tick", seq, "last" if seq == 3 else "tick") for seq in range(4)
    ]
    fields = {k: getattr(stopped, k) for k in ("action", "workflow", "cursor", "seq", "epoch")}
    assert fields == {
        "action": "stopped",
        "workflow": "logs_parks",
        "cursor": "last",
        "seq": 4,
        "epoch": 1,
    }
    assert (stopped.status, stopped.steps, stopped.cost_usd, stopped.resumes) == (
        "waiting",
        4,
        0.0,
        0,
    )  # type: ignore[attr-defined]
    assert 0 <= stopped.seconds < 30  # type: ignore[attr-defined]
    assert stopped.getMessage().startswith("run parks-1 (logs_parks) waiting: 4 step(s) in ")

    caplog.clear()
    store.signal("parks-1", "go", {}, "s-1")
    with caplog.at_level(logging.INFO, logger="cairn.workers.runlog"):  # no step lines
        assert loop.run("parks-1", deps) == RunStatus.DONE
        assert loop.run("parks-1", deps) == RunStatus.DONE  # delivered again: nothing to do
    woke, ended, again = _about(caplog.records, "parks-1")
    assert woke.getMessage().startswith("run parks-1 (logs_parks) wakes at 'last' (seq 4, epoch 2)")
    assert (ended.status, ended.steps, ended.seq, ended.cursor, ended.cost_usd) == (
        "done",
        1,
        5,
        "done",
        0.25,
    )  # type: ignore[attr-defined]
    assert (again.action, again.status, again.steps, again.seq) == ("stopped", "done", 0, 5)  # type: ignore[attr-defined]
    assert "done, nothing to do: 0 step(s)" in again.getMessage()


def test_celery_s_lines_about_cairn_s_tasks_are_debug(caplog: pytest.LogCaptureFixture) -> None:
    from celery.app.trace import LOG_RECEIVED, LOG_SUCCESS

    trace, beat = logging.getLogger("celery.app.trace"), logging.getLogger("celery.beat")
    routine = celerylog.Routine()  # what create_app puts on these loggers
    for logger in (trace, beat):
        logger.addFilter(routine)
    try:
        with caplog.at_level(logging.INFO):
            trace.info(
                LOG_SUCCESS, {"name": "cairn.reap", "id": "1", "runtime": 0, "return_value": 0}
            )
            trace.info(LOG_RECEIVED, {"name": "someone.elses", "id": "2"})
            beat.info("Scheduler: Sending due task %s (%s)", "s", "cairn.schedules.fire")
            beat.info("Scheduler: Sending due task %s (%s)", "theirs", "someone.elses")
        assert [r.getMessage() for r in caplog.records] == [
            "Task someone.elses[2] received",
            "Scheduler: Sending due task theirs (someone.elses)",
        ]
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            trace.info(LOG_RECEIVED, {"name": "cairn.run", "id": "3"})
        (record,) = caplog.records
        assert record.levelname == "DEBUG" and record.getMessage() == "Task cairn.run[3] received"
    finally:
        for logger in (trace, beat):
            logger.removeFilter(routine)


def test_json_lines_turn_each_printed_line_into_a_json_line(tmp_path: Path) -> None:
    path = tmp_path / "out"
    with path.open("wb") as out:
        lines = logs.JsonLines(out.fileno(), "celery.apps.worker")
        print("\nworker: Warm shutdown", file=lines, end="")
        print(" (MainProcess)\n\nand another", file=lines)
        assert lines.fileno() is None  # Celery's safe_say writes nothing to the fd itself
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first["message"] == "worker: Warm shutdown (MainProcess)" and first["level"] == "INFO"
    assert first["logger"] == "celery.apps.worker" and first["pid"] == os.getpid()
    assert second["message"] == "and another"
