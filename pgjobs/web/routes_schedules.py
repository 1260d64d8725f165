"""``/api/v1/schedules``: list the periodic schedules, pause and resume one, run one now, forget
one. Each route calls ``pgjobs.schedules``, as `pgjobs schedule` does; an unknown name is 404
``schedule_not_found``. A pause records who did it as the queue routes do."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Request, Response

from pgjobs import admin, schedules
from pgjobs.web import paths
from pgjobs.web.backend import API_PREFIX, Server, authorize, recorded_actor
from pgjobs.web.errors import responses
from pgjobs.web.models import ErrorResponse, JobSummary, Name
from pgjobs.web.queue_models import (
    PauseRequest,
    Schedule,
    ScheduleChange,
    ScheduleList,
    ScheduleRun,
)

logger = logging.getLogger("pgjobs.web")

router = APIRouter(
    prefix=API_PREFIX,
    dependencies=[Depends(authorize)],
    responses=responses(401, 403, 422, 429, 500, 503),
)

SchedulePath = Annotated[
    Name, Path(description="The schedule's name (`pgjobs schedule` lists them).")
]
_NO_SCHEDULE: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "No such schedule (or route)"}
}
_WRITES = {**responses(400, 408, 413, 415), **_NO_SCHEDULE}
_NAMED = "/schedules/{name:" + paths.TEXT + "}"


@router.get(
    "/schedules",
    response_model=ScheduleList,
    summary="Every periodic schedule, as `pgjobs schedule`",
)
def list_schedules(server: Server) -> ScheduleList:
    """Every schedule the database records, by name: expression, timezone, next and last run,
    whether a running worker declares it, whether it is paused and by whom."""
    with server.reading() as conn:
        return ScheduleList(schedules=[Schedule.of(s) for s in schedules.list_schedules(conn)])


@router.get(_NAMED, response_model=Schedule, responses=_NO_SCHEDULE, summary="A schedule")
def get_schedule(name: SchedulePath, server: Server) -> Schedule:
    with server.reading() as conn:
        return Schedule.of(schedules.schedule(conn, name))


@router.post(
    _NAMED + "/pause",
    response_model=ScheduleChange,
    responses=_WRITES,
    summary="Pause a schedule: none of its occurrences is enqueued",
)
def pause_schedule(
    name: SchedulePath,
    request: Request,
    server: Server,
    body: Annotated[PauseRequest | None, Body()] = None,
) -> ScheduleChange:
    """From each worker's next scheduler round on, the schedule enqueues nothing until resumed;
    jobs it enqueued already stay. Pausing a paused schedule keeps when and by whom."""
    by = recorded_actor(request)
    reason = None if body is None else body.reason
    with server.connection() as conn:
        change = schedules.pause(conn, name, reason=reason, by=by)
    if change.changed:
        logger.info("api: schedule %s paused (by %s)", change.schedule.name, by)
    return _change(change)


@router.post(
    _NAMED + "/resume",
    response_model=ScheduleChange,
    responses=_WRITES,
    summary="Resume a schedule",
)
def resume_schedule(name: SchedulePath, request: Request, server: Server) -> ScheduleChange:
    """Its occurrences are enqueued again; those missed while it was paused run as its
    ``catch_up`` rule says (last: the latest one; skip: none; N: the latest N)."""
    with server.connection() as conn:
        change = schedules.resume(conn, name)
    if change.changed:
        logger.info(
            "api: schedule %s resumed (by %s)", change.schedule.name, recorded_actor(request)
        )
    return _change(change)


@router.post(
    _NAMED + "/run",
    status_code=201,
    response_model=ScheduleRun,
    responses={
        **_WRITES,
        409: {
            "model": ErrorResponse,
            "description": "The server's app does not declare the schedule (serve it with --app)",
        },
    },
    summary="Run a schedule now: enqueue one job of it, ready at once",
)
def run_schedule(name: SchedulePath, request: Request, server: Server) -> ScheduleRun:
    """Enqueue one job as the schedule's occurrences are (task, payload, queue, priority,
    attempts), ready now, outside its cadence: its next occurrence stays, and a paused schedule
    stays paused. The payload is the declaration's: the server needs the app that declares the
    schedule (`pgjobs serve --app`), else 409 ``schedule_not_declared``."""
    app = server.app
    with server.connection() as conn:
        run = schedules.run_now(conn, name, app.periodics, app.enqueue_many)
        job = admin.job(conn, run.job_id)
    logger.info(
        "api: schedule %s run now as job %d (by %s)", run.name, run.job_id, recorded_actor(request)
    )
    return ScheduleRun(
        name=run.name,
        job_id=run.job_id,
        schedule=None if run.schedule is None else Schedule.of(run.schedule),
        job=JobSummary.model_validate(job),
    )


@router.delete(
    _NAMED,
    status_code=204,
    response_class=Response,
    responses=_NO_SCHEDULE,
    summary="Forget a schedule's row, as `pgjobs schedule --forget`",
)
def forget_schedule(name: SchedulePath, request: Request, server: Server) -> Response:
    """Delete the schedule's row (its last run is forgotten); a worker that still declares it
    records it again, from its next occurrence."""
    with server.connection() as conn:
        schedules.forget(conn, name)
    logger.info("api: schedule %s forgotten (by %s)", name, recorded_actor(request))
    return Response(status_code=204)


def _change(change: schedules.ScheduleChange) -> ScheduleChange:
    return ScheduleChange(changed=change.changed, schedule=Schedule.of(change.schedule))
