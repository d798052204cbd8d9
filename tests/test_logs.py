"""Structured logs (CAIRN_LOG_FORMAT=json) and the run page's trace links: the formatter
alone, then a real worker and a real `cairn serve`."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tests.flows  # noqa: F401  (registers square)
from cairn import logs
from cairn.status import RunStatus
from cairn.store.checkpoints import Checkpoint
from cairn.testing import fleet
from cairn.workers.client import Client
from tests.conftest import Server, wait_for

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TEMPLATE = "http://jaeger.test:16686/trace/{trace_id}"
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


# -- a real worker and a real server -------------------------------------------------------
def test_a_json_worker_writes_every_log_line_as_json_with_the_run_id(
    start_worker: Callable[..., fleet.Proc], client: Client, send: Callable[[str], None]
) -> None:
    worker = start_worker(concurrency=1, CAIRN_LOG_FORMAT="json")
    run_id = client.enqueue("square", {"n": 2})
    assert client.wait(run_id, timeout=60).status == RunStatus.DONE
    # Delivered again once done, the run is logged as such: a line about this run.
    send(run_id)
    wait_for(
        lambda: any(line.get("action") == "stopped" for line in _lines(worker.text())),
        30,
        "the worker's line about the finished run",
    )
    text = worker.text()
    lines = _lines(text)
    (stopped,) = [line for line in lines if line.get("action") == "stopped"]
    assert stopped["run_id"] == run_id and stopped["seq"] == 1 and stopped["cursor"] == "done"
    assert stopped["logger"] == "cairn.workers.loop" and stopped["level"] == "INFO"
    assert stopped["pid"] in worker.children()  # a pool process's line
    # Celery's own lines (ready, task received) are JSON too: none in its text format.
    assert any(line["message"].endswith(" ready.") for line in lines)
    assert any("received" in line["message"] for line in lines)
    assert not [t for t in text.splitlines() if CELERY_TEXT.match(t)]


def test_a_json_beat_logs_json_lines(worker_env: dict[str, str], tmp_path: Path) -> None:
    env = {**worker_env, "CAIRN_LOG_FORMAT": "json"}
    beat = fleet.start_beat(env, tmp_path / "beat.log", tmp_path / "schedule", wait=60)
    try:
        lines = _lines(beat.text())
        assert any(line["message"].startswith("Scheduler: Sending due task") for line in lines)
        assert all(line["logger"].startswith("celery") for line in lines)
        assert not [t for t in beat.text().splitlines() if CELERY_TEXT.match(t)]
    finally:
        beat.kill()


def _page(server: Server, run_id: str) -> str:
    with server.http() as http:
        response = http.get(f"/ui/runs/{run_id}")
    assert response.status_code == 200, response.text
    return response.text


def test_the_run_page_links_the_run_and_each_step_to_its_trace(
    serve: Callable[..., Server],
    start_worker: Callable[..., fleet.Proc],
    client: Client,
    sql: Callable[..., list[tuple[Any, ...]]],
) -> None:
    start_worker(concurrency=1)
    traced, untraced = client.enqueue("square", {"n": 3}), client.enqueue("square", {"n": 4})
    for run_id in (traced, untraced):
        assert client.wait(run_id, timeout=60).status == RunStatus.DONE
    sql("UPDATE runs SET traceparent = %s WHERE run_id = %s", TRACEPARENT, traced)
    link = f'href="{TEMPLATE.format(trace_id=TRACE_ID)}"'

    linked = serve(CAIRN_TRACE_URL_TEMPLATE=TEMPLATE)
    page = _page(linked, traced)
    assert 'id="trace"' in page and TRACE_ID[:16] in page
    # The header card's link, and one per step row (square has one step, sq).
    assert len(client.history(traced)) == 1 and page.count(link) == 2
    # Enqueued untraced: the trace its traced deliveries derive from its run id.
    derived = f"{logs.run_trace(untraced)[0]:032x}"
    assert f'href="{TEMPLATE.format(trace_id=derived)}"' in _page(linked, untraced)

    unset = _page(serve(), traced)  # no CAIRN_TRACE_URL_TEMPLATE: no link
    assert "jaeger.test" not in unset and 'id="trace"' not in unset


def test_cairn_serve_logs_json_lines(serve: Callable[..., Server]) -> None:
    server = serve(CAIRN_LOG_FORMAT="json")
    wait_for(
        lambda: any("startup complete" in line["message"] for line in _lines(server.proc.text())),
        30,
        "uvicorn's start-up line",
    )
    lines = _lines(server.proc.text())
    assert {line["logger"] for line in lines} >= {"uvicorn.error"}
    assert all(line["pid"] == server.proc.pid for line in lines)
    assert not any("color_message" in line for line in lines)  # uvicorn's, with escapes
