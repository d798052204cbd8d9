"""POST /runs/{run_id}/signals/{event}: what a waiting run waits for; POST
/runs/{run_id}/steer: a message for a running agent."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Path

from cairn.core.inputs import RUN_ID_MAX, check_run_id
from cairn.web.answers import Signalled, Steered
from cairn.web.deps import ClientDep
from cairn.web.errors import errors
from cairn.web.models import EVENT_NAME_PATTERN, RUN_ID_SCHEMA, NewSignal, NewSteer
from cairn.web.routers.runs import ANSWER, run_json

router = APIRouter(tags=["runs"])


@router.post(
    "/runs/{run_id}/signals/{event}",
    status_code=202,
    response_model=Signalled,
    **ANSWER,
    responses=errors(
        404,
        422,
        why={
            422: "The request breaks a rule of this document (invalid_request), or its "
            "payload is over CAIRN_MAX_INPUT_BYTES or has NUL in a string (invalid_input)."
        },
    ),
)
def signal(
    run_id: str,
    event: Annotated[
        str,
        Path(
            description="What the run waits for; names starting with `cairn.` are cairn's.",
            json_schema_extra={"pattern": EVENT_NAME_PATTERN, "maxLength": RUN_ID_MAX},
        ),
    ],
    client: ClientDep,
    body: Annotated[NewSignal | None, Body()] = None,
    idempotency_key: Annotated[
        str | None,
        Header(
            description="The signal id, if the body has none.",
            json_schema_extra=RUN_ID_SCHEMA,
        ),
    ] = None,
) -> dict[str, Any]:
    """Send the run a signal; a run waiting for it wakes. The same signal_id twice is
    one signal (stored: false the second time)."""
    body = body or NewSignal()
    if idempotency_key is not None:
        check_run_id(idempotency_key)  # checked even when the body's signal_id wins
    signal_id = body.signal_id if body.signal_id is not None else idempotency_key
    stored = client.signal(run_id, event, body.payload, signal_id=signal_id)
    return {"stored": stored, "run": run_json(client, run_id)}


@router.post(
    "/runs/{run_id}/steer",
    status_code=202,
    response_model=Steered,
    responses=errors(
        404,
        409,
        422,
        why={
            409: "The run has ended: no step would read the message (run_ended).",
            422: "The request breaks a rule of this document (invalid_request), or the "
            "message is over CAIRN_MAX_INPUT_BYTES or has NUL in a string (invalid_input).",
        },
    ),
)
def steer(run_id: str, body: NewSteer, client: ClientDep) -> Steered:
    """Send a running agent a message: stored durably, delivered once and in order to its
    step at the next ctx.messages(); with interrupt, its interruptible call in flight is cut
    first."""
    return Steered(n=client.steer(run_id, body.message, interrupt=body.interrupt))
