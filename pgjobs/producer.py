"""Enqueue: validate job submissions, then insert them in one statement on a connection.

The connection may be pgjobs' own (autocommit) or one the caller owns, a psycopg connection or a
SQLAlchemy ``Connection``; on the caller's, the jobs commit or roll back with the caller's
transaction. Nothing is written unless every job of a call is valid.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import psycopg

from pgjobs import copying, queries, tags, tracing, uniqueness
from pgjobs.db import libpq, translate_errors
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError, InvalidPayload, PgjobsError, UnknownTask
from pgjobs.submission import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE,
    JobSpec,
    Ref,
    after_names,
    check_after,
    check_key,
    check_max_attempts,
    check_moment,
    check_name,
    check_priority,
    check_seconds,
)
from pgjobs.tags import Tags
from pgjobs.tasks import Task

#: Bytes of serialised JSON one payload may take; larger payloads are refused at enqueue.
#: Keep big blobs elsewhere (object storage) and enqueue a reference to them.
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024

# Payloads as compact JSON; NaN and infinities are refused (JSON has no such numbers). One encoder
# for every call: json.dumps with options builds a new one each time (a third of its cost).
#: The options of a ``JobSpec`` that gives only a task and a payload.
_PLAIN_OPTIONS = JobSpec("")[2:]
#: Builds a named tuple from a tuple of its fields, unchecked (``_make`` checks the length).
_new_row = tuple.__new__
_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)

#: Batches of at least this many jobs (none with an idempotency key) go in by COPY rather than one
#: INSERT from arrays, when the connection is a psycopg one. Measured on 2 cores: COPY is 0.8-0.9x
#: the INSERT below 64 rows (its extra round trips), 1.1x at 64, 1.5x at 100, 2.5x at 1,000.
COPY_MIN_ROWS = 64

_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

#: Levels of nested objects and arrays a payload may have. Python's json module recurses once per
#: level (about 1,000 levels raise RecursionError, when encoding and when a worker decodes), and a
#: handler's arguments nested deeper than this are a mistake or an attack.
MAX_PAYLOAD_DEPTH = 100

# A surrogate escape as the encoder writes it (lowercase hex), when an even number of backslashes
# precedes it: a high one not followed by a low one, or a low one not preceded by a high one.
# jsonb refuses such lone surrogates; a pair is a character outside the BMP and fine.
_LONE_SURROGATE_ESCAPE = re.compile(
    r"(?<!\\)(?:\\\\)*(?:\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f])|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2})"
)

# Parameter names of JOB_INSERT_MANY, in the order of PreparedJob's fields.
_MANY_KEYS = uniqueness.MANY_PARAMS


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
    #: Seconds from the insert's now(), the database's clock (never the producer's): the
    #: statement computes expires_at from it.
    expires_in: float | None
    idempotency_key: str | None
    #: The task's payload version when it declares one above 1 (None is version 1).
    payload_version: int | None = None
    #: The enqueuing span's W3C trace context as JSON text, when tracing (``pgjobs.tracing``).
    trace_context: str | None = None
    # A job with a group or a unique key (pgjobs.uniqueness.Keys; all None for a plain job): the
    # fields after trace_context are in the order of uniqueness.KEYED_PARAMS.
    group_key: str | None = None
    unique_key: str | None = None
    on_conflict: str | None = None
    debounce: float | None = None
    throttle: float | None = None
    #: Its tags (``pgjobs.tags``), None for none: only then do the tagged statements apply.
    tags: Tags | None = None
    #: The jobs it waits for (``submission.check_after``); a job with some is inserted by
    #: ``pgjobs.dependencies``, never by the statements here.
    after: tuple[int | Ref, ...] | None = None
    after_names: tuple[tuple[str, int | Ref], ...] | None = None  # submission.after_names


# PreparedJob's fields of a job with a group or a unique key, which the plain inserts leave out.
_KEYED_FIELDS = PreparedJob._fields[len(_MANY_KEYS) :]


def handler_arguments(task: Task, payload: Any) -> dict[str, Any]:
    """The keyword arguments ``task``'s handler is called with for ``payload`` (a decoded JSON
    object, as a worker reads it back): its keys bound to the handler's parameters (a key it
    does not take is refused), their types checked, or the model built. Raises
    ``InvalidPayload`` naming the field at fault when the handler could not be called with it.
    Enqueue itself checks less (the values' types): ``eager`` and the CLI's enqueue check this.

    Example: ``handler_arguments(app.tasks["emails.welcome"], {"user_id": 42})``
    """
    problem = task.payload_problem(payload)
    if problem is not None:
        raise InvalidPayload(problem.message, field=problem.field)
    arguments, why = task.arguments(payload)
    if why is not None:
        raise InvalidPayload(why, field="payload")
    return arguments


def prepare(spec: JobSpec, tasks: Mapping[str, Task] | None) -> PreparedJob:
    """Validate ``spec`` and resolve its defaults; raises a ``PgjobsError`` naming the problem.

    ``tasks`` is the app's registry; when it is given and not empty, unknown task names are refused.
    """
    name = check_name("task", spec.task)  # in NFC, as tasks are registered
    task = tasks.get(name) if tasks else None
    if tasks and task is None:
        raise UnknownTask(
            f"unknown task {name!r}: the app registers {', '.join(sorted(tasks))}",
            field="task",
        )
    text = _payload_text(spec.payload, task)
    # Options left unset take the task's values, which were checked when it was registered.
    if spec.queue is None:
        queue = task.queue if task else DEFAULT_QUEUE
    else:
        queue = check_name("queue", spec.queue)
    priority = check_priority(spec.priority)
    if spec.run_at is not None and spec.run_in is not None:
        raise ConfigurationError("give run_at or run_in, not both", field="run_in")
    run_at = None if spec.run_at is None else check_moment("run_at", spec.run_at)
    run_in = 0.0 if spec.run_in is None else check_seconds("run_in", spec.run_in)
    if spec.max_attempts is None:
        max_attempts = task.max_attempts if task else DEFAULT_MAX_ATTEMPTS
    else:
        max_attempts = spec.max_attempts
        check_max_attempts(max_attempts)
    if spec.expires_at is not None and spec.expires_in is not None:
        raise ConfigurationError("give expires_at or expires_in, not both", field="expires_in")
    expires_at = None if spec.expires_at is None else check_moment("expires_at", spec.expires_at)
    expires_in = None if spec.expires_in is None else check_seconds("expires_in", spec.expires_in)
    key = None if spec.idempotency_key is None else check_key(spec.idempotency_key)
    version = task.version if task is not None and task.version != 1 else None
    keys = uniqueness.check(spec, task)
    trace = tracing.publish(name, queue) if tracing.enabled() else None
    after = None if spec.after is None else check_after(spec.after)
    return PreparedJob(
        queue,
        name,
        text,
        priority,
        run_at,
        run_in,
        max_attempts,
        expires_at,
        expires_in,
        key,
        version,
        trace,
        *keys,
        tags.check(spec.tags),
        after,
        None if spec.after is None else after_names(spec.after),
    )


def _payload_text(given: Any, task: Task | None) -> str:
    """The payload as the JSON text to store, checked: a JSON object (an instance of a typed
    handler's model stands for its fields) that fits a typed handler, within the limits."""
    payload = {} if given is None else given
    if task is not None and task.model is not None and isinstance(payload, task.model.cls):
        payload = task.model.dump(payload)  # an instance of the handler's model: its fields
    if not isinstance(payload, dict):
        raise InvalidPayload(
            f"payload must be a JSON object (a dict), got {type(payload).__name__}", field="payload"
        )
    if task is not None and (task.types is not None or task.model is not None):
        # A typed handler's values are checked before they are stored; which keys it takes is
        # checked by the worker (an untyped handler's too), as it always was.
        problem = task.payload_problem(payload, complete=False)
        if problem is not None:
            raise InvalidPayload(problem.message, field=problem.field)
    text = _encode(payload)
    if len(text) > MAX_PAYLOAD_BYTES and len(text.encode()) > MAX_PAYLOAD_BYTES:
        raise InvalidPayload(
            f"payload is {len(text.encode()):,} bytes; the limit is {MAX_PAYLOAD_BYTES:,} "
            "(store large data elsewhere and enqueue a reference)",
            field="payload",
        )
    # The encoder escapes NUL as \u0000 (ASCII output), which jsonb refuses; an escape is real
    # when an even number of backslashes precedes it. The substring test spares most payloads
    # the regular expression.
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise InvalidPayload(
            "payload contains a NUL character (\\u0000), which PostgreSQL refuses", field="payload"
        )
    if "\\ud" in text and _LONE_SURROGATE_ESCAPE.search(text):
        raise InvalidPayload(
            "payload contains a lone surrogate (text that is not valid UTF-8), which PostgreSQL "
            "refuses",
            field="payload",
        )
    return text


def _encode(payload: dict[str, Any]) -> str:
    """``payload`` as compact JSON, or ``InvalidPayload`` naming why it cannot be."""
    try:
        text = _JSON.encode(payload)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"payload is not JSON-serialisable: {exc}", field="payload") from None
    except RecursionError:
        text = None  # nested far too deep: _depth says how deep, without recursing
    # Only text with enough brackets can nest too deep; counting them is cheap, walking is not.
    brackets = MAX_PAYLOAD_DEPTH + 1 if text is None else text.count("[") + text.count("{")
    if brackets > MAX_PAYLOAD_DEPTH and _depth(payload) > MAX_PAYLOAD_DEPTH:
        raise InvalidPayload(
            f"payload nests objects and arrays more than {MAX_PAYLOAD_DEPTH} levels deep; "
            f"the limit is {MAX_PAYLOAD_DEPTH}",
            field="payload",
        )
    if text is None:  # the recursion limit was reached for another reason than depth
        raise InvalidPayload("payload is too deeply nested to serialise as JSON", field="payload")
    return text


def _depth(value: object) -> int:
    """Levels of dicts and lists in ``value`` (iteratively, so any depth can be measured); stops
    counting a little past ``MAX_PAYLOAD_DEPTH``, and at a cycle."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    seen: set[int] = set()
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if id(item) in seen:
            continue
        seen.add(id(item))
        deepest = max(deepest, level)
        if level > MAX_PAYLOAD_DEPTH:
            break
        stack.extend((child, level + 1) for child in children)
    return deepest


class Statement(NamedTuple):
    """One statement an insert needs run, and its parameters."""

    sql: str
    params: dict[str, Any]


#: An insert as the statements it runs: it yields each ``Statement``, is sent back its rows, and
#: returns the job ids. Sync and async connections run the same plan; only the I/O differs.
InsertPlan = Generator[tuple[str, dict[str, Any]], list[tuple[Any, ...]], list[int]]


def insert(
    conn: Any, rows: Sequence[PreparedJob], dsn: Dsn | None = None, *, pooled: bool = False
) -> list[int]:
    """Insert validated rows on ``conn`` (psycopg or SQLAlchemy) in one statement, or by COPY
    for a large batch without idempotency keys on a psycopg connection. ``pooled``: ``conn`` is
    one of the app's own pooled connections, where one job ready now goes in by
    ``libpq.insert_ready`` (half the client CPU of psycopg's cursor).

    Returns the job ids in the order of ``rows`` (for a key already taken, the existing job's).
    """
    if not rows:
        return []
    if pooled and len(rows) == 1 and _ready_now(rows[0]):
        return [libpq.insert_ready(conn, _ready_params(rows[0]), dsn=dsn)]
    with translate_errors(dsn):
        if isinstance(conn, psycopg.Connection) and _by_copy(rows):
            return _copy_many(conn, rows)
        plan = _plan(rows, in_callers_transaction=_in_callers_transaction(conn))
        try:
            statement = next(plan)
            while True:
                statement = plan.send(_execute(conn, statement))
        except StopIteration as done:
            ids: list[int] = done.value
            return ids


async def insert_async(conn: Any, rows: Sequence[PreparedJob], dsn: Dsn | None = None) -> list[int]:
    """``insert`` on an async connection: a psycopg ``AsyncConnection`` or a SQLAlchemy
    ``AsyncConnection``; the same statements, sent without blocking the event loop."""
    if not rows:
        return []
    with translate_errors(dsn):
        if isinstance(conn, psycopg.AsyncConnection) and _by_copy(rows):
            return await _copy_many_async(conn, rows)
        plan = _plan(rows, in_callers_transaction=_in_callers_transaction(conn))
        try:
            statement = next(plan)
            while True:
                statement = plan.send(await _execute_async(conn, statement))
        except StopIteration as done:
            ids: list[int] = done.value
            return ids


def _plan(
    rows: Sequence[PreparedJob], *, in_callers_transaction: bool, batch_id: int | None = None
) -> InsertPlan:
    """The statements that insert ``rows`` (at least one), whatever the connection; the members
    of batch ``batch_id`` (``pgjobs.batches``) by the many or keyed statements with its id."""
    keyed = _keyed(rows)
    plain = len(rows) == 1 and rows[0].idempotency_key is None and rows[0].tags is None
    if batch_id is None and plain and not keyed:
        ((job_id,),) = yield _insert_one(rows[0])
        return [int(job_id)]
    if in_callers_transaction and any(row.idempotency_key or row.unique_key for row in rows):
        ((level,),) = yield Statement(queries.JOB_INSERT_ISOLATION, {})
        uniqueness.check_isolation(level, rows)
    if keyed:
        return (yield from uniqueness.insert_plan(rows, batch_id))
    return (yield from _insert_many(rows, batch_id))


def _keyed(rows: Sequence[PreparedJob]) -> bool:
    """Whether one of ``rows`` has a group or a unique key (``uniqueness.insert_plan``)."""
    return any(row.group_key is not None or row.unique_key is not None for row in rows)


def _by_copy(rows: Sequence[PreparedJob]) -> bool:
    """Whether ``rows`` go in by COPY (on a psycopg connection): a large batch without keys or
    groups (those take JOB_INSERT_KEYED)."""
    return len(rows) >= COPY_MIN_ROWS and all(
        row.idempotency_key is None and row.group_key is None and row.unique_key is None
        for row in rows
    )


def _in_callers_transaction(conn: Any) -> bool:
    """Whether statements on ``conn`` run in a transaction the caller holds open (every
    SQLAlchemy connection; a psycopg one unless it is in autocommit mode, as pgjobs' own are)."""
    return not (isinstance(conn, psycopg.Connection | psycopg.AsyncConnection) and conn.autocommit)


def _insert_one(row: PreparedJob) -> Statement:
    """The insert of ``row`` (without an idempotency key); the usual job, ready now and never
    expiring, binds only the columns it sets."""
    if _ready_now(row):
        return Statement(queries.JOB_INSERT_READY, _ready_params(row))
    if carries_versions((row,)):
        versioned = row._asdict()
        for name in _KEYED_FIELDS:
            del versioned[name]
        return Statement(queries.JOB_INSERT_VERSIONED, versioned)
    params = row._asdict()
    del params["payload_version"], params["trace_context"]
    for name in _KEYED_FIELDS:
        del params[name]
    return Statement(queries.JOB_INSERT, params)


def carries_versions(rows: Sequence[PreparedJob]) -> bool:
    """Whether one of ``rows`` has a payload version or a trace context to store (the
    statements that leave those columns out work on a schema older than migration 0007)."""
    return any(row.payload_version is not None or row.trace_context is not None for row in rows)


def many_arrays(
    rows: Sequence[PreparedJob], versioned: bool, *, keys: bool = True
) -> dict[str, list[Any]]:
    """The parallel arrays ``JOB_INSERT_MANY`` binds for ``rows``, with their payload versions
    and trace contexts when ``versioned``; without ``keys``, those of ``JOB_INSERT_PLAIN`` and
    ``JOB_INSERT_SHOWN`` (jobs without idempotency keys)."""
    names = _MANY_KEYS if versioned else _MANY_KEYS[:-2]
    return {
        name: [row[n] for row in rows] for n, name in enumerate(names) if keys or name != "keys"
    }


def _ready_params(row: PreparedJob) -> dict[str, Any]:
    """``JOB_INSERT_READY``'s parameters for ``row`` (``_ready_now``)."""
    return {
        "queue": row.queue,
        "task": row.task,
        "payload": row.payload,
        "priority": row.priority,
        "max_attempts": row.max_attempts,
    }


def _ready_now(row: PreparedJob) -> bool:
    """Whether ``row`` runs as soon as it commits, never expires, and has neither a payload
    version, a trace context, an idempotency key, a group nor a unique key: every column but the
    usual ones can take its default."""
    return (
        row.idempotency_key is None
        and row.group_key is None
        and row.unique_key is None
        and row.run_at is None
        and not row.run_in
        and row.expires_at is None
        and row.expires_in is None
        and row.payload_version is None
        and row.trace_context is None
        and row.tags is None
    )


def _copy_many(
    conn: psycopg.Connection[Any], rows: Sequence[PreparedJob], batch_id: int | None = None
) -> list[int]:
    """Insert ``rows`` (none with an idempotency key) by COPY, all or nothing."""
    reserve = _reserve_ids(rows)
    # On pgjobs' autocommit connection the block is one transaction: the id reservation inside it
    # shares its single commit. On the caller's connection the block is a savepoint, and the
    # reservation runs first so that it opens the caller's transaction if none is open yet: a block
    # entered outside any transaction would commit the jobs itself, not with the caller's work.
    own = conn.autocommit
    with contextlib.ExitStack() as stack:
        if own:
            stack.enter_context(conn.transaction())
        ((now, ids, _),) = conn.execute(reserve.sql, reserve.params, prepare=True).fetchall()
        if not own:
            stack.enter_context(conn.transaction())
        statement, lines = _copy_rows(rows, now, ids, batch_id)
        with conn.cursor() as cursor, cursor.copy(statement) as copy:
            for line in lines:
                copy.write_row(line)
    return list(ids)


async def _copy_many_async(
    conn: psycopg.AsyncConnection[Any], rows: Sequence[PreparedJob], batch_id: int | None = None
) -> list[int]:
    """``_copy_many`` on an async psycopg connection."""
    reserve = _reserve_ids(rows)
    own = conn.autocommit
    async with contextlib.AsyncExitStack() as stack:
        if own:
            await stack.enter_async_context(conn.transaction())
        cursor = await conn.execute(reserve.sql, reserve.params, prepare=True)
        ((now, ids, _),) = await cursor.fetchall()
        if not own:
            await stack.enter_async_context(conn.transaction())
        statement, lines = _copy_rows(rows, now, ids, batch_id)
        async with conn.cursor() as copier, copier.copy(statement) as copy:
            for line in lines:
                await copy.write_row(line)
    return list(ids)


def _reserve_ids(rows: Sequence[PreparedJob]) -> Statement:
    """Reserve ids for ``rows`` and wake each of their queues' idle workers once."""
    queues = sorted({row.queue for row in rows})
    return Statement(queries.JOB_RESERVE_IDS, {"count": len(rows), "queues": queues})


def _copy_rows(
    rows: Sequence[PreparedJob], now: datetime, ids: list[int], batch_id: int | None = None
) -> tuple[str, Iterator[tuple[Any, ...]]]:
    """The COPY statement for ``rows`` and the rows it writes (``pgjobs.copying``)."""
    ready = batch_id is None and all(map(_ready_now, rows))
    return copying.copy_rows(
        rows, now, ids, batch_id, ready=ready, versioned=carries_versions(rows)
    )


def _insert_many(rows: Sequence[PreparedJob], batch_id: int | None = None) -> InsertPlan:
    results: list[int | None] = [None] * len(rows)
    pending = list(range(len(rows)))
    tagged = tags.tagged(rows)
    with_versions = tagged or batch_id is not None or carries_versions(rows)
    keyed = True
    member = {} if batch_id is None else {"batch_id": batch_id}
    if tagged:
        statement = (
            queries.JOB_INSERT_MANY_TAGGED
            if batch_id is None
            else queries.BATCH_INSERT_MEMBERS_TAGGED
        )
    elif batch_id is not None:
        statement = queries.BATCH_INSERT_MEMBERS
    elif all(row.idempotency_key is None for row in rows):
        # No key to look for: the lean statement (the same jobs, ids and NOTIFYs).
        keyed = False
        statement = (
            queries.JOB_INSERT_PLAIN_VERSIONED if with_versions else queries.JOB_INSERT_PLAIN
        )
    else:
        statement = queries.JOB_INSERT_MANY_VERSIONED if with_versions else queries.JOB_INSERT_MANY
    # A NULL id means a concurrent enqueue took the key while this statement ran; its commit is
    # visible to the next statement, so one more round resolves it.
    for _ in range(3):
        batch = [rows[i] for i in pending]
        params: dict[str, Any] = many_arrays(batch, with_versions, keys=keyed) | member
        if tagged:
            params["tags"] = tags.column(batch)
        still = uniqueness.resolved(pending, (yield Statement(statement, params)), results)
        if not still:
            return [r for r in results if r is not None]
        pending = still
    raise PgjobsError(
        "could not resolve idempotency keys held by concurrent, uncommitted enqueues; retry"
    )


def _execute(conn: Any, statement: tuple[str, dict[str, Any]]) -> list[tuple[Any, ...]]:
    sql, params = statement
    if isinstance(conn, psycopg.Connection):
        return conn.execute(sql, params, prepare=True).fetchall()
    exec_driver_sql = getattr(conn, "exec_driver_sql", None)
    if exec_driver_sql is None or _is_async(conn):
        raise ConfigurationError(
            "connection must be a psycopg.Connection or a SQLAlchemy Connection "
            f"(use enqueue_async for an async one), got {type(conn).__name__}",
            field="connection",
        )
    return [tuple(row) for row in exec_driver_sql(sql, params).fetchall()]


async def _execute_async(conn: Any, statement: tuple[str, dict[str, Any]]) -> list[tuple[Any, ...]]:
    sql, params = statement
    if isinstance(conn, psycopg.AsyncConnection):
        cursor = await conn.execute(sql, params, prepare=True)
        return await cursor.fetchall()
    if not _is_async(conn):
        raise ConfigurationError(
            "connection must be a psycopg.AsyncConnection or a SQLAlchemy AsyncConnection "
            f"(use enqueue for a sync one), got {type(conn).__name__}",
            field="connection",
        )
    result = await conn.exec_driver_sql(sql, params)
    return [tuple(row) for row in result.fetchall()]


def _is_async(conn: Any) -> bool:
    """Whether ``conn`` is a SQLAlchemy ``AsyncConnection`` (SQLAlchemy is imported only by
    applications that use it: when it is not loaded, ``conn`` is not one)."""
    module = sys.modules.get("sqlalchemy.ext.asyncio")
    return module is not None and isinstance(conn, module.AsyncConnection)


def prepare_many(specs: Iterable[JobSpec], tasks: Mapping[str, Task] | None) -> list[PreparedJob]:
    """``prepare`` every spec; the first invalid one raises, naming its position (in the message,
    and in ``field`` as ``jobs[position].field``). Anything but a ``JobSpec`` is invalid."""
    if isinstance(specs, str | bytes | Mapping | JobSpec) or not isinstance(specs, Iterable):
        raise ConfigurationError(
            f"jobs must be an iterable of JobSpec, got {type(specs).__name__}", field="jobs"
        )
    rows = []
    # A spec with nothing but a task and a payload (most of a bulk enqueue) takes its task's
    # defaults, resolved once per task name in this call: then only its payload is checked.
    plain: dict[str, tuple[PreparedJob, Task | None]] = {}
    traced = tracing.enabled()
    for position, spec in enumerate(specs):
        try:
            if not isinstance(spec, JobSpec):
                raise ConfigurationError(
                    f"expected a JobSpec, got {type(spec).__name__}; "
                    "build each job as JobSpec(task, payload, ...)"
                )
            if traced or spec[2:] != _PLAIN_OPTIONS:
                rows.append(prepare(spec, tasks))
                continue
            known = plain.get(spec.task)
            if known is None:
                row = prepare(spec, tasks)
                plain[spec.task] = (row, tasks.get(row.task) if tasks else None)
                rows.append(row)
                continue
            row, task = known
            text = _payload_text(spec.payload, task)
            rows.append(_new_row(PreparedJob, (row[0], row[1], text, *row[3:])))
        except PgjobsError as exc:
            where = f"jobs[{position}]" + (f".{exc.field}" if exc.field else "")
            raise type(exc)(f"job #{position}: {exc}", field=where) from None
    return rows
