"""A LangGraph graph (tests/lg_flows.py) run by a real worker: its interrupt answered over
HTTP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cairn.testing import fleet
from tests.conftest import wait_for

pytestmark = pytest.mark.slow


def test_an_interrupt_is_answered_over_http_and_the_graph_goes_on(
    start_worker: Callable[..., fleet.Proc], serve: Callable[..., Any]
) -> None:
    env = {"CAIRN_WORKFLOWS": "tests.lg_flows"}
    start_worker(concurrency=1, **env)
    server = serve(**env)
    with server.http() as http:
        started = http.post("/runs", json={"workflow": "lg_refund", "input": {"order": "o-7"}})
        assert started.status_code == 202, started.text
        run_id = started.json()["run_id"]

        def run() -> dict[str, Any]:
            return http.get(f"/runs/{run_id}").json()

        wait_for(lambda: run()["status"] in ("waiting", "failed"), 30, "the interrupt")
        waiting = run()
        assert waiting["status"] == "waiting", waiting["error"]
        [asked] = waiting["state"]["interrupts"]
        assert asked["value"] == {"question": "refund?", "order": "o-7"}
        sent = http.post(f"/runs/{run_id}/signals/resume", json={"payload": "approved"})
        assert sent.status_code == 202, sent.text
        wait_for(lambda: run()["status"] in ("done", "failed"), 30, "the graph to end")
        done = run()
    assert done["status"] == "done", done["error"]
    out = done["state"]["output"]
    assert out["approved"] == "approved" and out["sent"].startswith(f"cairn:{run_id}:send:")
