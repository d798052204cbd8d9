"""/approvals: the runs waiting on a person across runs (the inbox), and a decision on
one, which sends its run the signal it waits on with the audit row, at once."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Query

from cairn.core.errors import UnknownApproval
from cairn.web.answers import Approval, ApprovalPage
from cairn.web.deps import ClientDep
from cairn.web.errors import errors
from cairn.web.models import NO_NUL, NewDecision

router = APIRouter(tags=["approvals"])


@router.get("/approvals", response_model=ApprovalPage)
def list_approvals(
    client: ClientDep,
    workflow: Annotated[str | None, Query(max_length=200, pattern=NO_NUL)] = None,
    name: Annotated[
        str | None,
        Query(max_length=200, pattern=NO_NUL, description="The wait's event name."),
    ] = None,
    order: Literal["newest", "oldest"] = "newest",
    cursor: Annotated[
        int | None, Query(ge=1, description="next_cursor of the previous page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> dict[str, Any]:
    """The approvals still waiting for a decision, across runs, newest first (or oldest),
    a page at a time (keyset: pass next_cursor as cursor): what each run asks."""
    found = client.approvals(
        workflow=workflow, name=name, limit=limit, after=cursor, oldest_first=order == "oldest"
    )
    return {
        "approvals": [a.to_json() for a in found],
        "next_cursor": found[-1].approval_id if len(found) == limit else None,
    }


@router.get("/approvals/{approval_id}", response_model=Approval, responses=errors(404))
def get_approval(approval_id: int, client: ClientDep) -> dict[str, Any]:
    """One approval, with its decision (who, what, when) once decided."""
    found = client.approval(approval_id)
    if found is None:
        raise UnknownApproval(f"no approval {approval_id}")
    return found.to_json()


@router.post(
    "/approvals/{approval_id}/decision",
    response_model=Approval,
    responses=errors(
        404,
        409,
        422,
        why={
            404: "No such approval (unknown_approval).",
            409: "It was decided already, by a person or a standing rule (already_decided), "
            "or its run no longer waits on it: timed out or cancelled (approval_gone).",
            422: "The request breaks a rule of this document (invalid_request), or an edit "
            "without args, approve or deny with them (invalid_input).",
        },
    ),
)
def decide(
    approval_id: int, body: Annotated[NewDecision, Body()], client: ClientDep
) -> dict[str, Any]:
    """Decide an approval: its run gets the signal it waits on ({decision, args, note,
    approval_id, by}), stored in one transaction with the audit row, which names the
    token that decided (decided_by, decided_token) and its tenant (decided_tenant). A
    request is decided once: a second decision is 409 already_decided."""
    decided = client.decide(approval_id, body.decision, args=body.args, note=body.note)
    return decided.to_json()
