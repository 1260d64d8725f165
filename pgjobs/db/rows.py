"""Rows as ``models``: one function per select list of ``queries``, named after the model it
returns; and the loading of rows that a value Python cannot hold does not fail (``loaded_rows``,
``fetch_rows``): that value becomes an ``Unloadable``, and only its row is affected."""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg
import psycopg.adapt
from psycopg import pq
from psycopg.abc import Transformer

from pgjobs.models import (
    ArchivePartition,
    DeadGroup,
    DeadJob,
    DeadReason,
    Job,
    JobHistory,
    JobStatus,
    OrphanedLeases,
    QueueState,
    QueueStats,
    ScheduleInfo,
    TableHealth,
    Unloadable,
    WorkerInfo,
)

#: A row as a statement returns it.
Row = tuple[Any, ...]

# What a loader raises for a value it cannot turn into Python: a time beyond year 9999 or
# infinite (DataError), text or JSON that does not decode (ValueError), a number too large.
_LOAD_ERRORS = (psycopg.DataError, ValueError, OverflowError)


def loaded_rows(transformer: Transformer, result: pq.abc.PGresult) -> list[Row]:
    """``result``'s rows as tuples, loaded by ``transformer`` (set to ``result``). A value that
    cannot be loaded becomes an ``Unloadable`` instead of failing every row: only the rows that
    hold one are loaded value by value (the usual path costs nothing more)."""
    try:
        return transformer.load_rows(0, result.ntuples, tuple)
    except _LOAD_ERRORS:
        return Damaged(_row(transformer, result, n) for n in range(result.ntuples))


def fetch_rows(cursor: psycopg.Cursor[Any]) -> list[Any]:
    """Every row of ``cursor`` (just executed, any row factory), as ``loaded_rows`` loads
    them."""
    try:
        return cursor.fetchall()
    except _LOAD_ERRORS:
        return _reloaded(cursor)


async def fetch_rows_async(cursor: psycopg.AsyncCursor[Any]) -> list[Any]:
    """``fetch_rows`` for an async cursor."""
    try:
        return await cursor.fetchall()
    except _LOAD_ERRORS:
        return _reloaded(cursor)


def fetch_row(cursor: psycopg.Cursor[Any]) -> Any:
    """The first row of ``cursor`` (just executed), as ``loaded_rows`` loads it; None if none."""
    rows = fetch_rows(cursor)
    return rows[0] if rows else None


class Damaged(list[Any]):
    """Rows of which some hold an ``Unloadable`` (what ``loaded_rows`` and ``fetch_rows`` return
    then): the caller looks for them only when it is given one of these."""


def damaged(rows: list[Any]) -> bool:
    """Whether some of ``rows`` (from ``loaded_rows`` or ``fetch_rows``) hold an
    ``Unloadable``."""
    return isinstance(rows, Damaged)


def unloadable(row: Row) -> list[Unloadable]:
    """The values of ``row`` that could not be loaded."""
    return [value for value in row if isinstance(value, Unloadable)]


def unloadable_problem(values: list[Unloadable]) -> str:
    """Why a job whose row holds ``values`` cannot run, in one line for its last_error."""
    shown = "; ".join(f"{v.column} = {v.raw!r} ({v.problem})" for v in values)
    return f"the job's row holds a value Python cannot load, not written by pgjobs: {shown}"


def _reloaded(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> list[Any]:
    result = cursor.pgresult
    if result is None:  # no statement, nothing to load
        return []
    transformer = psycopg.adapt.Transformer(cursor)
    transformer.set_pgresult(result)
    make_row = cursor.row_factory(cursor)  # type: ignore[arg-type]
    return Damaged(make_row(row) for row in loaded_rows(transformer, result))


def _row(transformer: Transformer, result: pq.abc.PGresult, n: int) -> Row:
    try:
        return transformer.load_row(n, tuple)
    except _LOAD_ERRORS:
        return tuple(_value(transformer, result, n, column) for column in range(result.nfields))


def _value(transformer: Transformer, result: pq.abc.PGresult, n: int, column: int) -> Any:
    data = result.get_value(n, column)
    if data is None:
        return None
    oid, fmt = result.ftype(column), pq.Format(result.fformat(column))
    try:
        return transformer.get_loader(oid, fmt).load(data)
    except _LOAD_ERRORS as exc:
        name = (result.fname(column) or b"?").decode(errors="replace")
        return Unloadable(name, _raw(bytes(data), oid, fmt), str(exc) or type(exc).__name__)


_TIMESTAMP_OIDS = (1114, 1184)  # timestamp, timestamptz
_MICROSECONDS_A_DAY = 86_400_000_000
_DAYS_1970_TO_2000 = 10_957
_INT64 = 2**63


def _raw(data: bytes, oid: int, fmt: pq.Format) -> str:
    """``data`` as PostgreSQL would write it: text as it came; a binary timestamp (microseconds
    since 2000-01-01 UTC) written out, whatever its year; anything else in hex."""
    if fmt == pq.Format.TEXT:
        return data.decode(errors="backslashreplace")
    if oid in _TIMESTAMP_OIDS and len(data) == 8:
        micros = int.from_bytes(data, "big", signed=True)
        if micros in (_INT64 - 1, -_INT64):
            return "infinity" if micros > 0 else "-infinity"
        days, rest = divmod(micros, _MICROSECONDS_A_DAY)
        year, month, day = _civil(days + _DAYS_1970_TO_2000)
        seconds = rest // 1_000_000
        time = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        return f"{year:04d}-{month:02d}-{day:02d} {time}" + ("+00" if oid == 1184 else "")
    return "\\x" + data.hex()


def _civil(days: int) -> tuple[int, int, int]:
    """(year, month, day) of the proleptic Gregorian date ``days`` after 1970-01-01, for any
    year (H. Hinnant's ``civil_from_days``)."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


def job_from_row(row: tuple[Any, ...]) -> Job:
    """A claimed ``queued_jobs`` row (columns as ``queries.JOB_COLUMNS``) as a ``Job``."""
    return Job(*row)


def dead_job_from_row(row: tuple[Any, ...]) -> DeadJob:
    """A ``dead_letter`` row (columns as ``queries.DEAD_LIST``) as a ``DeadJob``."""
    job = DeadJob(*row)
    return dataclasses.replace(job, reason=DeadReason(job.reason), tags=tuple(job.tags or ()))


def dead_group_from_row(row: tuple[Any, ...]) -> DeadGroup:
    """A row of ``queries.DEAD_GROUP`` as a ``DeadGroup``."""
    task, fingerprint, fingerprint_id, count, first, last, queues, latest_id = row
    return DeadGroup(
        task, fingerprint, fingerprint_id, count, first, last, tuple(queues), latest_id
    )


# Where JOB_LOOKUP's row holds the columns that job_history_from_row turns into their types.
_HISTORY_FIELDS = [field.name for field in dataclasses.fields(JobHistory)]
_STATUS, _REASON, _TAGS, _REPLAYS = map(
    _HISTORY_FIELDS.index, ("status", "reason", "tags", "replays")
)


def job_history_from_row(row: tuple[Any, ...]) -> JobHistory:
    """A row of ``queries.JOB_LOOKUP`` as a ``JobHistory``."""
    # Typed in place, then built once (dataclasses.replace would build it twice: a batch's
    # answer builds a thousand).
    values = list(row)
    values[_STATUS] = JobStatus(values[_STATUS])
    if values[_REASON] is not None:
        values[_REASON] = DeadReason(values[_REASON])
    values[_REPLAYS] = tuple(values[_REPLAYS])
    values[_TAGS] = tuple(values[_TAGS] or ())
    return JobHistory(*values)


def archive_partition_from_row(row: tuple[Any, ...]) -> ArchivePartition:
    """A row of ``queries.ARCHIVE_PARTITIONS`` as an ``ArchivePartition``."""
    return ArchivePartition(*row)


def queue_stats_from_row(row: tuple[Any, ...]) -> QueueStats:
    """A row of ``queries.QUEUE_STATS`` as a ``QueueStats``."""
    return QueueStats(*row)


def queue_state_from_row(row: tuple[Any, ...]) -> QueueState:
    """A row of ``queries.QUEUE_LIST`` or ``queries.QUEUE_GET`` as a ``QueueState``."""
    return QueueState(*row)


def schedule_info_from_row(row: tuple[Any, ...]) -> ScheduleInfo:
    """A row of ``queries.SCHEDULE_LIST`` as a ``ScheduleInfo``."""
    return ScheduleInfo(*row)


def worker_info_from_row(row: tuple[Any, ...]) -> WorkerInfo:
    """A row of ``queries.WORKERS_LIVE`` as a ``WorkerInfo``."""
    return WorkerInfo(*row)


def orphaned_leases_from_row(row: tuple[Any, ...]) -> OrphanedLeases:
    """The row of ``queries.LEASES_WITHOUT_LIVE_WORKER`` as an ``OrphanedLeases``."""
    return OrphanedLeases(*row)


def table_health_from_row(row: tuple[Any, ...]) -> TableHealth:
    """A row of ``queries.TABLE_HEALTH`` as a ``TableHealth``."""
    return TableHealth(*row)
