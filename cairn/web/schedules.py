"""The HTTP API's schedules: thin over the app's Client, behind the same guard as /runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from cairn.client.client import Client
from cairn.steps import registry
from cairn.web.api import error
from cairn.web.openapi import NO_NUL, WHOLE, errors
from cairn.workers.schedules import ScheduleConflict, UnknownSchedule

router = APIRouter(tags=["schedules"])
UNKNOWN = {404: "No such schedule (unknown_schedule)."}


class NewSchedule(BaseModel):
    """A workflow started on a clock: a cron expression (UTC) or every N seconds."""

    model_config = ConfigDict(extra="forbid", strict=True)
    # The whole request's example is the operation's (openapi.request_examples).
    name: str = Field(min_length=1, max_length=100, pattern=NO_NUL, examples=["nightly"])
    workflow: str = Field(min_length=1, max_length=200, pattern=NO_NUL)
    input: dict[str, Any] = Field(default_factory=dict)
    cron: str | None = Field(default=None, max_length=200, pattern=NO_NUL, examples=["0 3 * * *"])
    every: Annotated[int, Field(ge=1, lt=2**31), WHOLE] | None = Field(
        default=None, description="Seconds between ticks (or cron)."
    )
    catch_up: Literal["latest", "all", "skip"] = "latest"
    replace: bool = Field(default=False, description="Overwrite a schedule of that name.")


def _answer(request: Request, call: Callable[[Client], Any], status: int = 200) -> Any:
    """call(client), its schedule as JSON; a missing or conflicting schedule as the API's
    error shape (404, 409)."""
    try:
        found = call(request.app.state.client)
    except UnknownSchedule as exc:
        return error(404, "unknown_schedule", str(exc))
    except ScheduleConflict as exc:
        return error(409, "schedule_conflict", str(exc))
    return JSONResponse(found.to_json(), status_code=status)


@router.get("/schedules")
def list_schedules(request: Request) -> dict[str, Any]:
    """Every schedule, by name: its timing, catch-up policy, next tick and last one fired."""
    return {"schedules": [s.to_json() for s in request.app.state.client.schedules()]}


@router.post(
    "/schedules",
    status_code=201,
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
def add_schedule(request: Request, new: Annotated[NewSchedule, Body()]) -> Any:
    """Add a schedule; each tick starts one run, `sched:<name>:<UTC tick>`. The same
    definition again returns it; another under the name is 409 unless replace is true."""
    registry.get(new.workflow)  # UnknownWorkflow (422) names the ones it knows
    return _answer(
        request,
        lambda c: c.add_schedule(
            new.name,
            new.workflow,
            new.input,
            cron=new.cron,
            every=new.every,
            catch_up=new.catch_up,
            replace=new.replace,
        ),
        201,
    )


@router.post("/schedules/{name}/pause", responses=errors(404, why=UNKNOWN))
def pause_schedule(request: Request, name: str) -> Any:
    """Stop firing it until resumed."""
    return _answer(request, lambda c: c.pause_schedule(name))


@router.post("/schedules/{name}/resume", responses=errors(404, why=UNKNOWN))
def resume_schedule(request: Request, name: str) -> Any:
    """Fire it again from its next tick after now (ticks while paused are not fired)."""
    return _answer(request, lambda c: c.resume_schedule(name))


@router.delete(
    "/schedules/{name}", status_code=204, response_model=None, responses=errors(404, why=UNKNOWN)
)
def remove_schedule(request: Request, name: str) -> Response:
    """Delete it; the runs it started stay."""
    if not request.app.state.client.remove_schedule(name):
        return error(404, "unknown_schedule", f"no schedule {name!r}")
    return Response(status_code=204)


def mount(app: FastAPI) -> None:
    """Add the schedules' routes to the API's app."""
    app.include_router(router)
