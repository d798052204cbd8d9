"""`cairn chaos WORKFLOW`: real workers SIGKILLed at every step boundary; what broke?

It makes a fresh database (``chaos_<stamp>``, from the migrations, with a trigger that
records every checkpoint row version), flushes its Redis database (index 13 by default),
starts the mail and model stand-ins, K worker processes and the beat (reaper) process,
enqueues N runs of WORKFLOW and, while they work:

* the workers kill themselves at step boundaries chosen from ``--seed``
  (cairn/testing/faults.py: before the effect, after the effect before the checkpoint is
  saved, after the save). Same seed, same runs, same rate: same kill points, so a
  failing schedule can be replayed;
* this process kills from outside, at random (seeded) moments, a busy pool child or
  now and then a whole worker (parent and pool, which is then replaced).

At the end it reports, per step: attempts, sends to the mail API, deliveries, replays
the mail API deduplicated, deliveries per idempotency key and duplicates (deliveries of
one step visit by more than one attempt); and runs finished/failed/lost, resumes, kills
per boundary and the time from each kill to the run continuing under another owner
(p50/p95, for pool-child kills and whole-worker kills). Not OK (exit 1) if a run is not
done by the deadline, an effect was delivered twice, or a checkpoint went backwards.

The package: config (options, defaults), history (the chaos database and its
checkpoint_history checks), rig (mail stand-in, workers), kills (kills from outside),
report (the report and how it prints), runner (run_chaos); the command is
cairn.cli.chaos.
Importing it stays cheap: the heavy imports wait until chaos runs.
"""

from __future__ import annotations

from cairn.testing.chaos.config import (
    CHAOS_REDIS_DB,
    DEFAULT_INPUTS,
    SENTINEL,
    STATE,
    chaos_redis_url,
)
from cairn.testing.chaos.history import HISTORY_SQL, check_history, create_database, drop_database
from cairn.testing.chaos.report import percentile, print_report, recoveries, step_report
from cairn.testing.chaos.rig import chaos_mail
from cairn.testing.chaos.runner import run_chaos

__all__ = [
    "CHAOS_REDIS_DB",
    "DEFAULT_INPUTS",
    "HISTORY_SQL",
    "SENTINEL",
    "STATE",
    "chaos_mail",
    "chaos_redis_url",
    "check_history",
    "create_database",
    "drop_database",
    "percentile",
    "print_report",
    "recoveries",
    "run_chaos",
    "step_report",
]
