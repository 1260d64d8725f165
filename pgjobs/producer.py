"""Enqueue: validate job submissions, then insert them in one statement on a connection.

The connection may be pgjobs' own (autocommit) or one the caller owns, a psycopg connection or a
SQLAlchemy ``Connection``; on the caller's, the jobs commit or roll back with the caller's
transaction. Nothing is written unless every job of a call is valid.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import psycopg

from pgjobs import queries
from pgjobs.db import Dsn, translate_errors
from pgjobs.errors import ConfigurationError, InvalidPayload, PgjobsError, UnknownTask
from pgjobs.models import EnqueuedJob
from pgjobs.tasks import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE,
    PRIORITY_RANGE,
    JobSpec,
    Task,
    check_max_attempts,
    check_queue,
)

#: Bytes of serialised JSON one payload may take; larger payloads are refused at enqueue.
#: Keep big blobs elsewhere (object storage) and enqueue a reference to them.
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024

#: Batches of at least this many jobs (none with an idempotency key) go in by COPY rather than one
#: INSERT from arrays, when the connection is a psycopg one: COPY measured faster from about 64
#: rows up (``python -m benchmarks --only enqueue``); below, its extra round trips cost more.
COPY_MIN_ROWS = 64

# Parameter names of JOB_INSERT_MANY, in the order of PreparedJob's fields.
_MANY_KEYS = (
    "queues",
    "tasks",
    "payloads",
    "priorities",
    "run_ats",
    "run_ins",
    "max_attempts",
    "expires_ats",
    "keys",
)


class PreparedJob(NamedTuple):
    """A validated job, ready to bind; fields in the order of ``_MANY_KEYS``."""

    queue: str
    task: str
    payload: str
    priority: int
    run_at: datetime | None
    run_in: float
    max_attempts: int
    expires_at: datetime | None
    idempotency_key: str | None


def prepare(spec: JobSpec, tasks: Mapping[str, Task] | None) -> PreparedJob:
    """Validate ``spec`` and resolve its defaults; raises a ``PgjobsError`` naming the problem.

    ``tasks`` is the app's registry; when it is given and not empty, unknown task names are refused.
    """
    if not isinstance(spec.task, str) or not spec.task:
        raise ConfigurationError("a task name must be a non-empty string")
    task = tasks.get(spec.task) if tasks else None
    if tasks and task is None:
        raise UnknownTask(
            f"unknown task {spec.task!r}: the app registers {', '.join(sorted(tasks))}"
        )
    payload = {} if spec.payload is None else spec.payload
    if not isinstance(payload, dict):
        raise InvalidPayload(
            f"payload must be a JSON object (a dict), got {type(payload).__name__}"
        )
    try:
        text = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"payload is not JSON-serialisable: {exc}") from None
    if len(text) > MAX_PAYLOAD_BYTES and len(text.encode()) > MAX_PAYLOAD_BYTES:
        raise InvalidPayload(
            f"payload is {len(text.encode()):,} bytes; the limit is {MAX_PAYLOAD_BYTES:,} "
            "(store large data elsewhere and enqueue a reference)"
        )
    if "\x00" in text:
        raise InvalidPayload("payload contains a NUL character (\\u0000), which PostgreSQL refuses")
    queue = spec.queue if spec.queue is not None else (task.queue if task else DEFAULT_QUEUE)
    check_queue(queue)
    priority = spec.priority
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ConfigurationError(f"priority must be a whole number, got {priority!r}")
    if not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
        raise ConfigurationError(
            f"priority {priority} is out of range {PRIORITY_RANGE[0]}..{PRIORITY_RANGE[1]}"
        )
    if spec.run_at is not None and spec.run_in is not None:
        raise ConfigurationError("give run_at or run_in, not both")
    run_at = _aware("run_at", spec.run_at)
    run_in = _seconds("run_in", spec.run_in)
    max_attempts = spec.max_attempts
    if max_attempts is None:
        max_attempts = task.max_attempts if task else DEFAULT_MAX_ATTEMPTS
    check_max_attempts(max_attempts)
    if spec.expires_at is not None and spec.expires_in is not None:
        raise ConfigurationError("give expires_at or expires_in, not both")
    expires_at = _aware("expires_at", spec.expires_at)
    if spec.expires_in is not None:
        expires_at = datetime.now().astimezone() + timedelta(
            seconds=_seconds("expires_in", spec.expires_in)
        )
    key = spec.idempotency_key
    if key is not None and (not isinstance(key, str) or not key):
        raise ConfigurationError("idempotency_key must be a non-empty string")
    return PreparedJob(
        queue, spec.task, text, priority, run_at, run_in, max_attempts, expires_at, key
    )


def _aware(name: str, value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ConfigurationError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ConfigurationError(
            f"{name} must be timezone-aware (e.g. datetime.now(timezone.utc)), got {value}"
        )
    return value


def _seconds(name: str, value: float | timedelta | None) -> float:
    if value is None:
        return 0.0
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ConfigurationError(f"{name} must be a number of seconds, got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigurationError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(seconds)


def insert(conn: Any, rows: Sequence[PreparedJob], dsn: Dsn | None = None) -> list[EnqueuedJob]:
    """Insert validated rows on ``conn`` (psycopg or SQLAlchemy) in one statement, or by COPY
    for a large batch without idempotency keys on a psycopg connection.

    Returns one ``EnqueuedJob`` per row, in order.
    """
    if not rows:
        return []
    with translate_errors(dsn):
        if len(rows) == 1 and rows[0].idempotency_key is None:
            params = rows[0]._asdict()
            (job_id, _), *_ = _execute(conn, queries.JOB_INSERT, params)
            return [EnqueuedJob(int(job_id), True)]
        if (
            len(rows) >= COPY_MIN_ROWS
            and isinstance(conn, psycopg.Connection)
            and all(row.idempotency_key is None for row in rows)
        ):
            return _copy_many(conn, rows)
        return _insert_many(conn, rows)


def _copy_many(conn: psycopg.Connection[Any], rows: Sequence[PreparedJob]) -> list[EnqueuedJob]:
    """Insert ``rows`` (none with an idempotency key) by COPY, all or nothing."""
    # Run first, this also opens the caller's transaction when their connection has none yet, so
    # that the block below nests as a savepoint and the jobs commit or roll back with the caller's
    # work. On pgjobs' autocommit connection the block is a transaction of its own.
    reserved = conn.execute(queries.JOB_RESERVE_IDS, {"count": len(rows)}, prepare=True)
    now, ids = reserved.fetchall()[0]
    with conn.transaction(), conn.cursor() as cursor:
        with cursor.copy(queries.JOB_COPY_MANY) as copy:
            for job_id, row in zip(ids, rows, strict=True):
                run_at = row.run_at
                if run_at is None:
                    run_at = now + timedelta(seconds=row.run_in) if row.run_in else now
                copy.write_row(
                    (
                        job_id,
                        row.queue,
                        row.task,
                        row.payload,
                        row.priority,
                        run_at,
                        row.max_attempts,
                        row.expires_at,
                        now,
                    )
                )
        queues = list(dict.fromkeys(row.queue for row in rows))
        cursor.execute(queries.QUEUES_NOTIFY, {"queues": queues}, prepare=True)
    return [EnqueuedJob(int(job_id), True) for job_id in ids]


def _insert_many(conn: Any, rows: Sequence[PreparedJob]) -> list[EnqueuedJob]:
    results: list[EnqueuedJob | None] = [None] * len(rows)
    pending = list(range(len(rows)))
    # A NULL id means a concurrent enqueue took the key while this statement ran; its commit is
    # visible to the next statement, so one more round resolves it.
    for _ in range(3):
        batch = [rows[i] for i in pending]
        params = {key: [row[n] for row in batch] for n, key in enumerate(_MANY_KEYS)}
        still: list[int] = []
        for position, job_id, created in _execute(conn, queries.JOB_INSERT_MANY, params):
            index = pending[position - 1]
            if job_id is None:
                still.append(index)
            else:
                results[index] = EnqueuedJob(int(job_id), bool(created))
        if not still:
            return [r for r in results if r is not None]
        pending = still
    raise PgjobsError(
        "could not resolve idempotency keys held by concurrent, uncommitted enqueues; retry"
    )


def _execute(conn: Any, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    if isinstance(conn, psycopg.Connection):
        return conn.execute(sql, params, prepare=True).fetchall()
    exec_driver_sql = getattr(conn, "exec_driver_sql", None)
    if exec_driver_sql is None:
        raise ConfigurationError(
            "connection must be a psycopg.Connection or a SQLAlchemy Connection, "
            f"got {type(conn).__name__}"
        )
    return [tuple(row) for row in exec_driver_sql(sql, params).fetchall()]


def prepare_many(specs: Iterable[JobSpec], tasks: Mapping[str, Task] | None) -> list[PreparedJob]:
    """``prepare`` every spec; the first invalid one raises, naming its position."""
    rows = []
    for position, spec in enumerate(specs):
        try:
            rows.append(prepare(spec, tasks))
        except PgjobsError as exc:
            raise type(exc)(f"job #{position}: {exc}") from None
    return rows
