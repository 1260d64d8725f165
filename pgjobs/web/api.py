"""The routes of ``/api/v1/...``, each of which needs a token (a full one unless it only reads):
jobs, dead letters, stats and workers. ``/healthz``, ``/readyz`` and ``/metrics`` are ``health``'s.

Each route is thin: it turns the request into a call of ``pgjobs.admin``, ``pgjobs.browse``,
``pgjobs.stats`` or the App's enqueue on one pooled connection, and the result into a response
model. Validation beyond types and bounds is pgjobs' own; its errors become the one error shape
(``pgjobs.web.errors``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from pgjobs import admin, batches, browse, db, dependencies, editing, enqueue, flow
from pgjobs import stats as read_model
from pgjobs.enqueue import PreparedJob
from pgjobs.errors import ConfigurationError, JobCancelled, JobFailed, WaitTimeout
from pgjobs.maintenance.registry import STALE_AFTER
from pgjobs.models import JobHistory, JobStatus
from pgjobs.submission import MAX_JOB_ID, MAX_KEY_BYTES
from pgjobs.tags import check as check_tags
from pgjobs.web import enqueuing, models, paths, stats_models
from pgjobs.web.auth import READ_METHODS
from pgjobs.web.backend import API_PREFIX, Backend, Credentials, Server, backend, check_token
from pgjobs.web.errors import ApiError, responses
from pgjobs.workflows import history as workflow_history


async def authorize(request: Request, credentials: Credentials) -> None:
    """Every /api/v1 route: a token, and a full one unless the method only reads."""
    check_token(request, credentials, write=request.method not in READ_METHODS)


router = APIRouter(
    prefix=API_PREFIX,
    dependencies=[Depends(authorize)],
    responses=responses(401, 403, 422, 429, 500, 503),
)

JobIdPath = Annotated[int, Path(ge=1, le=MAX_JOB_ID, description="The job id.")]
QueueQuery = Annotated[models.Name | None, Query(description="Only this queue.")]
TaskQuery = Annotated[models.Name | None, Query(description="Only this task.")]
TagQuery = Annotated[
    list[models.Text] | None,
    Query(description="Only jobs carrying this tag; repeat it: jobs carrying every one."),
]
_WRITES = responses(400, 408, 413, 415)


def _job(history: JobHistory) -> models.Job:
    return models.Job.model_validate(history)


def _job_and_graph(conn: Any, job_id: int) -> models.Job:
    """Job ``job_id`` with its dependencies and dependents (a second statement), and the results
    of its dependencies (a third, when it has some)."""
    graph = dependencies.of(conn, job_id)
    shown = flow.shown(flow.of(conn, job_id)) if graph.after else {}
    edges = {
        "after": [
            models.AfterEdge(
                id=e.id,
                status=e.status,
                name=e.name,
                result=shown.get(e.id),
                result_omitted=e.status is JobStatus.SUCCEEDED and e.id not in shown,
            )
            for e in graph.after
        ],
        "dependents": [
            models.JobEdge(id=e.id, status=e.status, name=e.name) for e in graph.dependents
        ],
    }
    edits = [
        models.JobEdit.model_validate(dataclasses.asdict(e)) for e in editing.edits(conn, job_id)
    ]
    steps = [
        models.WorkflowEntry.model_validate(dataclasses.asdict(e))
        for e in workflow_history.of(conn, job_id)
    ]
    return _job(admin.job(conn, job_id)).model_copy(
        update={**edges, "waiting_on": graph.waiting_on, "edits": edits, "workflow": steps}
    )


# -- jobs -----------------------------------------------------------------------------------------


_ENQUEUED_EARLIER: dict[int | str, dict[str, Any]] = {
    200: {"model": models.Job, "description": "The job enqueued earlier under this key"}
}


def _enqueue(server: Backend, row: PreparedJob, response: Response) -> models.Job:
    """Enqueue ``row`` and answer the job: 201 when this request created it, 200 when its
    idempotency key was already taken (the job that holds it, wherever it is now)."""
    with server.connection() as conn:
        if row.idempotency_key is None:
            job_id = _insert(conn, row)
        else:
            # One transaction, so that whether the job is new can be read from its row.
            with conn.transaction():
                job_id = _insert(conn, row)
                if not browse.job_is_new(conn, job_id):
                    response.status_code = 200
        return _job_and_graph(conn, job_id)


def _insert(conn: Any, row: PreparedJob) -> int:
    """``row`` inserted as ``app.enqueue`` inserts it on a connection of the caller's."""
    return enqueue.insert(conn, [row])[0]


@router.post(
    "/jobs",
    status_code=201,
    response_model=models.Job,
    responses={**_ENQUEUED_EARLIER, **_WRITES},
    summary="Enqueue a job",
)
async def enqueue_job(body: models.JobCreate, request: Request, response: Response) -> models.Job:
    """Enqueue one job and answer it (``id`` included) with 201. With an ``idempotency_key``
    already taken, nothing is enqueued: the answer is 200 with the job that holds the key."""
    # The Backend read here rather than as a dependency: FastAPI's bookkeeping of each one costs
    # a tenth of this route's CPU, which serves the most requests.
    server = backend(request)
    row = server.app.prepare(body.spec(body.idempotency_key), complete=True)
    if enqueue.fits(row):
        # With the other requests' plain jobs (pgjobs.web.enqueuing), answered from its inserted
        # row: a job just enqueued has no dependencies nor dependents, and no edits.
        inserted = await server.enqueuer.insert(row)
        return _job(inserted).model_copy(
            update={"after": [], "dependents": [], "edits": [], "workflow": []}
        )
    return await run_in_threadpool(_enqueue, server, row, response)


@router.post(
    "/jobs/batch",
    status_code=201,
    response_model=models.JobList,
    responses=_WRITES,
    summary="Enqueue many jobs, all or nothing",
)
def enqueue_jobs(body: models.JobBatchCreate, server: Server) -> models.JobList:
    """Enqueue every job in one transaction, or none when one is invalid (the error names it:
    ``jobs[3].priority``). Answers the jobs in the order given."""
    specs = (job.spec(job.idempotency_key) for job in body.jobs)
    rows = server.app.prepare_many(specs, complete=True)
    with server.connection() as conn:
        if all(map(enqueue.fits, rows)):
            # Plain jobs: answered from their inserted rows, as one job is.
            found = enqueuing.insert(conn, rows)
        else:
            ids = enqueue.insert(conn, rows, many=True)
            # Keys already taken answer the jobs that hold them, wherever they are now.
            found = browse.jobs_by_id(conn, ids)
    return models.JobList(jobs=[_job(job) for job in found])


@router.put(
    # A key may hold "/" (sent as %2F, which the server decodes before routing): everything
    # after /jobs/ is the key.
    "/jobs/{key:" + paths.TEXT + "}",
    status_code=201,
    response_model=models.Job,
    responses={**_ENQUEUED_EARLIER, **_WRITES},
    summary="Enqueue a job under a key of your choosing, idempotently",
)
def put_job(
    key: Annotated[
        models.Text,
        Path(min_length=1, max_length=MAX_KEY_BYTES, description="The idempotency key."),
    ],
    body: models.JobOptions,
    server: Server,
    response: Response,
) -> models.Job:
    """Enqueue the job under idempotency key ``key``: 201 the first time, then 200 with the same
    job on every retry of the request, wherever the job is by then (the body of a retry is not
    compared with the first one)."""
    return _enqueue(server, server.app.prepare(body.spec(key), complete=True), response)


@router.get(
    "/jobs",
    response_model=models.JobPage,
    responses=responses(400),
    summary="List jobs by state, queue, task and time, newest first",
)
def list_jobs(
    server: Server,
    state: Annotated[
        list[JobStatus] | None,
        Query(description="Only jobs in these states (repeat the parameter for several)."),
    ] = None,
    queue: QueueQuery = None,
    task: TaskQuery = None,
    tag: TagQuery = None,
    since: Annotated[
        datetime | None,
        Query(description="Entered its table at or after (ISO 8601 with a timezone)."),
    ] = None,
    until: Annotated[datetime | None, Query(description="Entered its table before.")] = None,
    limit: Annotated[int, Query(ge=1, le=browse.MAX_PAGE_SIZE)] = browse.DEFAULT_PAGE_SIZE,
    cursor: Annotated[
        str | None, Query(max_length=200, description="next_cursor of the previous page.")
    ] = None,
) -> models.JobPage:
    """Jobs wherever they are, newest first by the moment each entered its table (created or
    redriven for queued jobs, finished for archived ones, failed for dead ones). Page with
    ``cursor``: ``next_cursor`` is null on the last page."""
    with server.reading() as conn:
        page = browse.jobs(
            conn,
            states=state,
            queue=queue,
            task=task,
            since=since,
            until=until,
            limit=limit,
            cursor=cursor,
            tags=tag,
        )
    return models.JobPage(
        jobs=[models.JobSummary.model_validate(job) for job in page.jobs],
        next_cursor=page.next_cursor,
    )


#: The longest ``?wait`` of ``GET /jobs/{id}``, in seconds.
MAX_WAIT = 60.0


@router.get(
    "/jobs/{job_id}",
    response_model=models.Job,
    responses=responses(404),
    summary="A job, wherever it is",
)
async def get_job(
    job_id: JobIdPath,
    server: Server,
    wait: Annotated[
        float,
        Query(
            ge=0,
            le=MAX_WAIT,
            description="Long poll: answer when the job has ended (succeeded, dead, cancelled "
            "or expired), or after this many seconds (at most 60) with the job as it is then, "
            "200 either way. 0: at once.",
        ),
    ] = 0,
) -> models.Job:
    """A job queued, running, archived or dead, with its whole record, as `pgjobs job show`.
    With ``?wait=30``, answered when the job ends, or after 30 seconds as it is then."""
    if wait > 0:
        with contextlib.suppress(JobFailed, JobCancelled, WaitTimeout):  # ended, or not yet
            await server.waiting_app().wait_async(job_id, timeout=wait)
    return await run_in_threadpool(_job_now, server, job_id)


def _job_now(server: Backend, job_id: int) -> models.Job:
    with server.connection() as conn:
        return _job_and_graph(conn, job_id)


@router.get(
    "/batches/{batch_id}",
    response_model=models.Batch,
    responses=responses(404),
    summary="A batch: its counts, callback and members by status",
)
def get_batch(
    batch_id: Annotated[int, Path(ge=1, le=MAX_JOB_ID, description="The batch id.")],
    server: Server,
) -> models.Batch:
    """A batch of jobs with a callback (``app.batch``), as `pgjobs batch show --json`."""
    with server.connection() as conn:
        return models.Batch.model_validate(batches.status(conn, batch_id))


@router.post(
    "/jobs/{job_id}/cancel",
    response_model=models.Job,
    responses={**_WRITES, **responses(404, 409)},
    summary="Cancel a queued job",
)
def cancel_job(
    job_id: JobIdPath,
    server: Server,
    force: Annotated[bool, Query(description="As the body's force.")] = False,
    body: Annotated[models.CancelRequest | None, Body()] = None,
) -> models.Job:
    """Archive a queued job as cancelled, unrun. A running job: 409, unless ``force`` (query or
    body): its worker is asked to stop the handler, and its outcome is discarded. A finished job:
    409."""
    with server.connection() as conn:
        return _job(admin.cancel(conn, job_id, force=force or (body is not None and body.force)))


@router.post(
    "/jobs/{job_id}/replay",
    status_code=201,
    response_model=models.Job,
    responses={**_WRITES, **responses(404, 409)},
    summary="Enqueue a finished or dead job again",
)
def replay_job(
    job_id: JobIdPath,
    server: Server,
    body: Annotated[models.ReplayRequest | None, Body()] = None,
) -> models.Job:
    """Enqueue a finished or dead job again as a new job (``replay_of`` = this id), answered
    with 201. The copy of an expired job is archived at once as expired (status ``expired``)
    unless the body gives a new ``expires_at`` or ``expires_in``. A job still queued: 409."""
    expires_at = None if body is None else body.expires_at
    expires_in = None if body is None else body.expires_in
    with server.connection() as conn:
        new_id = admin.replay(conn, job_id, expires_at=expires_at, expires_in=expires_in)
        return _job(admin.job(conn, new_id))


@router.post(
    "/jobs/{job_id}/outcome",
    response_model=models.Job,
    responses={**_WRITES, **responses(404, 409)},
    summary="Report the outcome of an external job's attempt",
)
def report_outcome(job_id: JobIdPath, body: models.OutcomeReport, server: Server) -> models.Job:
    """Settle the running attempt ``attempt`` of an external job: archived on success; on
    failure retried with backoff (when ``retryable`` and attempts remain) or dead-lettered.
    A report for an attempt that is not the current one, or whose lease is over, changes
    nothing: 409 ``stale_outcome``. A job whose running attempt was not delivered to an external
    task's downstream (a Python handler runs it) cannot be reported: 409 ``not_external``."""
    with server.connection() as conn:
        retry, external = None, None
        if server.app_given and server.app.tasks:
            task = server.app.tasks.get(admin.job(conn, job_id).task)
            if task is not None:
                retry, external = task.retry, task.external is not None
        settled = admin.report_outcome(
            conn,
            job_id,
            attempt=body.attempt,
            status=body.status,
            retryable=body.retryable,
            error=body.error,
            result=body.result,
            retry=retry,
            external=external,
        )
    return _job(settled)


# -- dead letters ---------------------------------------------------------------------------------


def _dead_filter(
    ids: list[int] | None,
    queue: str | None,
    task: str | None,
    since: datetime | None,
    until: datetime | None,
    error: str | None,
    fingerprint: str | None,
    tags: list[str] | None = None,
) -> admin.DeadFilter:
    for name, moment in (("since", since), ("until", until)):
        if moment is not None and (moment.tzinfo is None or moment.utcoffset() is None):
            raise ConfigurationError(f"{name} must carry a timezone, got {moment}", field=name)
    return admin.DeadFilter(
        ids=tuple(ids) if ids else None,
        queue=queue,
        task=task,
        since=since,
        until=until,
        error=error,
        fingerprint=fingerprint,
        tags=check_tags(tags, "tag"),
    )


ErrorQuery = Annotated[
    models.Text | None,
    Query(min_length=1, max_length=1000, description="The error message contains this."),
]
FingerprintQuery = Annotated[
    models.Text | None,
    Query(min_length=1, max_length=1000, description="An error fingerprint, or its 8-digit id."),
]
SinceQuery = Annotated[datetime | None, Query(description="Failed at or after (ISO 8601).")]
UntilQuery = Annotated[datetime | None, Query(description="Failed before (ISO 8601).")]


@router.get(
    "/dead-letters",
    response_model=models.DeadJobList,
    summary="Dead jobs, newest first",
)
def list_dead_letters(
    server: Server,
    queue: QueueQuery = None,
    task: TaskQuery = None,
    since: SinceQuery = None,
    until: UntilQuery = None,
    error: ErrorQuery = None,
    fingerprint: FingerprintQuery = None,
    tag: TagQuery = None,
    limit: Annotated[int, Query(ge=1, le=browse.MAX_PAGE_SIZE)] = admin.DEFAULT_LIST_LIMIT,
    tracebacks: Annotated[bool, Query(description="Include each job's traceback.")] = False,
) -> models.DeadJobList:
    """Dead jobs matching the filters of `pgjobs dead list`, newest first, at most ``limit``."""
    where = _dead_filter(None, queue, task, since, until, error, fingerprint, tag)
    with server.reading() as conn:
        found = admin.dead_jobs(conn, where, limit=limit, tracebacks=tracebacks)
    return models.DeadJobList(dead_letters=[models.DeadJob.model_validate(job) for job in found])


@router.get(
    "/dead-letters/groups",
    response_model=models.DeadGroupList,
    summary="Dead jobs counted by task and error fingerprint",
)
def dead_letter_groups(
    server: Server,
    queue: QueueQuery = None,
    task: TaskQuery = None,
    since: SinceQuery = None,
    until: UntilQuery = None,
    error: ErrorQuery = None,
    fingerprint: FingerprintQuery = None,
    tag: TagQuery = None,
) -> models.DeadGroupList:
    """Dead jobs matching the filters, counted by task and error fingerprint, largest first."""
    where = _dead_filter(None, queue, task, since, until, error, fingerprint, tag)
    with server.reading() as conn:
        groups = admin.dead_groups(conn, where)
    return models.DeadGroupList(groups=[models.DeadGroup.model_validate(g) for g in groups])


@router.get(
    "/dead-letters/{job_id}",
    response_model=models.DeadJob,
    responses=responses(404),
    summary="One dead job, with its traceback",
)
def get_dead_letter(job_id: JobIdPath, server: Server) -> models.DeadJob:
    with server.connection() as conn:
        return models.DeadJob.model_validate(admin.dead_job(conn, job_id))


@router.post(
    "/dead-letters/redrive",
    response_model=models.SelectionResult,
    responses={**_WRITES, **responses(404)},
    summary="Move dead jobs back to the queue",
)
def redrive_dead_letters(
    body: models.DeadSelectionRequest, server: Server
) -> models.SelectionResult:
    """Move the dead jobs named (``ids``: all must be dead, else 404 and nothing moves) or
    matching the filters back to the queue, ready now with fresh attempts, in batches of
    ``batch_size`` (each one transaction). ``dry_run``: the count and ids that would move."""
    return _move(body, server, "redrive", admin.redrive_batches)


@router.post(
    "/dead-letters/purge",
    response_model=models.SelectionResult,
    responses={**_WRITES, **responses(404)},
    summary="Delete dead jobs for good",
)
def purge_dead_letters(body: models.PurgeRequest, server: Server) -> models.SelectionResult:
    """Delete dead jobs for good, selected as for a redrive. Needs ``"confirm": "purge"``
    unless ``dry_run``."""
    if not body.dry_run and body.confirm != "purge":
        raise ApiError(
            422,
            "confirmation_required",
            'a purge deletes dead jobs for good: add "confirm": "purge" to the request '
            '(or "dry_run": true to see what it would delete)',
            field="confirm",
        )
    return _move(body, server, "purge", admin.purge_batches)


def _move(
    body: models.DeadSelectionRequest, server: Server, verb: str, batches: Any
) -> models.SelectionResult:
    where = _dead_filter(
        body.ids,
        body.queue,
        body.task,
        body.since,
        body.until,
        body.error,
        body.fingerprint,
        body.tags,
    )
    if where.matches_all and not body.all:
        raise ConfigurationError(
            f"name the dead jobs to {verb}: ids, or filters (queue, task, since, until, error, "
            'fingerprint, tags), or "all": true for every dead job',
            field="ids",
        )
    with server.connection() as conn:
        selection = admin.select_dead(conn, where)
        if body.dry_run:
            return models.SelectionResult(
                dry_run=True, count=selection.count, ids=list(selection.ids)
            )
        moved = [
            job_id
            for batch in batches(conn, selection, batch_size=body.batch_size)
            for job_id in batch
        ]
    return models.SelectionResult(dry_run=False, count=len(moved), ids=moved)


# -- stats and workers ----------------------------------------------------------------------------


#: Headers of /stats read from a read DSN: what it leads to, and its replay lag in seconds.
REPLICA_HEADER = "X-Pgjobs-Read-From"
LAG_HEADER = "X-Pgjobs-Replica-Lag-Seconds"


@router.get(
    "/stats",
    response_model=None,
    responses={
        200: {
            "model": list[stats_models.QueueStats] | stats_models.StatsVerbose,
            "description": "The document of `pgjobs stats --json` (with verbose: --verbose)",
        }
    },
    summary="Queue statistics, as `pgjobs stats --json`",
)
def get_stats(
    server: Server,
    verbose: Annotated[
        bool, Query(description="Also workers, orphaned leases, tables and partitions.")
    ] = False,
) -> JSONResponse:
    """Per queue: ready, scheduled, running, dead, finished and failed in the last hour,
    throughput and retry rate over the last minute, the oldest ready job's age. Served with a
    read DSN (`pgjobs serve --read-dsn`), it is read there: the headers X-Pgjobs-Read-From and
    X-Pgjobs-Replica-Lag-Seconds, and with verbose the document's ``replica``, say how far
    behind it is."""
    with server.reading() as conn:
        snap = read_model.snapshot(
            conn,
            verbose=verbose,
            group_limits=server.group_limits,
            ordered_tasks=server.ordered_tasks,
        )
        replica = server.replica(conn)
    document = read_model.as_json(snap, verbose=verbose)
    headers = {}
    if replica is not None:
        # Read from a standby: the verbose document says how far behind it is, either form in
        # headers (the plain form is a list, which has no room for it).
        if isinstance(document, dict):
            document["replica"] = dataclasses.asdict(replica)
        headers[REPLICA_HEADER] = "standby" if replica.standby else "primary"
        if replica.lag_seconds is not None:
            headers[LAG_HEADER] = f"{replica.lag_seconds:.3f}"
    return JSONResponse(jsonable_encoder(document), headers=headers)


@router.get("/workers", response_model=stats_models.WorkerList, summary="Live workers")
def list_workers(server: Server) -> stats_models.WorkerList:
    """Workers that sent a heartbeat recently, with the jobs each one runs."""
    with server.reading() as conn:
        workers = [dataclasses.asdict(w) for w in db.live_workers(conn, STALE_AFTER)]
    return stats_models.WorkerList(workers=[stats_models.Worker.model_validate(w) for w in workers])
