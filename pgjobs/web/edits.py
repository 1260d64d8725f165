"""``PATCH /api/v1/jobs/{id}``: edit a queued job that is not running, as `pgjobs job edit`
does (``pgjobs.editing``), under a full (write) token.

The body names the fields to change; a field left out (or null) stays as it is, ``tags: []``
removes the job's tags. The answer is the job with its edits, the new one last. The edit is
recorded as the host application's principal under ``create_app(auth=...)``, else as ``api``.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Request
from pydantic import AwareDatetime, Field

from pgjobs import editing
from pgjobs.submission import MAX_ATTEMPTS_LIMIT, MAX_JOB_ID, PRIORITY_RANGE
from pgjobs.web import models
from pgjobs.web.backend import API_PREFIX, Credentials, Server, actor, check_token
from pgjobs.web.errors import responses

#: Who an edit over HTTP is recorded as when the request names no one (pgjobs' own tokens).
API_EDITOR = "api"


async def authorize(request: Request, credentials: Credentials) -> None:
    """An edit writes: a full token, not a read-only one."""
    check_token(request, credentials, write=True)


edits_router = APIRouter(
    prefix=API_PREFIX,
    dependencies=[Depends(authorize)],
    responses=responses(401, 403, 422, 429, 500, 503),
)


class JobEditRequest(models._Request):
    """The fields of a queued job to change; those left out stay as they are."""

    priority: models.Whole | None = Field(
        None, ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1], description="Higher runs first."
    )
    run_at: AwareDatetime | None = Field(
        None,
        description="When to run it (ISO 8601 with a timezone). Or `delay`. A job waiting for "
        "its dependencies runs then once they have succeeded.",
    )
    delay: models.Seconds | None = Field(
        None, description="Seconds from now to run it (0: now). Or `run_at`."
    )
    payload: dict[str, Any] | None = Field(
        None,
        description="The new payload, replacing the whole of it: checked against the job's "
        "handler (and stored at its payload version) when the server has the app.",
    )
    max_attempts: models.Whole | None = Field(
        None, ge=1, le=MAX_ATTEMPTS_LIMIT, description="More than it has spent already."
    )
    tags: models.Tags | None = Field(None, description="Its tags become these; [] removes them.")


_EXAMPLES: dict[str, Any] = {
    "priority": {
        "summary": "Run it before the others",
        "value": {"priority": 7},
    },
    "reschedule": {
        "summary": "Move it to a later time",
        "value": {"run_at": "2030-01-02T09:00:00Z"},
    },
    "payload": {
        "summary": "Fix its payload and give it more attempts",
        "value": {"payload": {"user_id": 42, "locale": "fr"}, "max_attempts": 10},
    },
    "tags": {"summary": "Retag it", "value": {"tags": ["customer:42", "urgent"]}},
}


@edits_router.patch(
    "/jobs/{job_id}",
    response_model=models.Job,
    responses={**responses(400, 404, 408, 409, 413, 415)},
    summary="Edit a queued job",
)
def edit_job(
    job_id: Annotated[int, Path(ge=1, le=MAX_JOB_ID, description="The job id.")],
    body: Annotated[JobEditRequest, Body(openapi_examples=_EXAMPLES)],
    request: Request,
    server: Server,
) -> models.Job:
    """Change the priority, run time, payload, max attempts or tags of a queued job that is not
    running, and record who did, when, and each field's old and new value (``edits``). A running
    job, or one a worker is claiming at this instant: 409. A finished or dead job: 409. An
    unknown id: 404. A value that does not fit (a payload its handler could not take, a
    ``max_attempts`` not above the attempts spent): 422. Nothing is written then."""
    tasks = server.app.tasks if server.app_given else None
    with server.connection() as conn:
        done = editing.edit(
            conn,
            job_id,
            priority=body.priority,
            run_at=body.run_at,
            run_in=body.delay,
            payload=body.payload,
            max_attempts=body.max_attempts,
            # [] removes the tags: the check makes it None, which would mean "unchanged".
            tags=(body.tags or []) if "tags" in body.model_fields_set else None,
            by=actor(request) or API_EDITOR,
            tasks=tasks,
        )
        edits = [
            models.JobEdit.model_validate(dataclasses.asdict(e))
            for e in editing.edits(conn, job_id)
        ]
    return models.Job.model_validate(done.job).model_copy(update={"edits": edits})
