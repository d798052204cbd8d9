"""pydantic-ai agents (tests/helpers/pai_flows.py) on real Celery workers: killed by `cairn
chaos` at every call boundary on both pools, and paused past their lease (SIGSTOP)
mid-agent."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cairn.store import Leases, PgStore
from cairn.store.admin import drop_database, execute, with_path
from cairn.testing import chaos, fleet
from cairn.testing.standins import MailServer, ModelServer
from tests.helpers.chaos import CHAOS_DB, SEED
from tests.helpers.pai_flows import PLAN
from tests.helpers.runs import holder_pid, wait_for
from tests.helpers.services import LEASE_TTL

PROMPT = f"TOOLS: {PLAN}\nCustomer {{i}} asks for help."
TOOLS = [t.strip() for t in PLAN.split(",")]


@pytest.mark.parametrize(("pool", "runs"), [("prefork", 46), ("threads", 6)])
def test_agent_runs_survive_kills_at_every_call(
    pool: str, runs: int, template_db: str, redis_url: str, tmp_path: Path
) -> None:
    """Five model requests and four tool calls (a lookup twice, a keyed email, a ledger row
    through ctx.db) per run, killed before and after calls (one point in ten) and between
    steps: every run done, each request and tool recorded once, the model asked again only
    for requests a kill cut short, each email delivered once, each ledger row written once."""
    report = chaos.run_chaos(
        "pai_support",
        runs=runs,
        workers=2,
        concurrency=2,
        pool=pool,
        seed=SEED,
        rate=0.1,
        random_kills=1,
        lease_ttl=2.0,
        deadline=300,
        pending_after=20,
        mail_delay_ms=5,
        model_delay_ms=0,
        workflows="tests.helpers.pai_flows",
        keep=True,  # for the ledger rows, read below
        input={"prompt": PROMPT},
        database_url=CHAOS_DB,
        redis_url=redis_url,
        state_dir=tmp_path,
        quiet=True,
    )
    assert report["ok"], report["problems"]
    assert report["runs_finished"] == runs and report["duplicates"] == 0
    kills = report["kills"]
    assert kills["before_call"] >= 1 and kills["after_call"] >= 1, kills
    journaled = {name.split("__")[-1]: n for name, n in report["journaled"].items()}
    assert journaled == {
        "model.request": 5 * runs,
        **{f"<agent>.call_tool:{t}": TOOLS.count(t) * runs for t in set(TOOLS)},
    }
    model = report["model"]
    assert model["excess"] == 0
    assert model["journaled"] <= model["requests"] <= model["journaled"] + report["kills_total"]
    agent = next(s for s in report["steps"] if s["step"] == "agent")
    assert agent["delivered"] == agent["keys"] == runs and agent["max_per_key"] == 1
    db_name = report["database"].split(" ")[0]
    try:
        rows = execute(
            with_path(CHAOS_DB, db_name),
            "SELECT count(*) AS n, count(DISTINCT run_id) AS runs FROM invoice_ledger"
            " WHERE idempotency_key LIKE %s",
            ("%call_tool:remember:0",),
        )
    finally:
        drop_database(CHAOS_DB, db_name)
    assert rows == [{"n": runs, "runs": runs}]  # one ctx.db row a run: none lost, none twice


def test_a_zombie_agent_makes_no_request_and_no_effect_after_the_new_owner_took_over(
    start_worker: Callable[..., fleet.Proc],
    start_beat: Callable[[], fleet.Proc],
    store: PgStore,
    leases: Leases,
    client: Any,
    mail: MailServer,
    model: ModelServer,
    sql: Any,
    tmp_path: Path,
) -> None:
    """A pauses inside the agent's first tool call, after its first model request, past
    its lease (SIGSTOP); B takes the run over and finishes it; A, resumed, must record
    nothing, ask the model nothing and send nothing."""
    env = {"CAIRN_WORKFLOWS": "tests.helpers.pai_flows"}
    a = start_worker(concurrency=1, **env)
    marker = tmp_path / "paused"
    run_id = client.enqueue(
        "pai_support",
        {
            "prompt": PROMPT.format(i=0),
            "pause": {"seconds": 2 * LEASE_TTL + 2, "marker": str(marker)},
        },
    )
    wait_for(marker.exists, 30, "A in its first tool call")
    zombie = holder_pid(leases, run_id)
    a.signal_all(signal.SIGSTOP)
    start_worker(concurrency=1, **env)
    start_beat()  # the reaper sends the run again once A's lease has expired
    wait_for(lambda: store.load(run_id).status == "done", LEASE_TTL + 40, "B to finish")
    finished = store.load(run_id)
    assert model.stats()["requests"] == 5  # A's first, replayed by B; B's four
    a.signal_all(signal.SIGCONT)
    wait_for(lambda: "another worker owns this run" in a.text(), 20, "A to stop")
    time.sleep(1.0)
    assert store.load(run_id) == finished
    assert holder_pid(leases, run_id) != zombie
    assert model.stats()["requests"] == 5
    assert mail.stats()["deliveries"] == 1 and mail.stats()["attempts"] == 1
    rows = sql("SELECT count(*) FROM invoice_ledger WHERE run_id = %s", run_id)
    assert rows == [(1,)]
    assert finished.state["output"]  # the agent's answer is the run's result


def test_an_approval_over_http_resumes_a_waiting_agent_on_a_worker(
    start_worker: Callable[..., fleet.Proc],
    serve: Callable[..., Any],
    model: ModelServer,
) -> None:
    """The model asks for a refund that needs approval: the run waits holding no worker,
    with the pending call in its state; POST /runs/{id}/signals/approval resumes it."""
    start_worker(concurrency=1, CAIRN_WORKFLOWS="tests.helpers.pai_flows")
    server = serve(CAIRN_WORKFLOWS="tests.helpers.pai_flows")
    with server.http() as http:
        started = http.post(
            "/runs",
            json={"workflow": "pai_refunds", "input": {"prompt": "TOOLS: refund\nRefund me."}},
        )
        assert started.status_code == 202, started.text
        run_id = started.json()["run_id"]

        def status() -> str:
            return http.get(f"/runs/{run_id}").json()["status"]

        wait_for(lambda: status() in ("waiting", "failed"), 30, "the run to wait")
        run = http.get(f"/runs/{run_id}").json()
        assert run["status"] == "waiting", run["error"]
        [pending] = run["state"]["pending"]["approvals"]
        assert pending["tool_name"] == "refund"
        approval = {"approvals": {pending["tool_call_id"]: True}}
        sent = http.post(f"/runs/{run_id}/signals/approval", json={"payload": approval})
        assert sent.status_code == 202, sent.text
        wait_for(lambda: status() in ("done", "failed"), 30, "the run to finish")
        run = http.get(f"/runs/{run_id}").json()
    assert run["status"] == "done", run["error"]
    assert run["state"]["output"] and run["state"]["pending"] is None
    # Two requests: the one that asked for the refund, the one after it ran.
    assert model.stats()["requests"] == 2
    calls = [c["name"] for c in http_calls(server, run_id)]
    assert calls[-2:] == [
        "pai_refunds__function_toolset__<agent>.call_tool:refund",
        "pai_refunds__model.request",
    ]


def http_calls(server: Any, run_id: str) -> list[dict[str, Any]]:
    with server.http() as http:
        return http.get(f"/runs/{run_id}/calls").json()["calls"]


def test_agents_side_by_side_on_the_threads_pool_share_one_model_client(
    template_db: str, redis_url: str, tmp_path: Path
) -> None:
    """Four runs at a time in one threads worker, the agent's one AsyncAnthropic client
    shared by all (as a module global is): no request fails and none is made twice. (With
    an event loop per pool thread, a connection opened on one loop and reused on another
    failed, and the SDK asked again.)"""
    report = chaos.run_chaos(
        "pai_support",
        runs=16,
        workers=1,
        concurrency=4,
        pool="threads",
        seed=SEED,
        rate=0.0,
        random_kills=0,
        lease_ttl=5.0,
        deadline=120,
        mail_delay_ms=5,
        model_delay_ms=20,
        workflows="tests.helpers.pai_flows",
        input={"prompt": PROMPT},
        database_url=CHAOS_DB,
        redis_url=redis_url,
        state_dir=tmp_path,
        quiet=True,
    )
    assert report["ok"], report["problems"]
    assert report["runs_finished"] == 16
    assert report["model"]["requests"] == report["model"]["journaled"] == 5 * 16
