"""The routes outside ``/api/v1`` that probes and Prometheus call: ``/healthz`` and ``/readyz``
(no token), and ``/metrics`` (a token when tokens are configured, unless $PGJOBS_METRICS_PUBLIC=1).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from pgjobs import db, migrate
from pgjobs.errors import SchemaMissing
from pgjobs.web import models
from pgjobs.web.backend import Credentials, Server, check_token
from pgjobs.web.errors import responses

health_router = APIRouter()


@health_router.get(
    "/healthz", response_model=models.Health, summary="The process is up (no database)"
)
async def healthz() -> models.Health:
    return models.Health(status="ok")


@health_router.get(
    "/readyz",
    response_model=models.Health,
    responses=responses(500, 503),
    summary="The database is reachable and its pgjobs schema is at this release's head",
)
def readyz(server: Server) -> models.Health:
    with server.connection() as conn:
        revision = db.schema_revision(conn)
    if revision != migrate.head():
        where = "missing" if revision is None else f"at revision {revision}"
        raise SchemaMissing(
            f"the pgjobs schema is {where}, this server needs {migrate.head()}: "
            "run `pgjobs migrate`"
        )
    return models.Health(status="ready")


@health_router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus' text exposition format (see the README's metric names)",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **responses(401, 429, 500, 503),
    },
    summary="Queue-level metrics for Prometheus",
)
def prometheus_metrics(request: Request, credentials: Credentials, server: Server) -> Response:
    """Jobs by queue, task and state, dead letters, the oldest ready job's age, workers,
    finished jobs by outcome, run time and pickup latency; read from the tables at most every
    few seconds. A token (read-only will do) when tokens are configured, unless the server
    makes it public ($PGJOBS_METRICS_PUBLIC=1). 503 only until the database was reached once;
    after that a database outage shows as ``pgjobs_metrics_up 0``."""
    if not server.metrics_public:
        check_token(request, credentials, write=False)
    body, content_type = server.metrics.render(
        server.read_pool(), server.read_dsn or server.dsn, replica=server.read_dsn is not None
    )
    return Response(content=body, media_type=content_type)
