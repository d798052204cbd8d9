"""The approvals inbox at scale: `python -m bench.approvals` (--runs, --pending).

A database with --runs runs (1M by default), --pending of them waiting on an approval
(10k) and as many approvals decided before, made by generate_series in one statement a
table. Then the inbox as GET /approvals and the page read it, through the public Client:
the first page (50, newest first), a page deep in the list (keyset), a workflow's page,
and all the pending approvals in pages of 1,000. Each is the median of --reps calls after
a warm-up; then all of them in one statement as Postgres runs it (EXPLAIN ANALYZE), and
the plan of the first page (which index it walks).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg

from bench.common import Databases, bench_redis, progress
from bench.internals import upgrade
from cairn import Client, Settings

# The bound: 10k pending approvals list in <= 20 ms at 1M runs.
BOUND_MS = 20.0

GENERATE = (
    # The rows are written as the save would leave them; triggers (the status counts) and
    # foreign keys are off while they load: a bench, not a product path.
    "SET session_replication_role = replica",
    """
INSERT INTO runs (run_id, workflow, input, created_at)
SELECT 'run-' || lpad(g::text, 8, '0'), (ARRAY['refund', 'onboard', 'triage', 'mail'])[1 + g %% 4],
       '{}', now() - (%(runs)s - g) * interval '1 second'
  FROM generate_series(1, %(runs)s) g
""",
    """
INSERT INTO checkpoints (run_id, seq, cursor, state, version, status, wait_event, created_at)
SELECT 'run-' || lpad(g::text, 8, '0'), 2, 'act', '{}', 1,
       CASE WHEN g > %(runs)s - %(pending)s THEN 'waiting' ELSE 'done' END,
       CASE WHEN g > %(runs)s - %(pending)s THEN 'approve' END,
       now() - (%(runs)s - g) * interval '1 second'
  FROM generate_series(1, %(runs)s) g
""",
    # One decided approval (of a done run) for each pending one: the table holds both.
    """
INSERT INTO approvals (run_id, seq, event, workflow, tool, request, created_at, decided_at,
                       pending)
SELECT 'run-' || lpad(g::text, 8, '0'), 1, 'approve',
       (ARRAY['refund', 'onboard', 'triage', 'mail'])[1 + g %% 4], 'refund',
       jsonb_build_object('tool', 'refund', 'args', jsonb_build_object('amount', g %% 100),
                          'prompt', 'Refund ' || g %% 100 || ' EUR?'),
       now() - (%(runs)s - g) * interval '1 second',
       CASE WHEN g <= %(runs)s - %(pending)s THEN now() END, g > %(runs)s - %(pending)s
  FROM generate_series(%(runs)s - 2 * %(pending)s + 1, %(runs)s) g
""",
    "UPDATE approvals SET seq = 2 WHERE pending",
    "ANALYZE",
)


def _ms(fn: Callable[[], Any], reps: int) -> float:
    fn()  # warm: the pool's connection, the plan
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _copied(conn: psycopg.Connection[Any], query: str) -> int:
    size = 0
    with conn.cursor().copy(f"COPY ({query}) TO STDOUT") as copy:
        for data in copy:
            size += len(data)
    return size


def _everything(client: Client) -> int:
    seen, after = 0, None
    while page := client.approvals(limit=1000, after=after):
        seen += len(page)
        after = page[-1].approval_id
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.approvals", description=__doc__)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args(argv)
    dbs = Databases()
    try:
        url = dbs.fresh("approvals")
        upgrade(url)
        progress(f"approvals: {args.runs:,} runs, {args.pending:,} waiting on an approval")
        t0 = time.monotonic()
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in GENERATE:
                conn.execute(statement, {"runs": args.runs, "pending": args.pending})
            params = {"workflow": None, "event": None, "after": None, "limit": 50, "tenant": None}
            plan = conn.execute("EXPLAIN " + _first_page_sql(), params).fetchall()
        progress(f"generated in {time.monotonic() - t0:.1f} s")
        settings = Settings(database_url=url, redis_url=bench_redis())
        with Client(settings=settings) as client:
            assert _everything(client) == args.pending
            middle = client.approvals(limit=1000)[-1].approval_id
            rows = {
                "first page (50, newest first)": lambda: client.approvals(),
                "first page (50, oldest first)": lambda: client.approvals(oldest_first=True),
                "a page deep in the list (keyset)": lambda: client.approvals(after=middle),
                "one workflow's first page": lambda: client.approvals(workflow="refund"),
                f"all {args.pending:,} pending, pages of 1,000": lambda: _everything(client),
            }
            for label, fn in rows.items():
                ms = _ms(fn, args.reps)
                flag = "" if ms <= BOUND_MS else f"  over the {BOUND_MS:.0f} ms bound"
                print(f"{label:40} {ms:8.2f} ms{flag}")
        with psycopg.connect(url, autocommit=True) as conn:
            every = {
                "workflow": None,
                "event": None,
                "after": None,
                "limit": args.pending,
                "tenant": None,
            }
            # The rows as the server sends them, read as bytes (COPY), unparsed: what the
            # store's query costs apart from building the Approvals in Python.
            query = psycopg.ClientCursor(conn).mogrify(_first_page_sql(), every)
            raw = _ms(lambda: _copied(conn, query), args.reps)
            analyzed = conn.execute("EXPLAIN ANALYZE " + _first_page_sql(), every).fetchall()
        flag = "" if raw <= BOUND_MS else f"  over the {BOUND_MS:.0f} ms bound"
        print(f"{f'all {args.pending:,} in one statement, as bytes':40} {raw:8.2f} ms{flag}")
        print(f"all {args.pending:,} in one statement, in Postgres: {analyzed[-1][0]}")
        print("plan of the first page:")
        for (line,) in plan:
            print("  " + line)
    finally:
        dbs.close()
    return 0


def _first_page_sql() -> str:
    from bench.internals import QUERIES

    return QUERIES["approvals_newest"]


if __name__ == "__main__":
    raise SystemExit(main())
