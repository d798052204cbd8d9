"""A backlog after an outage drains at the fleet's normal rate (issue 51: 30,000 runs
pending past CAIRN_PENDING_AFTER, none done in minutes; 140,606 duplicate messages).

bench/backlog.py at CI size: runs enqueued while no worker ran, made stale past
CAIRN_PENDING_AFTER, then drained by beat and two workers; the floor is the same number
enqueued and drained at once, measured in the same test. CAIRN_TEST_BACKLOG_RUNS=100000
runs it at the issue's size (an hour or more on a small machine).
"""

from __future__ import annotations

import os

from bench.backlog import RATIO, measure
from bench.common import Databases
from cairn.core.settings import Settings
from tests.helpers.services import BASE_DB

RUNS = int(os.environ.get("CAIRN_TEST_BACKLOG_RUNS") or 2_000)
# The target (RATIO, 0.8) is the bench's PASS or MISS: two drains of 2,000 runs
# side by side on a shared 2-core machine move by a tenth either way (0.79 to 0.89 measured,
# 1.34 at 200 runs). The test holds the bug's shape: before the fix the stale backlog was
# starved (none done in minutes) and sent again each window.
STARVED = 0.5


def test_a_backlog_stale_past_pending_after_drains_at_the_rate_of_a_fresh_one(
    settings: Settings,
) -> None:
    dbs = Databases(BASE_DB)  # its own databases, dropped after; this test's Redis database
    try:
        got = measure(dbs, settings.redis_url, RUNS, stalled=1_200)
    finally:
        dbs.close()
    fresh, stale, one = got["fresh"], got["stale"], got["pass"]
    print(
        f"{RUNS:,} runs: stale {stale['runs_per_s']:.1f} runs/s vs fresh "
        f"{fresh['runs_per_s']:.1f} = {got['ratio']:.2f}x; deliveries beyond one per run: "
        f"stale {stale['duplicates']}, fresh {fresh['duplicates']}; the reaper sent "
        f"{stale['reaper_sent']} in {stale['reaper_passes']} passes (median "
        f"{stale['reaper_pass_ms_median']:.0f} ms, max {stale['reaper_pass_ms_max']:.0f} ms); "
        f"a pass over {one['stalled']:,} stalled runs: {one['ms_per_batch']:.1f} ms a batch"
    )
    assert got["ratio"] >= STARVED, got
    if got["ratio"] < RATIO:
        print(f"MISS: the target is {RATIO:g}x (bench/backlog.py prints the same)")
    # Every message queued is one run's own: none is sent again while it waits.
    assert stale["duplicates"] <= RUNS // 100, stale
    assert stale["reaper_passes"] > 10, stale  # the reaper ran throughout
    # A pass over runs a fleet lost whole sends each once, a batch at a time; the next
    # pass sends none of them again (their messages are out).
    assert one["sent"] == one["stalled"] and one["sent_again"] == 0, one
    assert one["batches"] >= one["stalled"] // one["batch"], one
