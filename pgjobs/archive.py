"""The partitions of ``archived_jobs``: what they are called, which instants each one holds, how
to list them and how many rows the DEFAULT partition holds.

``archived_jobs`` is range-partitioned by ``finished_at``, one partition per UTC day, named
``archived_jobs_pYYYYMMDD``. Beside them: ``archived_jobs_default`` (the DEFAULT partition, for
rows no day's partition covers, so that an insert never fails) and, for history converted by
migration 0004, ``archived_jobs_legacy`` (from MINVALUE to where the days begin).

`pgjobs prune` (``pgjobs.retention``), the archive-partitions service
(``pgjobs.maintenance.partitions``), `pgjobs stats` and the benchmarks all go through here.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import psycopg
from psycopg import sql

from pgjobs import db, queries
from pgjobs.models import ArchivePartition

#: Name of the partition of one UTC day: archived_jobs_p20261121.
PARTITION_PREFIX = "archived_jobs_p"


def partition_name(day: date) -> str:
    """``partition_name(date(2026, 11, 21)) == "archived_jobs_p20261121"``"""
    return f"{PARTITION_PREFIX}{day:%Y%m%d}"


def day_range(day: date) -> tuple[datetime, datetime]:
    """[midnight, next midnight) of a UTC day.

    Example: ``day_range(date(2026, 11, 21))[0] == datetime(2026, 11, 21, tzinfo=UTC)``
    """
    start = datetime.combine(day, time(), tzinfo=UTC)
    return start, start + timedelta(days=1)


def create_statement(day: date) -> sql.Composed:
    """The DDL that creates the partition of one UTC day (run it under
    ``queries.ARCHIVE_DDL_LOCK``).

    Example: ``conn.execute(create_statement(date(2026, 11, 21)))``
    """
    lower, upper = day_range(day)
    return sql.SQL(queries.ARCHIVE_PARTITION_CREATE).format(
        partition=sql.Identifier(partition_name(day)),
        lower=sql.Literal(lower),
        upper=sql.Literal(upper),
    )


def list_partitions(conn: psycopg.Connection[Any]) -> list[ArchivePartition]:
    """The partitions of ``archived_jobs``, oldest first, the DEFAULT partition last.

    Example: ``[p.name for p in list_partitions(conn)][-1] == "archived_jobs_default"``
    """
    return [
        db.archive_partition_from_row(row) for row in db.fetch_all(conn, queries.ARCHIVE_PARTITIONS)
    ]


async def list_partitions_async(conn: psycopg.AsyncConnection[Any]) -> list[ArchivePartition]:
    """``list_partitions`` on an async connection (the workers' maintenance services)."""
    rows = await db.fetch_all_async(conn, queries.ARCHIVE_PARTITIONS)
    return [db.archive_partition_from_row(row) for row in rows]


def default_partition(partitions: list[ArchivePartition]) -> ArchivePartition | None:
    """The DEFAULT partition among ``partitions``; None when it was dropped."""
    return next((p for p in partitions if p.is_default), None)


def _spans(partition: ArchivePartition, lower: datetime, upper: datetime) -> bool:
    """Whether a (non-default) partition holds an instant after ``lower`` and one before
    ``upper``."""
    return (
        not partition.is_default
        and partition.upper is not None
        and partition.upper > lower
        and (partition.lower is None or partition.lower < upper)
    )


def overlaps(partitions: list[ArchivePartition], lower: datetime, upper: datetime) -> bool:
    """Whether [lower, upper) shares any instant with a (non-default) partition."""
    return any(_spans(p, lower, upper) for p in partitions)


def finished_before(partitions: list[ArchivePartition], cutoff: datetime) -> list[ArchivePartition]:
    """The (non-default) partitions whose every row finished before ``cutoff``, oldest first."""
    return [p for p in partitions if not p.is_default and p.upper is not None and p.upper <= cutoff]


def straddling(partitions: list[ArchivePartition], cutoff: datetime) -> list[ArchivePartition]:
    """The (non-default) partitions that hold rows on both sides of ``cutoff``: kept whole until
    their newest row is older than it (e.g. ``archived_jobs_legacy``)."""
    return [p for p in partitions if _spans(p, cutoff, cutoff)]


def default_rows(
    conn: psycopg.Connection[Any], default: ArchivePartition, before: datetime | None = None
) -> int:
    """Rows of the DEFAULT partition ``default`` (that finished before ``before``, if given).

    Example: ``default_rows(conn, default_partition(list_partitions(conn)))`` is 0 while the
    archive-partitions service keeps each day's partition ahead of time.
    """
    count = sql.SQL(queries.ARCHIVE_DEFAULT_COUNT_OLDER).format(
        default=sql.Identifier(default.name)
    )
    cutoff: datetime | str = "infinity" if before is None else before
    return int(db.fetch_all(conn, count.as_string(conn), {"cutoff": cutoff})[0][0])


def partition_rows(conn: psycopg.Connection[Any], partition: ArchivePartition) -> int:
    """The exact number of rows in one partition (a count, not the planner's estimate)."""
    count = sql.SQL(queries.ARCHIVE_PARTITION_COUNT).format(
        partition=sql.Identifier(partition.name)
    )
    return int(db.fetch_all(conn, count.as_string(conn))[0][0])
