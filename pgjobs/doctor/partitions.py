"""The checks about the archive's partitions: today's and tomorrow's, the DEFAULT one, and
whether a retention policy keeps the archive from growing without end."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import psycopg

from pgjobs import archive, db, queries
from pgjobs.doctor.report import Check, Status, Thresholds
from pgjobs.retention_policy import RetentionPolicy


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


def archive_retention(
    conn: psycopg.Connection[Any], policy: RetentionPolicy | None, limits: Thresholds
) -> Check:
    """The ``archive_retention`` check: the archive holds more than ``limits.archive_days`` days
    of history and ``policy`` (``[tool.pgjobs.retention]``) sets no archive period."""
    ((oldest, now),) = db.fetch_all(conn, queries.ARCHIVE_OLDEST)
    days = 0.0 if oldest is None else (now - oldest) / timedelta(days=1)
    details: dict[str, object] = {"oldest_finished_at": oldest, "days": round(days, 1)}
    if policy is not None and policy.archive is not None:
        kept = policy.archive / timedelta(days=1)
        details["retention_days"] = round(kept, 3)
        return Check(
            "archive_retention",
            Status.PASS,
            f"[tool.pgjobs.retention] keeps the archive {kept:g} days; it holds {days:.0f} "
            "day(s) of history",
            details=details,
        )
    if days <= limits.archive_days:
        return Check(
            "archive_retention",
            Status.PASS,
            f"the archive holds {days:.0f} day(s) of history (no retention policy in "
            f"pyproject.toml; a suggestion comes past {limits.archive_days:g} days)",
            details=details,
        )
    return Check(
        "archive_retention",
        Status.WARN,
        f"the archive holds {days:.0f} days of history and grows: no retention policy removes "
        "any of it",
        fix='set a policy, e.g. [tool.pgjobs.retention] archive = "30d" in pyproject.toml (or '
        "App(retention=...), or pgjobs work --retain-archive 30d): the workers then drop the "
        "expired daily partitions themselves; `pgjobs prune --older-than 30d` does it once",
        details=details,
    )
