"""enqueue(): what a web app calls to start (or resume) a run."""

from __future__ import annotations

import functools
import uuid
from typing import Any

from kombu.exceptions import OperationalError

from steps import registry
from store import Database, PgStore, StoreUnavailable
from workers.app import run_task, settings


@functools.cache
def store() -> PgStore:
    return PgStore(Database(settings.database_url, give_up_after=settings.store_give_up_after))


def enqueue(workflow: str, input: dict[str, Any], *, run_id: str | None = None) -> str:
    """Record the run and send it to the workers; returns its run id.

    Enqueueing an existing run id resumes that run where it is (a failed run is re-armed
    at its cursor); it never starts it over. Raises UnknownWorkflow or InvalidInput
    before anything is written.
    """
    flow = registry.get(workflow)
    data = flow.validate(input)
    run_id = run_id or uuid.uuid4().hex
    assert flow.first is not None, f"workflow {workflow!r} has no steps"
    store().create_run(run_id, workflow, data, flow.first)
    try:
        run_task.delay(run_id)
    except OperationalError as exc:
        raise StoreUnavailable(
            f"run {run_id} is recorded but the broker is unreachable ({exc}); enqueue the "
            "same run id again once it is back, or the reaper will after CAIRN_PENDING_AFTER"
        ) from exc
    return run_id
