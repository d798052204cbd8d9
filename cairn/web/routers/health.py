"""For the operator: /healthz (a load balancer's probe, open without the token) and
/metrics (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from cairn.web.deps import ClientDep, MetricsDep
from cairn.web.models import Health

router = APIRouter(tags=["operations"])
# Answered without the Client, so never a 503 for Postgres or the broker being away.
NO_STORE = frozenset({"/metrics"})


@router.get(
    "/healthz",
    response_model=Health,
    responses={503: {"model": Health, "description": "Postgres or the broker is away."}},
)
def healthz(client: ClientDep) -> JSONResponse:
    """200 when Postgres and the broker answer, else 503 naming what does not."""
    problems = client.problems()
    answer = Health(ok=not problems, problems=problems)
    return JSONResponse(answer.model_dump(), 503 if problems else 200)


@router.get("/metrics", response_class=PlainTextResponse)
def prometheus(metrics: MetricsDep) -> Response:
    """The server's metrics in Prometheus' text format."""
    return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)
