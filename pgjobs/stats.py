"""What `pgjobs stats` shows: per-queue counts, throughput and retry rate over the last minute,
paused queues, the live workers and the jobs each one runs, the periodic schedules with their
next and last run, the top groups of queues that hold grouped jobs, and (``--verbose``) the
health of the tables.

``snapshot`` reads it all in one round of queries; ``as_json`` gives it to machines;
``pgjobs.cli.render`` draws it with rich (once, or again and again under ``--watch``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgjobs import archive, db, groups, queries
from pgjobs.maintenance.registry import STALE_AFTER
from pgjobs.models import (
    ArchivePartition,
    OrphanedLeases,
    QueueGroups,
    QueueStats,
    ScheduleInfo,
    TableHealth,
    WorkerInfo,
)
from pgjobs.schedules import list_schedules


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One reading of everything `pgjobs stats` shows."""

    queues: list[QueueStats]
    workers: list[WorkerInfo]
    orphaned: OrphanedLeases
    #: Only with ``verbose``.
    tables: list[TableHealth] | None = None
    partitions: list[ArchivePartition] | None = None
    #: Rows in archived_jobs' DEFAULT partition (normally 0: the archive-partitions service
    #: creates each day's partition ahead of time).
    default_rows: int | None = None
    #: The periodic schedules recorded in the database (`pgjobs schedule`).
    schedules: list[ScheduleInfo] = field(default_factory=list)
    #: The queues that hold grouped jobs: their top groups by ready jobs, and those at their
    #: limit (``pgjobs.groups.load``).
    groups: list[QueueGroups] = field(default_factory=list)

    @property
    def unserved(self) -> list[str]:
        """The queues with ready jobs that no live worker serves: nothing will run them until a
        worker of that queue starts (paused or not)."""
        served = served_queues(self.workers)
        return [q.queue for q in self.queues if q.ready and q.queue not in served]


def snapshot(
    conn: psycopg.Connection[Any],
    *,
    verbose: bool = False,
    group_limits: Mapping[str, int] | None = None,
    ordered_tasks: Mapping[str, bool | str] | None = None,
) -> Snapshot:
    """Read the queues, the live workers, the groups and, with ``verbose``, the tables' health.
    ``group_limits``: the tasks' own group limits (``groups.task_limits``), when the caller has
    the app; without them a group is at its limit by its queue's group_concurrency alone.
    ``ordered_tasks`` (``groups.ordered_tasks``), with the app too: what holds their groups.

    Example: ``snapshot(conn).queues[0].throughput``
    """
    # One snapshot for every query, so that running jobs add up across the tables.
    with db.translate_errors(), conn.transaction():
        conn.execute(queries.STATS_SNAPSHOT)
        return _read(conn, verbose, group_limits, ordered_tasks)


def _read(
    conn: psycopg.Connection[Any],
    verbose: bool,
    group_limits: Mapping[str, int] | None,
    ordered_tasks: Mapping[str, bool | str] | None,
) -> Snapshot:
    stale = {"stale_after": STALE_AFTER}
    queues = [db.queue_stats_from_row(row) for row in db.fetch_all(conn, queries.QUEUE_STATS)]
    workers = db.live_workers(conn, STALE_AFTER)
    (leases,) = db.fetch_all(conn, queries.LEASES_WITHOUT_LIVE_WORKER, stale)
    orphaned = db.orphaned_leases_from_row(leases)
    scheduled = schedules(conn)
    grouped = groups.load(conn, limits=group_limits, ordered=ordered_tasks)
    if not verbose:
        return Snapshot(queues, workers, orphaned, schedules=scheduled, groups=grouped)
    tables = [db.table_health_from_row(row) for row in db.fetch_all(conn, queries.TABLE_HEALTH)]
    partitions = archive.list_partitions(conn)
    default = archive.default_partition(partitions)
    default_rows = None if default is None else archive.default_rows(conn, default)
    return Snapshot(queues, workers, orphaned, tables, partitions, default_rows, scheduled, grouped)


def served_queues(workers: Iterable[WorkerInfo]) -> set[str]:
    """The queues the live ``workers`` claim from (each registers the queues it works)."""
    return {queue for worker in workers for queue in worker.queues}


def has_live_worker(conn: psycopg.Connection[Any], queue: str) -> bool:
    """Whether a live worker (a heartbeat in the last ``STALE_AFTER`` seconds) serves ``queue``.

    Example: ``has_live_worker(conn, "emails")`` is False before any `pgjobs work` starts.
    """
    return queue in served_queues(db.live_workers(conn, STALE_AFTER))


def schedules(conn: psycopg.Connection[Any]) -> list[ScheduleInfo]:
    """Every periodic schedule recorded in the database, by name. ``declared`` is False for one
    that no worker declared in the last ``STALE_AFTER`` seconds: no running worker's app
    declares it any more, or no worker with maintenance runs; nothing enqueues it then.

    Example: ``[s.name for s in schedules(conn) if not s.declared]``
    """
    return list_schedules(conn)


# -- JSON ----------------------------------------------------------------------------------------


def queue_json(stats: QueueStats) -> dict[str, Any]:
    """One queue as `pgjobs stats --json` prints it."""
    out = dataclasses.asdict(stats)
    out["throughput_per_second"] = round(stats.throughput, 3)
    out["retry_rate"] = None if stats.retry_rate is None else round(stats.retry_rate, 4)
    return out


def schedule_json(schedule: ScheduleInfo) -> dict[str, Any]:
    """One schedule as `pgjobs schedule --json` and `pgjobs stats --json --verbose` print it."""
    return dataclasses.asdict(schedule)


def as_json(snap: Snapshot, *, verbose: bool = False) -> Any:
    """The list of queues; with ``verbose``, an object with queues, workers, orphaned leases,
    tables, partitions, schedules and groups."""
    queues = [queue_json(q) for q in snap.queues]
    if not verbose:
        return queues
    return {
        "queues": queues,
        "workers": [dataclasses.asdict(w) for w in snap.workers],
        "orphaned_leases": dataclasses.asdict(snap.orphaned),
        "tables": [
            {**dataclasses.asdict(t), "dead_ratio": t.dead_ratio} for t in snap.tables or []
        ],
        "archive_partitions": [dataclasses.asdict(p) for p in snap.partitions or []],
        "archive_default_rows": snap.default_rows,
        "schedules": [schedule_json(s) for s in snap.schedules],
        "groups": [dataclasses.asdict(g) for g in snap.groups],
    }
