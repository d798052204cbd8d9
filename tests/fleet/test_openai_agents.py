"""OpenAI Agents SDK agents (tests/helpers/oa_flows.py) on real Celery workers: a worker
SIGKILLed in the middle of an agent's run, and the run finished by another one without
asking the model or sending the email again."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cairn.store import PgStore
from cairn.testing import fleet
from cairn.testing.standins import MailServer, ModelServer
from tests.helpers.oa_flows import PLAN
from tests.helpers.runs import wait_for
from tests.helpers.services import LEASE_TTL


def test_an_agent_run_whose_worker_was_killed_mid_tool_finishes_elsewhere_asking_nothing_twice(
    start_worker: Callable[..., fleet.Proc],
    start_beat: Callable[[], fleet.Proc],
    store: PgStore,
    client: Any,
    mail: MailServer,
    model: ModelServer,
    tmp_path: Path,
) -> None:
    """A is SIGKILLed inside the agent's first tool call, after its first model request
    was journaled; B takes the run over once A's lease expired: it replays that request
    from the journal, runs the tool again (it never returned), and makes the three
    requests and the keyed email A never made."""
    env = {"CAIRN_WORKFLOWS": "tests.helpers.oa_flows", "OPENAI_BASE_URL": model.openai_url}
    a = start_worker(concurrency=1, **env)
    marker = tmp_path / "paused"
    run_id = client.enqueue(
        "oa_support",
        {
            "prompt": f"TOOLS: {PLAN}\nWhy was I charged twice?",
            "pause": {"seconds": 60, "marker": str(marker)},
        },
    )
    wait_for(marker.exists, 30, "A in its first tool call")
    assert model.stats()["requests"] == 1
    a.signal_all(signal.SIGKILL)
    start_worker(concurrency=1, **env)
    start_beat()  # the reaper sends the run again once A's lease has expired
    wait_for(lambda: store.load(run_id).status == "done", LEASE_TTL + 60, "B to finish")
    run = store.get(run_id)
    assert run is not None and run.state["agent"] == "billing"
    assert model.stats()["requests"] == 4  # A's first, replayed by B; B's three
    names = [c.name for c in store.journal(run_id, "agent", 0)]
    assert names == ["model", "tool:lookup", "model", "tool:notify", "model", "model"]
    key = f"cairn:{run_id}:agent:0:tool:notify:0"
    assert [m["idempotency_key"] for m in mail.messages()] == [key]
