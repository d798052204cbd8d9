"""Every named query in store/sql/*.sql that touches a per-run table finds its rows by the
run (run_id, or the key its table is distributed by), or is a scan named below with why.
That is what lets cairn spread over shards with run_id as the distribution column (Citus:
docs/explanation/scale.md): a keyed query is routed to one shard; a scan is a fan-out,
fine for the reaper's and the sweep's passes and an operator's list, never a step's."""

from __future__ import annotations

import re
from pathlib import Path

from cairn.store.sql import _parse, sql_text

ROOT = Path(__file__).resolve().parents[2]

# The tables whose rows belong to one run (or one graph thread, one agent session), and
# the column a shard would be chosen by. The others are small and global (run_counts,
# run_count_deltas, concurrency_keys, schedules): reference tables on Citus.
KEYED = {
    "runs": "run_id",
    "checkpoints": "run_id",
    "window_messages": "run_id",
    "effects": "run_id",
    "signals": "run_id",
    "step_history": "run_id",
    "journal": "run_id",
    "gathers": "parent_id",
    "slots": "run_id",
    "queued": "run_id",
    "graph_checkpoints": "thread_id",
    "graph_blobs": "thread_id",
    "graph_writes": "thread_id",
    "agent_session_items": "session_id",
    "approvals": "run_id",
}

# A parameter that names one run (or a list of them), a thread or a session.
_KEY_PARAM = r"%\((?:run_id|run_ids|origin|thread_id|thread_ids|session_id|source|target)\)s"
_KEYED = re.compile(
    # a filter on the key: run_id = %(run_id)s, thread_id = ANY(%(thread_ids)s)
    rf"\b(?:\w+\.)?(?:run_id|thread_id|session_id)\s*=\s*(?:ANY\s*\(\s*)?{_KEY_PARAM}"
    # or a row made for one run: VALUES (%(run_id)s, ...), SELECT %(session_id)s, ...
    rf"|(?:VALUES\s*\(|SELECT)\s*{_KEY_PARAM}"
)

# The scans: queries over many runs, each with why it may be one; docs/explanation/scale.md
# names each (a test below holds it to that) and shows the reaper's, the wake pass's and
# the sweep's plans.
SCANS = {
    "admitted": "a concurrency key's slots (workflow, key): a key's runs are many runs",
    "was_done": "the ledger by effect key, a global idempotency key (Citus: with run_id)",
    "intent_state": "the ledger by effect key, as was_done",
    "children": "a run's children by parent_id (Citus: a fan-out, or shard by root run)",
    "forks": "a run's forks by forked_from (the run page's, rare)",
    "list_runs": "the operator's and the API's list, newest first: a page over all runs",
    "list_runs_by_status": "list_runs filtered by status: a page over all runs",
    "list_runs_of_tenant": "a tenant's list: a page over its runs (runs_tenant_newest)",
    "count_by_status_of_tenant": "a tenant's counts by status: its runs, counted",
    "replayable": "Client.replay's pick: a workflow's stopped runs in a time window",
    "replay": "Client.replay: re-arms the runs replayable picks",
    "live_cursors": "cairn db check: where every live run stands, once per deploy",
    "stalled": "the reaper's walk: a page of the runs a worker took, and forgotten signals",
    "unclaimed_count": "the reaper: pending runs no worker took, counted (checkpoints_untaken)",
    "unclaimed": "the reaper: a page of the pending runs no worker took, oldest first",
    "unchanged": "the reaper's second look: its own list of run ids, each by primary key",
    "pinned_runs": "the reaper's orphan report, deploy status: pinned runs per version",
    "wake": "the wake pass: waiting runs whose time came, on checkpoints_waiting",
    "sweep": "retention: terminal runs past the horizon, then their rows by run_id",
    "graph_delete_for_runs": "retention of a LangGraph run's checkpoints by metadata run_id",
    "approvals_newest": "the approvals inbox: a page of the pending requests of all runs",
    "approvals_oldest": "approvals_newest, oldest first",
    "approval": "one approval by its id, which names no run (Citus: a fan-out of one row)",
    "decide": "a decision by the approval's id; its run's signal is written by that row's run_id",
    "budget_release": "a budget check: the holds of the budget's tree (its scope), not one run's",
    "raise_budget": "a raised budget re-arms its tree's runs stopped over it (runs_budgets)",
    "rearm_tenant_budget": "a tenant's budget set re-arms its runs stopped over budget",
    "roll_tenant_budgets": "the wake pass re-arms the runs stopped over a tenant's last period",
}


def _queries() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in sorted((ROOT / "store" / "sql").glob("*.sql")):
        if path.name == "schema.sql":
            continue
        for name, query in _parse(sql_text(path.name)).items():
            assert name not in found, f"{name} is named twice in store/sql"
            found[name] = query
    return found


def _tables(query: str) -> set[str]:
    named = re.findall(r"\b(?:FROM|JOIN|INTO|UPDATE|USING)\s+(\w+)", query, re.IGNORECASE)
    return {t for t in named if t in KEYED}


def test_every_query_on_a_per_run_table_is_keyed_by_its_run_or_a_named_scan() -> None:
    queries = _queries()
    unkeyed = sorted(
        name
        for name, query in queries.items()
        if _tables(query) and not _KEYED.search(query) and name not in SCANS
    )
    assert not unkeyed, f"neither keyed by run_id nor a named scan: {unkeyed}"


def test_every_named_scan_is_a_query_that_scans() -> None:
    # A scan that became keyed (or was renamed away) leaves this list, so it stays the
    # list of what would fan out on a sharded database.
    queries = _queries()
    stale = sorted(n for n in SCANS if n not in queries or not _tables(queries[n]))
    assert not stale, f"named scans that are no query on a per-run table: {stale}"
    keyed = sorted(n for n in SCANS if _KEYED.search(queries[n]))
    assert keyed == [], f"named scans that filter by their run after all: {keyed}"


def test_the_scale_page_names_every_scan() -> None:
    page = (ROOT / "docs" / "explanation" / "scale.md").read_text()
    missing = sorted(n for n in SCANS if f"`{n}`" not in page)
    assert not missing, f"docs/explanation/scale.md does not name the scans {missing}"


def test_the_check_tells_a_keyed_query_from_a_scan() -> None:
    assert _KEYED.search("SELECT 1 FROM journal WHERE run_id = %(run_id)s")
    assert _KEYED.search("DELETE FROM graph_blobs WHERE thread_id = ANY(%(thread_ids)s)")
    assert _KEYED.search("INSERT INTO runs (run_id) VALUES (%(run_id)s)")
    assert not _KEYED.search("SELECT 1 FROM checkpoints WHERE status = 'running'")
    # a keyset page's anchor run is no filter on the page's runs
    assert not _KEYED.search("SELECT 1 FROM runs r WHERE (r.run_id) < (%(after)s)")
    assert _tables("SELECT 1 FROM checkpoints c JOIN runs r USING (run_id)") == {
        "checkpoints",
        "runs",
    }
