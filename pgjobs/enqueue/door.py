"""The one dispatch of prepared jobs to the statements that fit their ``Shape`` (``plan``), and
the runners that send a plan on a connection, sync or async, pgjobs' own or the caller's.

Nothing is written unless every job of a call is valid; on the caller's connection the jobs
commit or roll back with the caller's transaction. A plan that must be atomic (COPY after its
reservation, jobs with dependencies, a batch) runs in one transaction on pgjobs' autocommit
connection, and in a savepoint after its first statement on the caller's (the first opens the
caller's transaction if none is open, so the jobs commit with the caller's work).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, TypeVar

from pgjobs import queries, uniqueness
from pgjobs.db import libpq, translate_errors
from pgjobs.db.dsn import Dsn
from pgjobs.enqueue import statements, waiting
from pgjobs.enqueue.connections import (
    Copy,
    Statement,
    atomic,
    atomic_async,
    copies,
    execute,
    execute_async,
    own,
)
from pgjobs.enqueue.rows import PreparedJob, Shape
from pgjobs.enqueue.statements import InsertPlan

T = TypeVar("T")

#: A plan of any result: the statements it yields, the rows it is sent back, what it returns.
Plan = Generator[tuple[str, dict[str, Any]] | Copy, list[tuple[Any, ...]], T]


def plan(
    rows: Sequence[PreparedJob],
    *,
    in_callers_transaction: bool,
    copy: bool,
    batch_id: int | None = None,
    many: bool = False,
) -> tuple[InsertPlan, bool]:
    """The plan that inserts ``rows`` (at least one) by the statements their shape needs, and
    whether it must run atomically. ``copy``: the connection can COPY; ``batch_id``: the rows
    are members of that batch; ``many``: the rows of an ``enqueue_many`` (a fault is named by
    position).

    Example: ``statements, atomic = plan(rows, in_callers_transaction=False, copy=True)``
    """
    shape = Shape.of(rows)
    if shape >= Shape.WAITING:
        waits = waiting.plan(
            rows, many, in_callers_transaction=in_callers_transaction, batch_id=batch_id
        )
        return waits, True
    if shape is Shape.KEYED:
        return _keyed(rows, in_callers_transaction, batch_id), False
    if copy and len(rows) >= statements.COPY_MIN_ROWS:
        return statements.copy(rows, batch_id), True
    if len(rows) == 1 and batch_id is None:
        return statements.one(rows[0]), False
    return statements.many(rows, batch_id), False


def _keyed(
    rows: Sequence[PreparedJob], in_callers_transaction: bool, batch_id: int | None
) -> InsertPlan:
    """The keyed insert, after a check that the caller's transaction can keep keys' promise."""
    if in_callers_transaction and statements.needs_isolation(rows):
        ((level,),) = yield statements.isolation()
        uniqueness.check_isolation(level, rows)
    return (yield from statements.keyed(rows, batch_id))


def insert(
    conn: Any,
    rows: Sequence[PreparedJob],
    dsn: Dsn | None = None,
    *,
    pooled: bool = False,
    many: bool = False,
) -> list[int]:
    """Insert ``rows`` on ``conn`` (psycopg or SQLAlchemy); their ids in order (for a key
    already taken, the holder's). ``pooled``: ``conn`` is one of the app's own pooled
    connections, where one job of ``Shape.READY`` goes in by ``libpq.insert_ready`` (half the
    client CPU of psycopg's cursor).

    Example: ``insert(conn, [enqueue.prepare(JobSpec("emails.welcome"), None)])``
    """
    if not rows:
        return []
    if pooled and len(rows) == 1 and rows[0].shape is Shape.READY:
        return [libpq.insert_ready(conn, statements.ready_params(rows[0]), dsn=dsn)]
    with translate_errors(dsn):
        steps, whole = plan(
            rows, in_callers_transaction=not own(conn), copy=copies(conn), many=many
        )
        return run(conn, steps, whole)


async def insert_async(
    conn: Any, rows: Sequence[PreparedJob], dsn: Dsn | None = None, *, many: bool = False
) -> list[int]:
    """``insert`` on an async connection (psycopg's or SQLAlchemy's): the same plans, sent
    without blocking the event loop."""
    if not rows:
        return []
    with translate_errors(dsn):
        steps, whole = plan(
            rows, in_callers_transaction=not own(conn), copy=copies(conn), many=many
        )
        return await run_async(conn, steps, whole)


def run(conn: Any, steps: Plan[T], whole: bool) -> T:
    """Send ``steps`` on a sync ``conn``; atomically when ``whole`` (see the module)."""
    if not whole:
        return _drive(conn, steps, None)
    if own(conn):
        with atomic(conn):
            return _drive(conn, steps, None)
    answer = execute(conn, next(steps))  # opens the caller's transaction, if none is open
    with atomic(conn):
        return _drive(conn, steps, answer)


def _drive(conn: Any, steps: Plan[T], answer: list[tuple[Any, ...]] | None) -> T:
    """Send ``steps`` the ``answer`` to its last statement (None: it has not started), then
    run each statement it yields; what it returns."""
    try:
        statement = next(steps) if answer is None else steps.send(answer)
        while True:
            statement = steps.send(execute(conn, statement))
    except StopIteration as done:
        result: T = done.value
        return result


async def run_async(conn: Any, steps: Plan[T], whole: bool) -> T:
    """``run`` on an async ``conn``."""
    if not whole:
        return await _drive_async(conn, steps, None)
    if own(conn):
        async with atomic_async(conn):
            return await _drive_async(conn, steps, None)
    answer = await execute_async(conn, next(steps))
    async with atomic_async(conn):
        return await _drive_async(conn, steps, answer)


async def _drive_async(conn: Any, steps: Plan[T], answer: list[tuple[Any, ...]] | None) -> T:
    try:
        statement = next(steps) if answer is None else steps.send(answer)
        while True:
            statement = steps.send(await execute_async(conn, statement))
    except StopIteration as done:
        result: T = done.value
        return result


def batch_plan(
    callback: dict[str, Any],
    rows: Sequence[PreparedJob],
    *,
    in_callers_transaction: bool,
    copy: bool,
) -> Plan[tuple[int, list[int]]]:
    """A batch's row (with ``callback``, ``BATCH_INSERT``'s parameters), its members by the
    plan their shapes need, each with the batch's id, and its seal; returns the batch's id and
    its members' ids in order. In the caller's transaction a first read opens it, so that the
    batch's row and members are all in the savepoint after it: a refused member leaves none."""
    if in_callers_transaction:
        yield statements.isolation()
    ((batch_id,),) = yield Statement(queries.BATCH_INSERT, callback)
    ids: list[int] = []
    if rows:
        members, _ = plan(
            rows,
            in_callers_transaction=in_callers_transaction,
            copy=copy,
            batch_id=batch_id,
            many=True,
        )
        ids = yield from members
    yield Statement(queries.BATCH_SEAL, {"id": batch_id})
    return batch_id, ids


def write_batch(
    conn: Any, callback: dict[str, Any], rows: Sequence[PreparedJob], dsn: Dsn | None = None
) -> tuple[int, list[int]]:
    """Write a batch (its row, its members, its seal) on ``conn`` in one transaction on
    pgjobs' autocommit connection, in the caller's on theirs (psycopg or SQLAlchemy); the
    batch's id and its members' ids."""
    with translate_errors(dsn):
        steps = batch_plan(callback, rows, in_callers_transaction=not own(conn), copy=copies(conn))
        return run(conn, steps, True)


async def write_batch_async(
    conn: Any, callback: dict[str, Any], rows: Sequence[PreparedJob], dsn: Dsn | None = None
) -> tuple[int, list[int]]:
    """``write_batch`` on an async connection (psycopg's or SQLAlchemy's)."""
    with translate_errors(dsn):
        steps = batch_plan(callback, rows, in_callers_transaction=not own(conn), copy=copies(conn))
        return await run_async(conn, steps, True)
