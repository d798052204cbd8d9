"""`cairn chaos agent --deploy`: a rolling deploy under kills, on real worker processes.
The workers start on version 1 of the agent demo and are swapped one at a time for
version 2 (a renamed step, an added journaled call, a migrated state field), once on
each broker: on Redis the version 2 every run goes on with, on RabbitMQ the one whose
added call comes first, which the deploy check flags. Every run ends done or stopped
`incompatible` with its reason; none is stranded, no slot leaks, no effect is sent
twice; the runs record which version started them and which finished them."""

from __future__ import annotations

from pathlib import Path

import pytest

from cairn.testing import chaos
from tests.helpers.chaos import CHAOS_DB, SEED

RUNS = 12


@pytest.mark.parametrize(
    ("broker_url", "module"),
    [
        ("redis", "cairn.testing.demos.agent_v2"),
        ("amqp", "cairn.testing.demos.agent_v2_reordered"),
    ],
    indirect=["broker_url"],
)
def test_a_rolling_deploy_under_kills_strands_nothing(
    template_db: str, redis_url: str, broker_url: str | None, module: str, tmp_path: Path
) -> None:
    report = chaos.run_chaos(
        "agent",
        runs=RUNS,
        workers=2,
        concurrency=2,
        seed=SEED,
        rate=0.02,
        random_kills=1,
        lease_ttl=2.0,
        deadline=90,
        pending_after=20,
        mail_delay_ms=5,
        model_delay_ms=20,  # a run lasts long enough for the deploy to catch it mid-step
        keys=3,
        key_limit=2,
        deploy=module,
        database_url=CHAOS_DB,
        redis_url=redis_url,
        broker_url=broker_url,
        state_dir=tmp_path,
        quiet=True,
    )
    assert report["ok"], report["problems"]
    deploy = report["deploy"]
    assert report["runs_lost"] == 0 and report["runs_failed"] == 0
    assert report["duplicates"] == 0 and report["keys"]["left"]["slots"] == 0
    assert report["runs_finished"] + report["runs_incompatible"] == RUNS
    assert [s["how"] for s in deploy["swaps"]][-1] in ("SIGKILL", "gone")
    # Both versions started runs (half the runs are sent once v2 is up), v2 finished some.
    assert deploy["started"].get("v1", 0) >= 1 and deploy["started"].get("v2", 0) >= 1
    assert deploy["finished"].get("v2", 0) >= 1
    reasons = deploy["incompatible_reasons"]
    if module.endswith("reordered"):
        # The last old worker was killed holding runs inside `work`, calls recorded by v1:
        # v2 finds its `stamp` call where v1 recorded `model`, and stops each such run.
        diverged = [r for r in reasons if "is 'stamp'" in r and "recorded 'model'" in r]
        assert diverged, deploy
    else:
        # A run v2 moved on and an old worker then loaded is the only incompatible stop
        # an `upgrade` deploy may make (state or step only the newer code reads).
        assert all("version 2" in r or "no step 'summarize'" in r for r in reasons), reasons
