"""Child runs (StepResult.spawn) on real workers: a fan-out gathers each child once, and
cancelling the parent cancels its children.
"""

from __future__ import annotations

import collections
from typing import Any

import tests.helpers.flows  # noqa: F401 (fanout, square, recursive)
from cairn.client.client import Client
from cairn.core.status import RunStatus
from tests.helpers.runs import wait_for


# -- on real workers -------------------------------------------------------------------
def test_a_fan_out_on_a_real_worker_gathers_every_child_once(
    client: Client, start_worker: Any, serve: Any, sql: Any
) -> None:
    """20 children on a two-process worker: the parent waits holding no worker, each
    child runs once, the parent's next step runs once and sees the failed one's error;
    the API, the run page and `cairn runs show` list parent and children."""
    start_worker(concurrency=2)
    ns = [*range(1, 20), -1]
    parent = client.enqueue("fanout", {"ns": ns}, run_id="fan-1")
    run = client.wait(parent, timeout=60)
    while run.status == RunStatus.WAITING:
        run = client.wait(parent, timeout=60) if _moved(client, parent) else run
    assert run.status == RunStatus.DONE, run
    assert run.state is not None and run.state["total"] == sum(n * n for n in range(1, 20))
    assert run.state["failed"] == ["step 'sq' raised ValueError: cannot square -1: negative"]
    kids = client.children(parent)
    assert [k.run_id for k in kids] == [f"fan-1.split.0.{i}" for i in range(20)]
    # Each child's one step saved once (or failed once); the parent's 'total' once.
    rows = sql("SELECT run_id, cursor, count(*) FROM step_history GROUP BY run_id, cursor")
    assert {(r, c): n for r, c, n in rows if r == parent} == {
        (parent, "split"): 1,
        (parent, "total"): 1,
    }
    assert all(n == 1 for r, _, n in rows if r != parent)
    assert sql("SELECT count(*) FROM runs WHERE parent_id = %s", parent) == [(20,)]
    with serve().http() as api:
        body = api.get(f"/runs/{parent}/children").json()
        assert [c["status"] for c in body["children"]].count("done") == 19
        assert api.get(f"/runs/{kids[0].run_id}").json()["parent_id"] == parent
        page = api.get(f"/ui/runs/{parent}").text
        assert 'id="children"' in page and kids[-1].run_id in page
        assert f'href="/ui/runs/{parent}"' in api.get(f"/ui/runs/{kids[0].run_id}").text


def _moved(client: Client, run_id: str) -> bool:
    """Client.wait returns at waiting too: wait for the parent to leave it."""
    wait_for(lambda: client.get(run_id).status != RunStatus.WAITING, 60, f"{run_id} to go on")  # type: ignore[union-attr]
    return True


def test_cancelling_a_parent_on_a_real_worker_cancels_its_children(
    client: Client, start_worker: Any
) -> None:
    start_worker(concurrency=1)
    parent = client.enqueue("fanout", {"ns": [1, 2, 3, 4], "child": {"sleep": 1.5}}, run_id="fan-2")
    wait_for(
        lambda: any(k.status == RunStatus.DONE for k in client.children(parent)),
        30,
        "a child to end",
    )
    client.cancel(parent)
    kids = wait_for(
        lambda: (k := client.children(parent)) and all(c.status.stopped for c in k) and k,
        30,
        "every child to stop",
    )
    statuses = collections.Counter(k.status for k in kids)
    # One child ended before the cancel; one may be in its only step then, which is not
    # cut; the others never start.
    assert statuses[RunStatus.CANCELLED] >= 2 and statuses[RunStatus.DONE] <= 2, statuses
    assert all(k.error == "its parent was cancelled" for k in kids if k.status == "cancelled")
    assert client.get(parent).status == RunStatus.CANCELLED  # type: ignore[union-attr]
