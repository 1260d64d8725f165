"""``GET /api/v1/batches/{id}/results``: a batch's members with their outcomes and results, a
page at a time (``pgjobs.flow``), behind the API's authorization."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from pgjobs import flow
from pgjobs.models import JobStatus
from pgjobs.submission import MAX_JOB_ID
from pgjobs.web.api import authorize
from pgjobs.web.backend import API_PREFIX, Server
from pgjobs.web.errors import responses

router = APIRouter(
    prefix=API_PREFIX,
    dependencies=[Depends(authorize)],
    responses=responses(401, 403, 422, 429, 500, 503),
)


class JobResult(BaseModel):
    """What one job left, where it is now (``pgjobs.JobResult``): a batch member's outcome and
    result."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    task: str | None = Field(description="Its task (null: the job is in no table any more).")
    status: JobStatus | None = Field(
        description="Where it is now; null: in no table (its archived row was pruned or purged)."
    )
    result: Any = Field(None, description="What its handler returned, once it succeeded.")
    reason: str | None = Field(None, description="A dead letter's reason.")
    error_type: str | None = None
    last_error: str | None = None
    name: str | None = Field(None, description="The name a dependent gave it (null for a member).")


class BatchResults(BaseModel):
    """One page of a batch's members with their outcomes and results, in id order."""

    results: list[JobResult]
    next_after: int | None = Field(
        description="Pass as `after` for the next page; null: this was the last."
    )


@router.get(
    "/batches/{batch_id}/results",
    response_model=BatchResults,
    responses=responses(404),
    summary="A batch's members with their outcomes and results, a page at a time",
)
def get_batch_results(
    batch_id: Annotated[int, Path(ge=1, le=MAX_JOB_ID, description="The batch id.")],
    server: Server,
    after: Annotated[
        int,
        Query(ge=0, le=MAX_JOB_ID, description="The `next_after` of the previous page (0: first)."),
    ] = 0,
    limit: Annotated[
        int, Query(ge=1, le=flow.MAX_PAGE_SIZE, description="Most members in the page.")
    ] = 100,
) -> BatchResults:
    """The members of a batch in id order, each with its status, its result once it succeeded,
    or its dead letter's reason and error, as ``app.batch_results_page`` reads them. A page ends
    early when its results add up to more than 1 MiB of JSON."""
    with server.connection() as conn:
        page = flow.batch_page(conn, batch_id, after, limit)
    return BatchResults(
        results=[JobResult.model_validate(member) for member in page.results],
        next_after=page.next_after,
    )
