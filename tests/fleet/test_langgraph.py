"""LangGraph graphs (tests/helpers/lg_flows.py) run by real workers: an interrupt answered
over HTTP, and a tool-calling agent killed by `cairn chaos` at every call boundary."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from cairn.store.admin import drop_database, execute, with_path
from cairn.testing import chaos, fleet
from tests.helpers.chaos import CHAOS_DB, SEED
from tests.helpers.runs import wait_for


def test_an_interrupt_is_answered_over_http_and_the_graph_goes_on(
    start_worker: Callable[..., fleet.Proc], serve: Callable[..., Any]
) -> None:
    env = {"CAIRN_WORKFLOWS": "tests.helpers.lg_flows"}
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


PROMPT = "TOOLS: lookup, notify, remember\nCustomer {i} asks for help."


def test_a_langgraph_agent_survives_kills_at_every_call_and_node(
    template_db: str, redis_url: str, tmp_path: Path
) -> None:
    """A tool-calling graph (tests/helpers/lg_flows.py): four model calls and three tools (a
    lookup, a keyed email, a ledger row through ctx.db) a run, each a journaled call in
    its node's scope, killed before and after calls (one point in five) and between steps:
    every run done, each call recorded once, each email delivered once, each row written
    once."""
    runs = 20
    report = chaos.run_chaos(
        "lg_support",
        runs=runs,
        workers=2,
        concurrency=2,
        pool="prefork",
        seed=SEED,
        # One call a node: each node's scope has call 0 only, so a kill point is hit once
        # a run; one in five makes kills both before and after calls at this size.
        rate=0.2,
        random_kills=1,
        lease_ttl=2.0,
        deadline=240,
        pending_after=20,
        mail_delay_ms=5,
        model_delay_ms=0,
        workflows="tests.helpers.lg_flows",
        input={"messages": [{"role": "user", "content": PROMPT}]},
        keep=True,  # for the ledger rows, read below
        database_url=CHAOS_DB,
        redis_url=redis_url,
        state_dir=tmp_path,
        quiet=True,
    )
    db_name = report["database"].split(" ")[0]
    try:
        rows = execute(
            with_path(CHAOS_DB, db_name),
            "SELECT count(*) AS n, count(DISTINCT run_id) AS runs FROM invoice_ledger"
            " WHERE idempotency_key LIKE %s",
            ("%:remember:0",),
        )
    finally:
        drop_database(CHAOS_DB, db_name)
    assert report["ok"], report["problems"]
    assert report["runs_finished"] == runs and report["duplicates"] == 0
    kills = report["kills"]
    assert kills["before_call"] >= 1 and kills["after_call"] >= 1, kills
    assert report["journaled"] == {"model": 4 * runs, "lookup": runs, "notify": runs,
                                   "remember": runs}  # fmt: skip
    model = report["model"]
    assert model["excess"] == 0
    assert model["journaled"] <= model["requests"] <= model["journaled"] + report["kills_total"]
    graph = next(s for s in report["steps"] if s["step"] == "graph")
    assert graph["delivered"] == graph["keys"] == runs and graph["max_per_key"] == 1
    assert rows == [{"n": runs, "runs": runs}]  # one ctx.db row a run: none lost, none twice
