"""Code versions: a worker states its code's (CAIRN_CODE_VERSION, or a hash of its
workflows), a run keeps the version that started it, and each step row the version that
wrote it, through a deploy that changes the version mid-run."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from cairn.client.client import Client
from cairn.core.errors import RetryLater
from cairn.core.status import RunStatus
from cairn.steps import registry
from cairn.steps.context import Context
from cairn.steps.registry import Retry, StepResult, workflow
from cairn.testing import LocalWorker
from cairn.workers import loop

versioned = workflow("code_versions_demo")


@versioned.step()
def first(ctx: Context) -> StepResult:
    return StepResult(cursor="second", state={"first": True})


_failed: set[str] = set()  # runs whose second step has failed once


@versioned.step(retry=Retry(attempts=3, on=(ValueError,)))
def second(ctx: Context) -> StepResult:
    if ctx.input.get("fail_once") and ctx.run_id not in _failed:
        _failed.add(ctx.run_id)
        raise ValueError("not yet")
    return StepResult(cursor="done", state={**ctx.state, "second": True})


def test_a_run_records_the_version_it_started_on_and_each_step_the_one_that_saved_it(
    deps: loop.Deps, client: Client
) -> None:
    run_id = f"cv-{uuid.uuid4().hex[:8]}"
    client.store.create_run(run_id, "code_versions_demo", {"fail_once": True})
    old = dataclasses.replace(deps, settings=deps.settings.with_options(code_version="1.4.0"))
    new = dataclasses.replace(deps, settings=deps.settings.with_options(code_version="1.5.0"))
    # 1.4.0 saves the first step, and the second fails once: its retry is 1.4.0's too.
    with pytest.raises(RetryLater):
        loop.run(run_id, old)
    # The deploy: 1.5.0 takes the run over and ends it.
    assert loop.run(run_id, new) == RunStatus.DONE
    run = client.get(run_id)
    assert run is not None and run.started_version == "1.4.0"
    steps = [(s.cursor, s.outcome, s.code_version) for s in client.history(run_id)]
    assert steps == [
        ("first", "saved", "1.4.0"),
        ("second", "retry", "1.4.0"),
        ("second", "saved", "1.5.0"),
    ]


def test_the_default_version_is_a_hash_of_the_workflows_and_their_steps() -> None:
    assert registry.code_version("2026.12.05-abc") == "2026.12.05-abc"
    before = registry.code_version()
    assert len(before) == 12 and before == registry.code_version(None) == registry.code_version("")
    name = f"code_versions_{uuid.uuid4().hex[:8]}"
    added = workflow(name)
    try:
        added.step()(first)
        with_one = registry.code_version()
        assert with_one != before  # a workflow added
        added.step()(second)
        assert registry.code_version() not in (before, with_one)  # a step added
    finally:
        registry._REGISTRY.pop(name)
    assert registry.code_version() == before


def test_a_local_worker_states_the_default_version() -> None:
    worker = LocalWorker()
    client = Client(store=worker.store, send=worker.send)
    run_id = client.enqueue("code_versions_demo", {})
    worker.run_until_idle()
    run = client.get(run_id)
    assert run is not None and run.started_version == registry.code_version()
    assert {s.code_version for s in client.history(run_id)} == {registry.code_version()}
