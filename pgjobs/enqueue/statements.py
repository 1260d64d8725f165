"""The statements each ``Shape`` of job goes in by, as plans: a plan yields each ``Statement``
(or ``Copy``) it needs run, is sent back its rows, and returns the job ids in order. Sync and
async connections, pgjobs' and the caller's, run the same plans (``pgjobs.enqueue.door``).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

from pgjobs import copying, queries, tags, uniqueness
from pgjobs.enqueue.connections import Copy, Statement
from pgjobs.enqueue.rows import PreparedJob, Shape

#: Calls of at least this many jobs (none with a key, group or unique key) go in by COPY rather
#: than one INSERT from arrays, when the connection is a psycopg one. Measured on 2 cores: COPY is
#: 0.8-0.9x the INSERT below 64 rows (its extra round trips), 1.1x at 64, 1.5x at 100, 2.5x at
#: 1,000.
COPY_MIN_ROWS = 64

#: An insert as the statements it runs (see the module).
InsertPlan = Generator[tuple[str, dict[str, Any]] | Copy, list[tuple[Any, ...]], list[int]]


def ready_params(row: PreparedJob) -> dict[str, Any]:
    """``JOB_INSERT_READY``'s parameters for ``row`` (``Shape.READY``)."""
    return {
        "queue": row.queue,
        "task": row.task,
        "payload": row.payload,
        "priority": row.priority,
        "max_attempts": row.max_attempts,
    }


def one(row: PreparedJob) -> InsertPlan:
    """One job of ``Shape.READY`` or ``PLAIN``, outside a batch."""
    if row.shape is Shape.READY:
        ((job_id,),) = yield Statement(queries.JOB_INSERT_READY, ready_params(row))
    else:
        params = {
            "queue": row.queue,
            "task": row.task,
            "payload": row.payload,
            "priority": row.priority,
            "run_at": row.run_at,
            "run_in": row.run_in,
            "max_attempts": row.max_attempts,
            "expires_at": row.expires_at,
            "expires_in": row.expires_in,
            "payload_version": row.payload_version,
            "trace_context": row.trace_context,
            "tags": None if row.tags is None else list(row.tags),
        }
        ((job_id,),) = yield Statement(queries.JOB_INSERT, params)
    return [int(job_id)]


def arrays(rows: Sequence[PreparedJob], batch_id: int | None = None) -> dict[str, Any]:
    """The parallel arrays of ``JOB_INSERT_MANY`` and ``JOB_INSERT_SHOWN`` for ``rows`` (none
    with a key, group or unique key); payload versions, trace contexts and tags as one NULL when
    no row has one."""
    params: dict[str, Any] = {
        "queues": [row.queue for row in rows],
        "tasks": [row.task for row in rows],
        "payloads": [row.payload for row in rows],
        "priorities": [row.priority for row in rows],
        "run_ats": [row.run_at for row in rows],
        "run_ins": [row.run_in for row in rows],
        "max_attempts": [row.max_attempts for row in rows],
        "expires_ats": [row.expires_at for row in rows],
        "expires_ins": [row.expires_in for row in rows],
        "payload_versions": None,
        "trace_contexts": None,
        "tags": None,
        "batch_id": batch_id,
    }
    if any(row.shape is not Shape.READY for row in rows):
        if any(row.payload_version is not None for row in rows):
            params["payload_versions"] = [row.payload_version for row in rows]
        if any(row.trace_context is not None for row in rows):
            params["trace_contexts"] = [row.trace_context for row in rows]
        if tags.tagged(rows):
            params["tags"] = tags.column(rows)
    return params


def many(rows: Sequence[PreparedJob], batch_id: int | None = None) -> InsertPlan:
    """Jobs of ``Shape.READY`` or ``PLAIN`` in one ``JOB_INSERT_MANY`` (``JOB_INSERT_MANY_READY``
    when every one is ``READY``, outside a batch: it names only their task's columns)."""
    if batch_id is None and all(row.shape is Shape.READY for row in rows):
        params = {
            "queues": [row.queue for row in rows],
            "tasks": [row.task for row in rows],
            "payloads": [row.payload for row in rows],
            "priorities": [row.priority for row in rows],
            "max_attempts": [row.max_attempts for row in rows],
        }
        found = yield Statement(queries.JOB_INSERT_MANY_READY, params)
    else:
        found = yield Statement(queries.JOB_INSERT_MANY, arrays(rows, batch_id))
    return [int(job_id) for _, job_id in found]


def shown(rows: Sequence[PreparedJob]) -> Statement:
    """``JOB_INSERT_SHOWN`` for ``rows`` (each ``Shape.READY`` or ``PLAIN``)."""
    return Statement(queries.JOB_INSERT_SHOWN, arrays(rows))


def copy(rows: Sequence[PreparedJob], batch_id: int | None = None) -> InsertPlan:
    """Jobs of ``Shape.READY`` or ``PLAIN`` by COPY, with ids reserved first (which wakes each of
    their queues' idle workers once: COPY cannot NOTIFY). Runs atomically (``door``)."""
    queues = sorted({row.queue for row in rows})
    reserve = Statement(queries.JOB_RESERVE_IDS, {"count": len(rows), "queues": queues})
    ((now, ids, _),) = yield reserve
    ready = batch_id is None and all(row.shape is Shape.READY for row in rows)
    yield Copy(*copying.copy_rows(rows, now, ids, batch_id, ready=ready))
    return list(ids)


def keyed(
    rows: Sequence[PreparedJob], batch_id: int | None = None, fresh: set[int] | None = None
) -> InsertPlan:
    """Jobs of which some have a key, a group or a unique key, by ``JOB_INSERT_KEYED``
    (``uniqueness.insert_plan``); ``fresh`` collects the ids it created."""
    return (yield from uniqueness.insert_plan(rows, batch_id, fresh))


def isolation() -> Statement:
    """The read of the caller's transaction isolation, before keys are looked for in it."""
    return Statement(queries.JOB_INSERT_ISOLATION, {})


def needs_isolation(rows: Sequence[PreparedJob]) -> bool:
    """Whether inserting ``rows`` in the caller's transaction needs it READ COMMITTED."""
    return any(row.idempotency_key or row.unique_key for row in rows)
