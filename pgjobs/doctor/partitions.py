"""The checks about the archive's partitions: today's and tomorrow's, and the DEFAULT one."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import psycopg

from pgjobs import archive, db, queries
from pgjobs.doctor.report import Check, Status


def archive_partitions(conn: psycopg.Connection[Any]) -> Check:
    """The ``archive_partitions`` check: today's and tomorrow's partitions exist."""
    ((today, partitioned, _),) = db.fetch_all(conn, queries.ARCHIVE_STATE)
    if not partitioned:
        return Check(
            "archive_partitions",
            Status.PASS,
            "archived_jobs is not partitioned (schema before 0004): nothing to create ahead",
        )
    partitions = archive.list_partitions(conn)
    days: list[date] = [today, today + timedelta(days=1)]
    missing = [day for day in days if not archive.overlaps(partitions, *archive.day_range(day))]
    dated = [p for p in partitions if not p.is_default and p.upper is not None]
    last = max((p.upper for p in dated if p.upper is not None), default=None)
    details = {
        "today": today.isoformat(),
        "missing": [archive.partition_name(day) for day in missing],
        "partitions": len(dated),
        "covered_until": last,
    }
    if missing:
        names = ", ".join(archive.partition_name(day) for day in missing)
        return Check(
            "archive_partitions",
            Status.WARN,
            f"no partition for {names}: jobs finished then land in the DEFAULT partition, which "
            "`pgjobs prune` cannot drop by day",
            fix="run a worker with its maintenance services (the default): the "
            "archive-partitions service creates today's and the next days' partitions within an "
            "hour of starting",
            details=details,
        )
    until = "-" if last is None else f"{last:%Y-%m-%d %H:%M} UTC"
    return Check(
        "archive_partitions",
        Status.PASS,
        f"partitions for today and tomorrow exist ({len(dated)} in all, up to {until})",
        details=details,
    )


def archive_default_partition(conn: psycopg.Connection[Any]) -> Check:
    """The ``archive_default_partition`` check: rows that landed in the DEFAULT
    partition."""
    ((_, partitioned, _),) = db.fetch_all(conn, queries.ARCHIVE_STATE)
    default = archive.default_partition(archive.list_partitions(conn)) if partitioned else None
    if default is None:
        return Check(
            "archive_default_partition",
            Status.PASS,
            "archived_jobs has no DEFAULT partition" if partitioned else "not partitioned",
        )
    rows = archive.default_rows(conn, default)
    details = {"partition": default.name, "rows": rows}
    if rows == 0:
        return Check(
            "archive_default_partition",
            Status.PASS,
            f"{default.name} is empty",
            details=details,
        )
    return Check(
        "archive_default_partition",
        Status.WARN,
        f"{rows:,} row(s) in {default.name}: their days had no partition when they finished",
        fix="run a worker with its maintenance services: the archive-partitions service moves "
        "them into partitions of their own days (up to 7 days per hourly round)",
        details=details,
    )
