"""``/api/v1/queues``: list the queues with their settings, pause and resume one, set or clear
its limits (concurrency, rate, group concurrency). Each route calls ``pgjobs.queues``, as
`pgjobs queue` does, so both refuse the same input with the same words; reads need a token,
writes a full one. A pause records who did it as the dashboard does: the host's signed-in user
under ``create_app(auth=...)``, else ``api (client address)``."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Request

from pgjobs import queues
from pgjobs.web import paths
from pgjobs.web.backend import API_PREFIX, Server, authorize, recorded_actor
from pgjobs.web.errors import responses
from pgjobs.web.models import ErrorResponse, Name
from pgjobs.web.queue_models import PauseRequest, Queue, QueueChange, QueueList, QueueSettings

logger = logging.getLogger("pgjobs.web")

router = APIRouter(
    prefix=API_PREFIX,
    dependencies=[Depends(authorize)],
    responses=responses(401, 403, 422, 429, 500, 503),
)

#: A queue's name, any character included (``/`` sent as %2F or as is).
QueuePath = Annotated[Name, Path(description="The queue's name.")]
_NO_QUEUE: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "No such queue (or route)"}
}
_WRITES = responses(400, 408, 413, 415)


@router.get(
    "/queues",
    response_model=QueueList,
    summary="Every known queue with its settings, as `pgjobs queue list`",
)
def list_queues(server: Server) -> QueueList:
    """Queues that hold a job (ready, scheduled or running) or have settings (paused, or once
    paused; limits), by name."""
    with server.reading() as conn:
        return QueueList(queues=[Queue.of(state) for state in queues.list_queues(conn)])


@router.get(
    "/queues/{name:" + paths.TEXT + "}",
    response_model=Queue,
    responses=_NO_QUEUE,
    summary="A queue and its settings",
)
def get_queue(name: QueuePath, server: Server) -> Queue:
    """A queue known to hold jobs, to have settings or to be declared by the server's app's
    tasks; 404 ``queue_not_found`` otherwise."""
    declared = {task.queue for task in server.app.tasks.values()}
    with server.reading() as conn:
        return Queue.of(queues.known_queue(conn, name, declared=declared))


@router.post(
    "/queues/{name:" + paths.TEXT + "}/pause",
    response_model=QueueChange,
    responses=_WRITES,
    summary="Pause a queue: no worker claims its jobs",
)
def pause_queue(
    name: QueuePath,
    request: Request,
    server: Server,
    body: Annotated[PauseRequest | None, Body()] = None,
) -> QueueChange:
    """From each worker's next claim on, the queue's jobs are not claimed; they stay ready and
    running jobs finish. A queue without jobs can be paused too, before its first job. Pausing
    a paused queue keeps when and by whom (``changed`` false)."""
    by = recorded_actor(request)
    with server.connection() as conn:
        change = queues.pause(conn, name, reason=None if body is None else body.reason, by=by)
    if change.changed:
        logger.info("api: queue %s paused (by %s)", change.queue.name, by)
    return _change(change)


@router.post(
    "/queues/{name:" + paths.TEXT + "}/resume",
    response_model=QueueChange,
    responses=_WRITES,
    summary="Resume a queue; its idle workers are woken",
)
def resume_queue(name: QueuePath, request: Request, server: Server) -> QueueChange:
    """Workers claim the queue's jobs again, idle ones at once. Resuming a queue that is not
    paused changes nothing (``changed`` false)."""
    with server.connection() as conn:
        change = queues.resume(conn, name)
    if change.changed:
        logger.info("api: queue %s resumed (by %s)", change.queue.name, recorded_actor(request))
    return _change(change)


@router.patch(
    "/queues/{name:" + paths.TEXT + "}",
    response_model=QueueChange,
    responses=_WRITES,
    summary="Set or clear a queue's limits, as `pgjobs queue limit`",
)
def set_queue_limits(
    name: QueuePath, body: QueueSettings, request: Request, server: Server
) -> QueueChange:
    """Set the limits given (``concurrency``, ``rate``, ``group_concurrency``, ``group_rate``),
    obeyed by every worker from its next claim on; null removes one, a field left out stays. An
    empty body is refused (422), as a limit out of range or a rate that does not parse; nothing
    changes."""
    given = body.model_fields_set
    options = {
        field: getattr(body, field) if field in given else queues.KEEP
        for field in ("concurrency", "rate", "group_concurrency", "group_rate")
    }
    with server.connection() as conn:
        change = queues.limit(conn, name, **options)
    if change.changed:
        logger.info("api: queue %s limits set (by %s)", change.queue.name, recorded_actor(request))
    return _change(change)


def _change(change: queues.Change) -> QueueChange:
    return QueueChange(**Queue.of(change.queue).model_dump(), changed=change.changed)
