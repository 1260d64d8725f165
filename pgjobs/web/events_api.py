"""``POST /api/v1/jobs/{id}/events/{name}``: send an event to a workflow job, as
``app.send_event`` and ``pgjobs event send`` do (``pgjobs.events``)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Request
from pydantic import BaseModel

from pgjobs import events
from pgjobs.submission import MAX_JOB_ID, MAX_NAME_LENGTH
from pgjobs.web.auth import READ_METHODS
from pgjobs.web.backend import API_PREFIX, Credentials, Server, check_token
from pgjobs.web.errors import responses


async def authorize(request: Request, credentials: Credentials) -> None:
    """A full token: sending an event writes."""
    check_token(request, credentials, write=request.method not in READ_METHODS)


router = APIRouter(
    prefix=API_PREFIX,
    dependencies=[Depends(authorize)],
    responses=responses(401, 403, 422, 429, 500, 503),
)


class SentEvent(BaseModel):
    """An event in a workflow job's mailbox (``pgjobs.events.SentEvent``)."""

    id: int
    job_id: int
    name: str
    sent_at: datetime
    woke: bool


@router.post(
    "/jobs/{job_id}/events/{name}",
    status_code=201,
    response_model=SentEvent,
    responses=responses(400, 404, 408, 409, 413, 415),
    summary="Send an event to a workflow job",
    openapi_extra={
        "requestBody": {
            "content": {"application/json": {"example": {"tracking": "1Z999AA10123456784"}}}
        }
    },
)
def send_event(
    job_id: Annotated[int, Path(ge=1, le=MAX_JOB_ID, description="The workflow job's id.")],
    name: Annotated[
        str,
        Path(min_length=1, max_length=MAX_NAME_LENGTH, description="The event's name."),
    ],
    server: Server,
    payload: Annotated[Any, Body(description="The event's payload: any JSON value.")] = None,
) -> SentEvent:
    """Put the event in the job's mailbox, where the workflow's ``ctx.wait_for(name)`` takes it
    (kept if it arrives first); a workflow waiting for it is ready at once (``woke``). 404: no
    such job; 409: the job has ended."""
    with server.connection() as conn:
        sent = events.send(conn, job_id, name, payload)
    return SentEvent(
        id=sent.id, job_id=sent.job_id, name=sent.name, sent_at=sent.sent_at, woke=sent.woke
    )
