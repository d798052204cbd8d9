"""/runs: start, read, list, cancel, resolve, fork, rewind and replay runs.

Every route is a thin call into the app's one cairn.Client (thread-safe: a connection
pool and Celery's producer pool), run in FastAPI's thread pool.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, cast

from fastapi import APIRouter, Body, Header, Query, Request

from cairn.client.client import Client
from cairn.core import tracing
from cairn.core.errors import InvalidInput, UnknownRun
from cairn.core.inputs import check_run_id
from cairn.core.records import StepRecord
from cairn.core.status import RunStatus
from cairn.steps import registry
from cairn.web.answers import (
    Budget,
    Calls,
    Children,
    Counts,
    Forks,
    Replayed,
    Run,
    RunPage,
    Steps,
)
from cairn.web.deps import ClientDep, ReadsDep
from cairn.web.errors import errors
from cairn.web.models import (
    NO_NUL,
    RUN_ID_SCHEMA,
    Cancel,
    Fork,
    NewRun,
    RaiseBudget,
    Replay,
    Resolve,
    Rewind,
    Timestamp,
)

router = APIRouter(tags=["runs"])
# Each answer is validated as its model (cairn.web.answers); exclude_unset: a field the
# record leaves out (a run's wakes_at when it has none) stays out, as to_json() gives it.
ANSWER: dict[str, Any] = {"response_model_exclude_unset": True}
WHY_SEQ = (
    "The request breaks a rule of this document (invalid_request), or the run saved no "
    "step at that seq: pick one from GET /runs/{run_id}/steps (invalid_input)."
)


def run_json(client: Client, run_id: str) -> dict[str, Any]:
    """The run as JSON; UnknownRun (404) if there is none."""
    run = client.get(run_id)
    if run is None:
        raise UnknownRun(f"no run {run_id!r}")
    return run.to_json()


def jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def step_json(step: StepRecord) -> dict[str, Any]:
    return {**step.to_json(), "seconds": round(step.seconds, 6)}


@router.post(
    "/runs",
    status_code=202,
    response_model=Run,
    **ANSWER,
    responses=errors(
        409,
        422,
        why={
            409: "A run with this id exists with another workflow or input (run_id_conflict).",
            422: "The request breaks a rule of this document (invalid_request), or one "
            "the server checks: run_id and Idempotency-Key both sent and not equal, an "
            "input its workflow refuses, over CAIRN_MAX_INPUT_BYTES or with NUL in a "
            "string (invalid_input); a workflow not registered (unknown_workflow); a "
            "debounce without a debounce_key, a max_wait below the debounce, or a run id "
            "with a debounce_key (invalid_input).",
        },
    ),
)
def start_run(
    request: Request,
    new: Annotated[NewRun, Body()],
    client: ClientDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            description="The run id, as a header: a retried POST returns the same run. "
            "With run_id in the body too, the two must be equal (else 422).",
            json_schema_extra=RUN_ID_SCHEMA,
        ),
    ] = None,
) -> dict[str, Any]:
    """Start a run. Retrying with the same Idempotency-Key (or run_id) and body returns
    the same run; the same key with another body is 409. Send the id as run_id or as
    Idempotency-Key, or both equal: two different ids are 422."""
    run_id = new.run_id
    if idempotency_key is not None:
        key = check_run_id(idempotency_key)
        if run_id is not None and run_id != key:
            raise InvalidInput("run_id and Idempotency-Key differ: send one, or the same")
        run_id = key
    registry.get(new.workflow)  # UnknownWorkflow (422) names the ones it knows
    with tracing.continuing(request.headers):  # a caller's traceparent: the run joins it
        run_id = client.enqueue(
            new.workflow, new.input, run_id=run_id, max_cost_usd=new.max_cost_usd,
            concurrency_key=new.concurrency_key, concurrency_limit=new.concurrency_limit,
            priority=new.priority, debounce_key=new.debounce_key, debounce=new.debounce,
            max_wait=new.max_wait, budget_usd=new.budget_usd, budget_soft=new.budget_soft,
            budget_tokens=new.budget_tokens,
        )  # fmt: skip
    return run_json(client, run_id)


@router.get("/runs", response_model=RunPage, **ANSWER)
def list_runs(
    reads: ReadsDep,
    status: RunStatus | None = None,
    workflow: Annotated[str | None, Query(max_length=200, pattern=NO_NUL)] = None,
    cursor: Annotated[
        str | None,
        Query(max_length=200, pattern=NO_NUL, description="next_cursor of the previous page"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    since: Annotated[Timestamp | None, Query()] = None,
    until: Annotated[Timestamp | None, Query()] = None,
) -> dict[str, Any]:
    """Runs, newest first, a page at a time (keyset: pass next_cursor as cursor)."""
    runs = reads.list(status, limit, workflow=workflow, after=cursor, since=since, until=until)
    return {
        "runs": [r.to_json() for r in runs],
        "next_cursor": runs[-1].run_id if len(runs) == limit else None,
    }


@router.get("/counts", response_model=Counts)
def counts(reads: ReadsDep) -> dict[str, int]:
    """How many runs are in each status."""
    return cast("dict[str, int]", reads.counts())  # a RunStatus is a str


@router.get("/runs/{run_id}", response_model=Run, responses=errors(404), **ANSWER)
def get_run(run_id: str, reads: ReadsDep) -> dict[str, Any]:
    """One run: status, cursor, input, state (its result once done), error, cost."""
    run = reads.get(run_id)
    if run is None:
        raise UnknownRun(f"no run {run_id!r}")
    return run.to_json()


@router.get("/runs/{run_id}/children", response_model=Children, responses=errors(404), **ANSWER)
def children(run_id: str, reads: ReadsDep) -> dict[str, Any]:
    """The run's child runs (StepResult.spawn), each spawn's in the order its step
    listed them: status, state (the result once done), error."""
    found = reads.of_run(run_id, lambda c: c.children(run_id))
    return {"run_id": run_id, "children": [r.to_json() for r in found]}


@router.get("/runs/{run_id}/steps", response_model=Steps, responses=errors(404), **ANSWER)
def steps(run_id: str, reads: ReadsDep) -> dict[str, Any]:
    """The run's step timeline, oldest first: one row per step attempt that ended."""
    history = reads.of_run(run_id, lambda c: c.history(run_id))
    return {"run_id": run_id, "steps": [step_json(s) for s in history]}


@router.get("/runs/{run_id}/calls", response_model=Calls, responses=errors(404), **ANSWER)
def calls(run_id: str, reads: ReadsDep) -> dict[str, Any]:
    """The run's journaled calls, oldest first: each model request and tool call a
    step made (a pydantic-ai agent's too), with its result or error and its cost."""
    found = reads.of_run(run_id, lambda c: c.calls(run_id))
    return {"run_id": run_id, "calls": [c.to_json() for c in found]}


@router.post(
    "/runs/{run_id}/cancel", status_code=202, response_model=Run, responses=errors(404), **ANSWER
)
def cancel(
    run_id: str, client: ClientDep, body: Annotated[Cancel | None, Body()] = None
) -> dict[str, Any]:
    """Stop a run: a pending one at once, a running one at its next step boundary. The
    run names who asked (cancelled_by: the token)."""
    return client.cancel(run_id, (body or Cancel()).reason).to_json()


@router.post(
    "/runs/{run_id}/fork",
    status_code=202,
    response_model=Run,
    **ANSWER,
    responses=errors(
        404,
        409,
        422,
        why={
            409: "new_run_id names a run that exists (run_id_conflict).",
            422: WHY_SEQ + " Or input_patch is over CAIRN_MAX_INPUT_BYTES or has NUL in a "
            "string (invalid_input).",
        },
    ),
)
def fork(run_id: str, body: Fork, request: Request, client: ClientDep) -> dict[str, Any]:
    """Start a new run from the step run_id saved at at_seq (run_id is not touched)."""
    with tracing.continuing(request.headers):
        new = client.fork(
            run_id, at_seq=body.at_seq, new_run_id=body.new_run_id,
            input_patch=body.input_patch,
        )  # fmt: skip
    return run_json(client, new)


@router.post(
    "/runs/{run_id}/rewind",
    status_code=202,
    response_model=Run,
    **ANSWER,
    responses=errors(
        404,
        409,
        422,
        why={409: "The run is not stopped: cancel it first (run_not_stopped).", 422: WHY_SEQ},
    ),
)
def rewind(run_id: str, body: Rewind, client: ClientDep) -> dict[str, Any]:
    """Move a stopped run back to the step it saved at to_seq, in place (409 for a run
    that is not stopped)."""
    return client.rewind(run_id, to_seq=body.to_seq).to_json()


@router.get("/runs/{run_id}/forks", response_model=Forks, responses=errors(404), **ANSWER)
def forks(run_id: str, reads: ReadsDep) -> dict[str, Any]:
    """The runs forked from this one, oldest first."""
    found = reads.of_run(run_id, lambda c: c.forks(run_id))
    return {"run_id": run_id, "forks": [r.to_json() for r in found]}


@router.post(
    "/runs/replay",
    status_code=202,
    response_model=Replayed,
    **ANSWER,
    responses=errors(
        422, why={422: "The request breaks a rule of this document (invalid_request)."}
    ),
)
def replay(body: Replay, client: ClientDep) -> dict[str, Any]:
    """Replay the workflow's runs that failed in [since, until): each goes on from its
    last saved step, its effects under the same idempotency keys; dry_run lists them."""
    runs = client.replay(
        body.workflow, since=body.since, until=body.until,
        status=tuple(body.status), limit=body.limit, dry_run=body.dry_run,
    )  # fmt: skip
    return {
        "workflow": body.workflow,
        "dry_run": body.dry_run,
        "replayed": 0 if body.dry_run else len(runs),
        "runs": [r.to_json() for r in runs],
    }


@router.post(
    "/runs/{run_id}/resolve", status_code=202, response_model=Run, responses=errors(404), **ANSWER
)
def resolve(run_id: str, body: Resolve, client: ClientDep) -> dict[str, Any]:
    """Settle a run stopped as unknown: whether its at-most-once effect happened. The
    run goes on at its cursor."""
    return client.resolve(run_id, done=body.done, result=body.result).to_json()


NO_BUDGET = {404: "No such run.", 422: "The run has no budget (invalid_input)."}


@router.get(
    "/runs/{run_id}/budget", response_model=Budget, responses=errors(404, 422, why=NO_BUDGET)
)
def budget(run_id: str, client: ClientDep) -> dict[str, Any]:
    """The budget the run was enqueued with (budget_usd), over it and its descendants."""
    return client.budget(run_id).to_json()


@router.post(
    "/runs/{run_id}/budget", response_model=Budget, responses=errors(404, 422, why=NO_BUDGET)
)
def raise_budget(run_id: str, body: RaiseBudget, client: ClientDep) -> dict[str, Any]:
    """Set the budget's limit; the runs of its tree stopped as budget_exceeded go on."""
    return client.raise_budget(run_id, usd=body.usd, tokens=body.tokens).to_json()
