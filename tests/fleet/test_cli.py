"""`cairn worker` and `cairn enqueue` from a user's project whose workflows take the demos'
names.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cairn.store import PgStore

BIN = Path(sys.executable).parent
USERS = """
import cairn

# The names of cairn's demo workflows, which no worker loads unless told: the user's now.
for name in ("invoice", "chat", "agent", "agent_async"):
    flow = cairn.workflow(name)

    @flow.step("only")
    def only(ctx: cairn.Context, name: str = name) -> cairn.StepResult:
        return cairn.StepResult(cursor="done", state={"mine": name, **ctx.input})
"""


def test_a_users_workflows_may_take_the_demos_names(
    worker_env: dict[str, str], store: PgStore, tmp_path: Path
) -> None:
    """`cairn worker` and `cairn enqueue` with the user's module only: its `invoice` and
    `chat` (names cairn's demos have) register, are enqueued and run."""
    from cairn.testing import fleet
    from tests.helpers.runs import wait_for

    (tmp_path / "users_flows.py").write_text(USERS)
    env = {**worker_env, "PYTHONPATH": str(tmp_path), "CAIRN_WORKFLOWS": "users_flows"}
    argv = [str(BIN / "cairn"), "worker", "--concurrency", "1"]
    worker = fleet.wait_ready(fleet.Proc(argv, env, tmp_path / "w.log", "w", tmp_path))
    try:
        for name in ("invoice", "chat"):
            sent = subprocess.run(
                [str(BIN / "cairn"), "enqueue", name, '{"n": 1}', "--run-id", f"u-{name}"],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert sent.returncode == 0 and "Traceback" not in sent.stderr, sent.stderr
        for name in ("invoice", "chat"):
            run = wait_for(
                lambda n=name: (r := store.get(f"u-{n}")) and r.status.stopped and r, 60, name
            )
            assert (run.status, run.state) == ("done", {"mine": name, "n": 1}), run.error
    finally:
        worker.kill()
    assert "already registered" not in worker.text()
