"""The archive partitioner: ``archived_jobs`` is partitioned by ``finished_at``, one partition per
UTC day, and this service creates the partitions of the coming days before any row needs them.

Rows that landed in the DEFAULT partition (no partition covered their day, e.g. after every
worker was down for days) are moved into a partition of their own day, created for them, so that
`pgjobs prune` can drop them with their day.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from pgjobs import archive, db, queries
from pgjobs.errors import ConfigurationError
from pgjobs.maintenance import RoundResult, Service, ServiceConfig

#: Days after today whose partitions exist ahead of time (so three days without any worker
#: running this service still route every row to its own day).
DAYS_AHEAD = 3
#: Days of rows moved out of the DEFAULT partition per round, at most.
DEFAULT_DAYS_PER_ROUND = 7


@dataclass(frozen=True, slots=True)
class Partitioned(RoundResult):
    """Partitions created, and rows moved out of the DEFAULT partition into them."""

    created: int
    moved: int


class ArchivePartitions(Service[Partitioned]):
    """Creates the daily partitions of ``archived_jobs`` from today to ``days_ahead`` days ahead,
    and moves rows out of the DEFAULT partition into partitions of their own days.

    Any number of workers may run it at once: they take turns on an advisory lock and each
    partition is created once. Before migration 0004 (archived_jobs not partitioned) it does
    nothing.

    Example: ``await ArchivePartitions().run_once(conn)`` returns
    ``Partitioned(created=4, moved=0)``.
    """

    name = "archive-partitions"
    #: Hourly: a day's partition exists days ahead, so a round only has to keep that margin.
    default_interval = 3600.0

    def __init__(
        self,
        config: ServiceConfig | None = None,
        *,
        days_ahead: int = DAYS_AHEAD,
        lock_timeout: float = 5.0,
    ) -> None:
        super().__init__(config)
        if days_ahead < 0:
            raise ConfigurationError(f"days_ahead must be >= 0, got {days_ahead}")
        if not lock_timeout > 0:
            raise ConfigurationError(f"lock_timeout must be > 0 seconds, got {lock_timeout}")
        self.days_ahead = days_ahead
        #: Seconds one creation waits for its locks before giving up until the next round.
        self.lock_timeout = lock_timeout

    async def run_once(self, conn: psycopg.AsyncConnection[Any]) -> Partitioned:
        rows = await db.fetch_all_async(conn, queries.ARCHIVE_STATE)
        today, partitioned = rows[0][0], rows[0][1]
        if not partitioned:
            return Partitioned(0, 0)
        partitions = await archive.list_partitions_async(conn)
        days: list[date] = []
        default = archive.default_partition(partitions)
        if default is not None:
            stranded = await db.fetch_all_async(
                conn,
                sql.SQL(queries.ARCHIVE_DEFAULT_DAYS)
                .format(default=sql.Identifier(default.name))
                .as_string(conn),
                {"limit": DEFAULT_DAYS_PER_ROUND},
            )
            days += [day for (day,) in stranded]
        # Days with stranded rows first: creating any partition scans the DEFAULT partition.
        days += [today + timedelta(days=n) for n in range(self.days_ahead + 1)]
        created = moved = 0
        for day in dict.fromkeys(days):
            if archive.overlaps(partitions, *archive.day_range(day)):
                continue
            done, rows_moved = await self._create(conn, day)
            created += done
            moved += rows_moved
        return Partitioned(created, moved)

    async def _create(self, conn: psycopg.AsyncConnection[Any], day: date) -> tuple[int, int]:
        """Create the partition of ``day`` unless another worker just did; returns (created,
        rows moved out of the DEFAULT partition)."""
        lower, upper = archive.day_range(day)
        timeout = {"timeout": f"{int(self.lock_timeout * 1000)}ms"}
        with db.translate_errors():
            async with conn.transaction():
                await conn.execute(queries.LOCK_TIMEOUT_LOCAL, timeout)
                await conn.execute(queries.ARCHIVE_DDL_LOCK, {"key": queries.ARCHIVE_DDL_LOCK_KEY})
                # Under the lock: what another worker created meanwhile counts.
                partitions = await archive.list_partitions_async(conn)
                if archive.overlaps(partitions, lower, upper):
                    return 0, 0
                moved = 0
                default = archive.default_partition(partitions)
                if default is not None:
                    moved = await self._stage_default_rows(conn, default.name, lower, upper)
                await conn.execute(archive.create_statement(day))
                if moved:
                    await conn.execute(queries.ARCHIVE_DEFAULT_UNSTAGE)
        return 1, moved

    async def _stage_default_rows(
        self, conn: psycopg.AsyncConnection[Any], default: str, lower: datetime, upper: datetime
    ) -> int:
        """Take the DEFAULT partition's rows of [lower, upper) aside (the partition about to be
        created could not be created while they are there); returns how many."""
        name = sql.Identifier(default)
        await conn.execute(sql.SQL(queries.ARCHIVE_DEFAULT_LOCK).format(default=name))
        cur = await conn.execute(
            sql.SQL(queries.ARCHIVE_DEFAULT_STAGE).format(
                default=name, lower=sql.Literal(lower), upper=sql.Literal(upper)
            )
        )
        return max(cur.rowcount, 0)
