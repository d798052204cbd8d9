"""Workers: the Celery app, the run task, the step loop, the reaper.

`from workers import enqueue` is the web app's entry point.
"""

from __future__ import annotations

from typing import Any


def enqueue(workflow: str, input: dict[str, Any], *, run_id: str | None = None) -> str:
    """See workers.client.enqueue (imported lazily: it configures Celery from the env)."""
    from workers.client import enqueue as _enqueue

    return _enqueue(workflow, input, run_id=run_id)
