"""5. A million runs: the time of each query the product runs against a store that has
1M finished runs and a few thousand active ones (`python -m bench --only million`).

The runs are generated in Postgres (generate_series, one INSERT per table) on the schema
as it was before the counts migration, then `cairn db upgrade` applies the rest, so its
backfill at this size is measured too. Every time is the median of several calls through
PgStore, the calls the CLI, the web pages and the reaper make, after one warm-up call;
each query is also EXPLAINed so a slow one shows which index it did (not) use.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg

from bench.common import Databases, median, pct, progress
from bench.internals import QUERIES, Database, PgStore, RunFilter, migrations, upgrade

# Where the counts start: the generator writes the schema before it, as an existing
# database would be, and the upgrade backfills.
COUNTS_MIGRATION = "status_counts"
PAGE = 50
# The product's settings these queries run with: CAIRN_LEASE_TTL / 2 (the reaper's "not
# saved for a while"), CAIRN_LOST_AFTER, CAIRN_RETENTION_SECONDS.
RUNNING_AFTER, LOST_AFTER = 7.5, 10.0
REAPER_PAGE = 500  # the reaper's batch (cairn.workers.reaper.BATCH)
RETENTION = 28 * 24 * 3600.0

# g = 1..terminal are finished runs spread over 30 days (oldest first), g above that the
# active ones, created in the last minutes. Deterministic: a hash of g picks the status.
GENERATE = (
    """
INSERT INTO runs (run_id, workflow, input, created_at)
SELECT 'run-' || lpad(g::text, 8, '0'),
       CASE WHEN g %% 50 = 0 THEN 'research'
            ELSE (ARRAY['invoice', 'onboard', 'triage', 'summarize'])[1 + g %% 4] END,
       jsonb_build_object('customer', 'c' || g %% 1000, 'email', 'u' || g || '@example.test'),
       CASE WHEN g <= %(terminal)s
            THEN now() - interval '30 days' + (g * interval '29 days') / %(terminal)s
            ELSE now() - interval '10 minutes' + (g - %(terminal)s) * interval '100 ms' END
  FROM generate_series(1, %(total)s) g
""",
    """
INSERT INTO checkpoints (run_id, seq, cursor, state, version, status, error, epoch, resumes,
                         cost_usd, updated_at, wait_event, wait_until, win_end)
SELECT r.run_id, s.seq, CASE WHEN s.status IN ('pending') THEN '' ELSE 'step' || s.seq END,
       jsonb_build_object('result', md5(r.run_id)), 1, s.status,
       CASE s.status WHEN 'failed' THEN 'RuntimeError: the step blew up' END,
       CASE WHEN s.status = 'pending' THEN 0 ELSE 1 END, 0, 0.0004 * s.seq,
       CASE WHEN s.status = 'running' AND s.h < 20 THEN now() - interval '1 minute'
            WHEN s.status IN ('running', 'waiting') THEN now() - interval '1 second'
            ELSE r.created_at + s.seq * interval '2 seconds' END,
       CASE WHEN s.status = 'waiting' THEN 'approval' END,
       CASE WHEN s.status = 'waiting' THEN now() + interval '1 day' END,
       CASE WHEN s.seq = 3 THEN 2 ELSE 0 END
  FROM runs r
 CROSS JOIN LATERAL (SELECT substr(r.run_id, 5)::int AS g) n
 CROSS JOIN LATERAL (
     SELECT (hashint4(n.g)::bigint + 2147483648) %% 1000 AS h,
            CASE WHEN n.g <= %(terminal)s THEN 3 ELSE 1 END AS seq,
            CASE WHEN n.g > %(terminal)s THEN
                     (ARRAY['pending', 'pending', 'pending', 'pending', 'running', 'running',
                            'running', 'running', 'running', 'waiting'])[1 + n.g %% 10]
                 WHEN (hashint4(n.g)::bigint + 2147483648) %% 1000 < 900 THEN 'done'
                 WHEN (hashint4(n.g)::bigint + 2147483648) %% 1000 < 960 THEN 'failed'
                 WHEN (hashint4(n.g)::bigint + 2147483648) %% 1000 < 990 THEN 'cancelled'
                 ELSE 'budget_exceeded' END AS status
 ) s
""",
    # Each finished run saved 3 steps, with a short model window: what retention deletes.
    """
INSERT INTO step_history (run_id, seq, cursor, visit, outcome, started_at, ended_at, worker,
                          epoch, cost_usd)
SELECT c.run_id, k - 1, 'step' || k, 0, 'saved', c.updated_at - interval '2 seconds',
       c.updated_at, 'bench:1:0', 1, 0.0004
  FROM checkpoints c, generate_series(1, 3) k
 WHERE c.seq = 3
""",
    # One run in ten ran a ctx.once effect: its done-ledger row goes with it.
    """
INSERT INTO effects (key, run_id, result, epoch)
SELECT 'cairn:' || c.run_id || ':step2:0', c.run_id, '{"id": 1}', 1
  FROM checkpoints c
 WHERE c.seq = 3 AND substr(c.run_id, 5)::int %% 10 = 0
""",
    """
INSERT INTO window_messages (run_id, idx, message)
SELECT c.run_id, k - 1,
       jsonb_build_object('role', CASE k WHEN 1 THEN 'user' ELSE 'assistant' END,
                          'content', repeat(md5(c.run_id), 4))
  FROM checkpoints c, generate_series(1, 2) k
 WHERE c.seq = 3
""",
)

# The run shown by "show one run" and "its steps": a long one, 200 history rows.
SHOWN_HISTORY = """
INSERT INTO step_history (run_id, seq, cursor, visit, outcome, started_at, worker, epoch,
                          run_created)
SELECT %(run_id)s, 3 + k, 'think', k, 'saved', now(), 'bench:1:0', 1, c.created_at
  FROM generate_series(1, 200) k, checkpoints c WHERE c.run_id = %(run_id)s
"""


def _schema_before_counts(url: str) -> None:
    """Apply cairn's migrations that come before the counts, recorded as upgrade() does."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE cairn_migrations (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for version, name, text in migrations():
            if name == COUNTS_MIGRATION:
                return
            conn.execute(text)
            conn.execute("INSERT INTO cairn_migrations VALUES (%s, %s)", (version, name))
    raise RuntimeError(f"no migration named {COUNTS_MIGRATION}")


def _explain(url: str, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """EXPLAIN ANALYZE of a named query in a transaction rolled back (the sweep deletes):
    execution time, the indexes used and any sequential scan."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES[name], params
        ).fetchone()
        conn.rollback()
    assert row is not None
    plan = row[0][0]
    indexes: list[str] = []
    seq_scans: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        if "Index Name" in node:
            indexes.append(node["Index Name"])
        if node.get("Node Type") == "Seq Scan":
            seq_scans.append(node.get("Relation Name", "?"))
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    return {
        "query": name,
        "execution_ms": plan["Execution Time"],
        "indexes": sorted(set(indexes)),
        "seq_scans": sorted(set(seq_scans)),
        "top": plan["Plan"]["Node Type"],
    }


def _timed(fn: Callable[[], Any], reps: int) -> list[float]:
    fn()  # warm-up: pool connection, plan, pages in cache
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(1000 * (time.perf_counter() - t0))
    return out


def _row(
    key: str, label: str, kind: str, samples: list[float], explain: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "key": key,
        "query": label,
        "kind": kind,  # interactive, counts, reaper, reference
        "median_ms": median(samples),
        "p95_ms": pct(samples, 95),
        "samples_ms": samples,
        "explain": explain,
    }


def _list_params(**given: Any) -> dict[str, Any]:
    base = {"status": None, "limit": PAGE, "workflow": None, "after": None}
    return {**base, "since": None, "until": None, "tenant": None, **given}


def million(dbs: Databases, redis_url: str, sz: Any) -> dict[str, Any]:
    """The million-run section: generate, upgrade, time each query, sweep."""
    total = sz.million_runs + sz.million_active
    url = dbs.fresh("million")
    out: dict[str, Any] = {"runs": sz.million_runs, "active": sz.million_active}
    _schema_before_counts(url)
    progress(f"million: generating {sz.million_runs:,} finished + {sz.million_active:,} active")
    t0 = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in GENERATE:
            conn.execute(statement, {"terminal": sz.million_runs, "total": total})
        out["generate_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        conn.execute("VACUUM ANALYZE")  # what autovacuum does to a table this size
        out["vacuum_analyze_s"] = time.monotonic() - t0
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        out["database_bytes"] = int(size[0]) if size else 0
    progress(f"million: generated in {out['generate_s']:.1f}s; cairn db upgrade (backfill)")
    t0 = time.monotonic()
    upgrade(url)
    out["upgrade_s"] = time.monotonic() - t0

    db = Database(url, max_size=2)
    store = PgStore(db)
    reps, rows = sz.million_reps, []
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            shown = f"run-{sz.million_runs // 2:08d}"
            conn.execute(SHOWN_HISTORY, {"run_id": shown})
            mid = conn.execute(
                "SELECT run_id FROM runs ORDER BY created_at DESC, run_id DESC OFFSET %s LIMIT 1",
                (total // 2,),
            ).fetchone()
            deep = str(mid[0]) if mid else None

            def measure(
                key: str, label: str, kind: str, fn: Callable[[], Any], q: str | None, p: Any
            ) -> None:
                progress(f"million: {label}")
                samples = _timed(fn, reps)
                rows.append(_row(key, label, kind, samples, _explain(url, q, p) if q else None))

            lists = (
                ("list_first", "list runs, first page", {}),
                ("list_failed", "list runs, status=failed (6%)", {"status": "failed"}),
                ("list_running", "list runs, status=running (active)", {"status": "running"}),
                (
                    "list_rare",
                    "list runs, status=budget_exceeded (1%)",
                    {"status": "budget_exceeded"},
                ),
                ("list_workflow", "list runs, workflow=research (2%)", {"workflow": "research"}),
                ("list_deep", f"list runs, keyset page after run #{total // 2:,}", {"after": deep}),
                (
                    "list_deep_failed",
                    "list runs, status=failed, deep keyset page",
                    {"after": deep, "status": "failed"},
                ),
            )
            for key, label, given in lists:
                p = _list_params(**given)
                measure(
                    key,
                    label,
                    "interactive",
                    lambda p=p: store.list_runs(
                        RunFilter(
                            status=p["status"],
                            limit=p["limit"],
                            workflow=p["workflow"],
                            after=p["after"],
                        )
                    ),
                    "list_runs_by_status" if p["status"] else "list_runs",
                    p,
                )
            measure(
                "show",
                "show one run",
                "interactive",
                lambda: store.get(shown),
                "get_run",
                {"run_id": shown},
            )
            measure(
                "steps",
                "its steps (200 rows)",
                "interactive",
                lambda: store.history(shown),
                "history",
                {"run_id": shown},
            )
            measure(
                "reaper_stalled",
                "reaper: a page of the runs a worker took (stalled)",
                "reaper",
                lambda: store.stalled(RUNNING_AFTER, limit=REAPER_PAGE),
                "stalled",
                {"running_after": RUNNING_AFTER, "after": "", "limit": REAPER_PAGE},
            )
            measure(
                "reaper_unclaimed_count",
                "reaper: runs never claimed, counted (lost messages)",
                "reaper",
                lambda: store.unclaimed_count(LOST_AFTER, upto=sz.million_active + 1),
                "unclaimed_count",
                {"older_than": LOST_AFTER, "upto": sz.million_active + 1},
            )
            measure(
                "reaper_unclaimed",
                "reaper: a page of the runs never claimed, oldest first (lost messages)",
                "reaper",
                lambda: store.unclaimed(LOST_AFTER, limit=REAPER_PAGE),
                "unclaimed",
                {"older_than": LOST_AFTER, "limit": REAPER_PAGE, "after_at": None, "after_id": ""},
            )
            measure(
                "counts", "count_by_status (folded)", "counts", store.counts, "count_by_status", {}
            )
            measure(
                "count_scan",
                "reference: GROUP BY over checkpoints (count_by_status before 0003)",
                "reference",
                lambda: conn.execute(
                    "SELECT status, count(*) FROM checkpoints GROUP BY status"
                ).fetchall(),
                None,
                None,
            )
            # A reaper interval's worth of transitions at a busy 2,500/s, not folded yet.
            moved = max(sz.million_active // 2, 1)
            conn.execute(
                "UPDATE checkpoints SET status = 'done', updated_at = now() WHERE run_id IN"
                " (SELECT run_id FROM checkpoints WHERE status IN ('pending', 'running')"
                "  LIMIT %s)",
                (moved,),
            )
            unfolded = 2 * moved
            measure(
                "counts_unfolded",
                f"count_by_status (+{unfolded:,} unfolded deltas)",
                "counts",
                store.counts,
                "count_by_status",
                {},
            )
            t0 = time.perf_counter()
            store.fold_counts()
            out["fold_ms"] = 1000 * (time.perf_counter() - t0)
            out["folded_deltas"] = unfolded

            rows.append(_retention(url, store, conn))
            out["counts_exact"] = {s: int(r["n"]) for s, r in store.counts().items()} == {
                s: int(n)
                for s, n in conn.execute(
                    "SELECT status, count(*) FROM checkpoints GROUP BY status"
                ).fetchall()
            }
    finally:
        db.close()
        dbs.drop(url)
    out["rows"] = rows
    return out


def _retention(url: str, store: PgStore, conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Retention as the beat runs it: every finished run older than 28 days, 1,000 per
    transaction; each batch timed."""
    progress("million: retention sweep, 1,000 runs per batch")
    plan = _explain(url, "sweep", {"older_than": RETENTION, "batch": 1000})
    # The horizon moves while the sweep runs: count what was due when it started.
    started = conn.execute("SELECT now()").fetchone()
    marks = [time.perf_counter()]
    swept = store.sweep(
        RETENTION, batch=1000, progress=lambda _n: marks.append(time.perf_counter())
    )
    batches = [1000 * (b - a) for a, b in itertools.pairwise(marks)]
    left = conn.execute(
        "SELECT count(*) FROM checkpoints WHERE status IN ('done', 'failed', 'cancelled',"
        " 'budget_exceeded') AND updated_at < %s - make_interval(secs => %s)",
        (started[0] if started else None, RETENTION),
    ).fetchone()
    return {
        **_row(
            "sweep_batch", "retention sweep, one batch of 1,000 runs", "retention", batches, plan
        ),
        "swept": swept,
        "batches": len(batches),
        "total_s": sum(batches) / 1000,
        "max_ms": max(batches) if batches else 0.0,
        "left_behind": int(left[0]) if left else -1,
        "mean_ms": statistics.fmean(batches) if batches else 0.0,
    }
