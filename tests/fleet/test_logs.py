"""Structured logs (CAIRN_LOG_FORMAT=json) of a real worker, beat and `cairn serve`, and the
run page's trace links.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tests.helpers.flows  # noqa: F401  (registers square)
from cairn.client.client import Client
from cairn.core import logs
from cairn.core.status import RunStatus
from cairn.testing import fleet
from tests.helpers.runs import Server, wait_for

TEMPLATE = "http://jaeger.test:16686/trace/{trace_id}"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def _lines(text: str) -> list[dict[str, Any]]:
    """The JSON lines of a process's output."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


# -- a real worker, beat and server ---------------------------------------------------------
def _every_line(text: str) -> list[dict[str, Any]]:
    """Each line of a process's stdout and stderr, parsed: a line that is not JSON fails."""
    return [json.loads(line) for line in text.splitlines()]


def test_a_json_worker_at_info_logs_a_run_in_two_lines_and_only_json_lines(
    start_worker: Callable[..., fleet.Proc], client: Client, send: Callable[[str], None]
) -> None:
    worker = start_worker(concurrency=1, CAIRN_LOG_FORMAT="json")
    run_id = client.enqueue("loop", {"visits": 4})  # four steps
    assert client.wait(run_id, timeout=60).status == RunStatus.DONE

    def about() -> list[dict[str, Any]]:
        return [line for line in _lines(worker.text()) if line.get("run_id") == run_id]

    wait_for(lambda: len(about()) >= 2, 30, "the run's stop line")
    started, stopped = about()
    for line in (started, stopped):
        assert line["logger"] == "cairn.workers.runlog" and line["level"] == "INFO"
        assert line["workflow"] == "loop" and line["epoch"] == 1
        assert line["pid"] in worker.children()  # a pool process's line
    assert (started["action"], started["cursor"], started["seq"]) == ("started", "", 0)
    assert (stopped["action"], stopped["cursor"], stopped["seq"]) == ("stopped", "done", 4)
    assert (stopped["status"], stopped["steps"], stopped["resumes"]) == ("done", 4, 0)
    assert stopped["cost_usd"] == 0 and stopped["seconds"] >= 0

    send(run_id)  # delivered again once done: a stop line, nothing to do
    wait_for(lambda: len(about()) == 3, 30, "the line about the finished run")
    assert (about()[2]["action"], about()[2]["steps"]) == ("stopped", 0)
    worker.proc.terminate()  # a warm shutdown: Celery prints a line, as JSON here
    worker.proc.wait(60)
    lines = _every_line(worker.text())
    assert any(line["message"].endswith(" ready.") for line in lines)
    assert any(line["message"] == "worker: Warm shutdown (MainProcess)" for line in lines)
    # Celery's lines per task (received, succeeded) are DEBUG: at INFO, none.
    assert not [line for line in lines if "cairn.run[" in line["message"]]


def test_a_json_beat_with_nothing_to_do_logs_nothing_after_its_start(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**worker_env, "CAIRN_LOG_FORMAT": "json", "CAIRN_SCHEDULE_TICK": "0.5"}
    beat = fleet.start_beat(env, tmp_path / "beat.log", tmp_path / "schedule", wait=60)
    try:
        # Its start: the ready line, and the dispatcher's (a thread of its own: either first).
        wait_for(lambda: "dispatcher: listening" in beat.text(), 30, "beat's dispatcher")
        begun = len(beat.text().splitlines())
        # A pass of the reaper every 0.5 s (worker_env) and of the schedules: each sent
        # many times over, each a DEBUG line.
        time.sleep(4)
        assert beat.text().splitlines()[begun:] == []
        beat.proc.terminate()
        beat.proc.wait(30)
        lines = _every_line(beat.text())  # its start and stop too: JSON lines only
        assert [line["level"] for line in lines] == ["INFO"] * len(lines)
        assert any(line.get("action") == "beat_ready" for line in lines)
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
