"""`cairn demo` as the README runs it: its verdict is backed by what it counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import BASE_REDIS

pytestmark = pytest.mark.slow


def test_demo_finishes_every_run_and_delivers_each_email_once(db_url: str, tmp_path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "ANTHROPIC_"))},
        "CAIRN_DATABASE_URL": db_url,
        "CAIRN_REDIS_URL": BASE_REDIS,  # the demo uses its own database (14) on this server
        "CAIRN_STATE_DIR": str(tmp_path),
    }
    out = subprocess.run(
        [sys.executable, "-m", "cairn.workers.cli", "demo", "--json", "--runs", "6"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    summary = json.loads(out.stdout)
    assert out.returncode == 0 and summary["ok"] is True, out.stderr[-2000:]
    assert summary["runs_finished"] == 6 and summary["runs_failed"] == 0
    assert summary["emails_delivered"] == 6 and summary["duplicate_deliveries"] == 0
    assert summary["ledger_rows"] == 6
    assert summary["kills"] and summary["runs_resumed"] >= 1
    assert summary["emails_attempted"] >= summary["emails_delivered"]
