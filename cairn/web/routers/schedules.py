"""/schedules: workflows started on a clock, thin over the app's Client, behind the same
guard as /runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Response

from cairn.steps import registry
from cairn.web.answers import Schedule, Schedules
from cairn.web.deps import ClientDep
from cairn.web.errors import error, errors
from cairn.web.models import NewSchedule
from cairn.workers.schedules import ScheduleConflict, UnknownSchedule

router = APIRouter(tags=["schedules"])
UNKNOWN = {404: "No such schedule (unknown_schedule)."}


def _answer(call: Callable[[], Any]) -> Any:
    """call()'s schedule as JSON (the route's Schedule checks it); a missing or
    conflicting schedule as the API's error shape (404, 409)."""
    try:
        found = call()
    except UnknownSchedule as exc:
        return error(404, "unknown_schedule", str(exc))
    except ScheduleConflict as exc:
        return error(409, "schedule_conflict", str(exc))
    return found.to_json()


@router.get("/schedules", response_model=Schedules)
def list_schedules(client: ClientDep) -> dict[str, Any]:
    """Every schedule, by name: its timing, catch-up policy, next tick and last one fired."""
    return {"schedules": [s.to_json() for s in client.schedules()]}


@router.post(
    "/schedules",
    status_code=201,
    response_model=Schedule,
    responses=errors(
        409,
        422,
        why={
            409: "Another schedule has the name: send replace: true (schedule_conflict).",
            422: "The request breaks a rule of this document (invalid_request), or one the "
            "server checks: not one of cron and every, a cron expression that does not "
            "parse, an input its workflow refuses (invalid_input); a workflow not "
            "registered (unknown_workflow).",
        },
    ),
)
def add_schedule(new: Annotated[NewSchedule, Body()], client: ClientDep) -> Any:
    """Add a schedule; each tick starts one run, `sched:<name>:<UTC tick>`. The same
    definition again returns it; another under the name is 409 unless replace is true."""
    registry.get(new.workflow)  # UnknownWorkflow (422) names the ones it knows
    return _answer(
        lambda: client.add_schedule(
            new.name,
            new.workflow,
            new.input,
            cron=new.cron,
            every=new.every,
            catch_up=new.catch_up,
            replace=new.replace,
        )
    )


@router.post("/schedules/{name}/pause", response_model=Schedule, responses=errors(404, why=UNKNOWN))
def pause_schedule(name: str, client: ClientDep) -> Any:
    """Stop firing it until resumed."""
    return _answer(lambda: client.pause_schedule(name))


@router.post(
    "/schedules/{name}/resume", response_model=Schedule, responses=errors(404, why=UNKNOWN)
)
def resume_schedule(name: str, client: ClientDep) -> Any:
    """Fire it again from its next tick after now (ticks while paused are not fired)."""
    return _answer(lambda: client.resume_schedule(name))


@router.delete(
    "/schedules/{name}", status_code=204, response_model=None, responses=errors(404, why=UNKNOWN)
)
def remove_schedule(name: str, client: ClientDep) -> Response:
    """Delete it; the runs it started stay."""
    if not client.remove_schedule(name):
        return error(404, "unknown_schedule", f"no schedule {name!r}")
    return Response(status_code=204)
