"""A run tree's budget on real workers under chaos: a parent and its 50 children, worker
processes SIGKILLed in the middle of model calls, never pass the tree's hard budget, and
the spend the ledger recorded is what the model stand-in billed (docs/guides/budgets.md).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from typing import Any

import pytest

from cairn.client.client import Client
from cairn.steps.model import ModelClient
from cairn.steps.prices import cost_of, tokens_of
from cairn.store import Leases
from cairn.testing.standins import ModelServer
from tests.helpers.runs import holder_pid, wait_for

CHILDREN, CALLS = 50, 2
PROCESSES = 4  # the worker's prefork pool: calls in flight at once, at most


def _ask(tag: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"REPLY: ok {tag}"}], "max_tokens": 16}


def test_a_tree_under_kills_never_passes_its_budget_and_spends_what_was_billed(
    client: Client, start_worker: Any, leases: Leases, model: ModelServer
) -> None:
    probe = ModelClient(base_url=model.url)
    worst = probe.worst_cost(**_ask("0-0"))
    _, cost = probe.create(**_ask("0-0"))
    probe.close()
    model.control(reset=True, delay_ms=60)  # calls long enough to be killed in
    # Room for about 60 of the 101 calls the tree would make.
    limit = 60 * cost
    env = {"CAIRN_WORKFLOWS": "tests.helpers.budget_flows"}
    start_worker(concurrency=PROCESSES, **env)
    parent = client.enqueue(
        "spender", {"children": CHILDREN, "calls": CALLS}, budget_usd=limit, budget_soft=0.5
    )
    wait_for(lambda: len(client.children(parent)) == CHILDREN, 30, "the children")
    kids = [k.run_id for k in client.children(parent)]

    rng, killed, started = random.Random(7), 0, time.monotonic()
    dead: set[int] = set()
    while not client.get(parent).status.stopped:  # type: ignore[union-attr]
        # A guard against a hang, not a speed target: the tree takes ~10 s alone, and a CI
        # run of 2 cores with another fleet test beside it once took 40.
        assert time.monotonic() - started < 90, "the tree did not finish"
        busy = sorted({pid for k in kids if (pid := holder_pid(leases, k)) is not None} - dead)
        if busy and killed < 8:
            pid = rng.choice(busy)
            dead.add(pid)
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.kill(pid, signal.SIGKILL)  # a pool process: its worker starts another
                killed += 1
        time.sleep(0.3)

    budget = client.budget(parent)
    runs = [client.get(r) for r in [parent, *kids]]
    statuses = {str(r.status) for r in runs if r is not None}
    assert statuses <= {"done", "budget_exceeded"} and "budget_exceeded" in statuses
    assert killed >= 3
    # The hard limit held: no more than one call in flight past it (here: none).
    assert budget.spent_usd <= budget.limit_usd + worst
    # And it was the limit that stopped them, counting the calls then in flight.
    assert budget.spent_usd + PROCESSES * worst > budget.limit_usd
    # The ledger is the journal, and the journal is what the model billed: a call cut by a
    # kill was made again under its idempotency key, billed once, recorded once.
    journaled = sum(c.cost_usd for r in [parent, *kids] for c in client.calls(r))
    billed = sum(cost_of(m, usage, "anthropic") for m, usage in model.billed())
    assert budget.spent_usd == pytest.approx(journaled) and journaled == pytest.approx(billed)
    tokens = sum(tokens_of(usage).prompt + tokens_of(usage).output for _, usage in model.billed())
    assert budget.spent_tokens == tokens  # the tokens it served, each answer once
    assert budget.reserved_usd == pytest.approx(0, abs=1e-12)
