"""What each dashboard page reads, on a connection it is given. Listings are LIMITed and
index-backed; a table's size is counted exactly up to ``EXACT_COUNT_CAP`` rows and the planner's
estimate beyond (``TableSize``, which says which); the groups of a large dead letter are those of
its newest jobs unless asked for all.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import psycopg

from pgjobs import admin, db, queries, queues, stats
from pgjobs.admin import DeadFilter
from pgjobs.browse import CursorTime
from pgjobs.maintenance.registry import STALE_AFTER
from pgjobs.models import DeadGroup, DeadJob, DeadReason, QueueState, Unloadable, WorkerInfo

#: Dead jobs a page lists at once.
DEAD_PAGE_SIZE = 50
#: The groups of the dead letter are computed over its newest this many jobs matching the
#: filters (all but the fingerprint, which then narrows them) unless every group is asked for:
#: grouping computes each job's error fingerprint, about 30 µs a job (3 s for 100,000), so a
#: page over a big dead letter would wait on it.
GROUP_SAMPLE = 1000
#: The matching dead jobs a listing counts, at most (it says "more than" beyond).
COUNT_CAP = 100_000
#: A table with at most this many rows is counted exactly; a bigger one shows the planner's
#: estimate (``pg_class.reltuples``), or, never analysed, "more than" this.
EXACT_COUNT_CAP = 10_000


@dataclass(frozen=True, slots=True)
class TableSize:
    """How many rows a table holds, as well as it can be read cheaply."""

    table: str
    #: None: more than EXACT_COUNT_CAP rows and no usable estimate (never analysed).
    rows: int | None
    #: Whether ``rows`` was counted (at most EXACT_COUNT_CAP) or is the planner's estimate.
    exact: bool

    def text(self, unit: str = "rows") -> str:
        """``"42 rows"`` counted, ``"≈1.0M rows"`` estimated, or, more than EXACT_COUNT_CAP rows
        and never analysed, how to get an estimate."""
        if self.rows is None:
            return (
                f"more than {EXACT_COUNT_CAP:,} {unit} (never analysed: run ANALYZE {self.table} "
                "for an estimate)"
            )
        if self.exact:
            return f"{self.rows:,} {unit}"
        if self.rows >= 1_000_000:
            return f"≈{self.rows / 1_000_000:.1f}M {unit}"
        return f"≈{self.rows / 1000:.0f}k {unit}"


@dataclass(frozen=True, slots=True)
class ChartPoint:
    """One minute of the overview's chart."""

    minute: datetime
    finished: int
    succeeded: int
    failed: int


@dataclass(frozen=True, slots=True)
class Overview:
    snapshot: stats.Snapshot
    chart: list[ChartPoint]
    #: Each table's size, by name.
    sizes: dict[str, TableSize]
    now: datetime


@dataclass(frozen=True, slots=True)
class DeadView:
    """The dead-letter page: groups, one page of jobs, and how many match."""

    groups: list[DeadGroup]
    #: Whether ``groups`` covers every matching job, or only the newest GROUP_SAMPLE.
    groups_complete: bool
    jobs: list[DeadJob]
    #: The cursor of the next page: (failed_at, id) of the last job shown.
    next_cursor: tuple[datetime | Unloadable, int] | None
    #: Matching jobs, counted up to COUNT_CAP (None when not counted: a fingerprint filter
    #: would compute every job's fingerprint; the confirmation counts them exactly).
    matching: int | None
    #: Every dead job: dead_letter's size.
    total: TableSize
    now: datetime


@dataclass(frozen=True, slots=True)
class TaskLine:
    """One task of a queue's page."""

    task: str
    ready: int
    scheduled: int
    running: int
    dead: int
    finished_last_hour: int
    failed_last_hour: int
    oldest_ready_age: float | None


def now(conn: psycopg.Connection[Any]) -> datetime:
    """The database's clock (pages show ages against it, not the web server's)."""
    row = db.fetch_all(conn, queries.DATABASE_NOW)[0]
    moment: datetime = row[0]
    return moment


def table_sizes(conn: psycopg.Connection[Any]) -> dict[str, TableSize]:
    """Each pgjobs table's size: counted when it holds at most EXACT_COUNT_CAP rows, else the
    planner's estimate when it has one above the cap (on a server without autovacuum a table may
    never be analysed, or its estimate be as old as its last ANALYZE), else "more than the cap".

    Example: ``table_sizes(conn)["dead_letter"].rows``
    """
    estimated = dict(db.fetch_all(conn, queries.TABLE_ROW_ESTIMATES))
    counted = db.fetch_all(conn, queries.TABLE_ROWS_CAPPED, {"cap": EXACT_COUNT_CAP + 1})
    sizes = {}
    for name, rows in counted:
        if rows <= EXACT_COUNT_CAP:
            sizes[name] = TableSize(name, rows, exact=True)
        else:
            estimate = estimated.get(name)
            usable = estimate is not None and estimate > EXACT_COUNT_CAP
            sizes[name] = TableSize(name, estimate if usable else None, exact=False)
    return sizes


def overview(conn: psycopg.Connection[Any]) -> Overview:
    """Everything the overview shows: `pgjobs stats`' snapshot, the last hour by minute, and the
    tables' estimated sizes."""
    snap = stats.snapshot(conn)
    chart = [ChartPoint(*row) for row in db.fetch_all(conn, queries.JOBS_FINISHED_PER_MINUTE)]
    return Overview(snap, chart, table_sizes(conn), now(conn))


def _dead_params(where: DeadFilter, reason: DeadReason | None) -> dict[str, Any]:
    return {**where.params(), "reason": None if reason is None else reason.value}


def dead_ids(
    conn: psycopg.Connection[Any],
    where: DeadFilter,
    reason: DeadReason | None,
    limit: int | None = None,
) -> list[int]:
    """Ids of the newest ``limit`` (all when None) dead jobs matching, newest first."""
    params = {**_dead_params(where, reason), "limit": limit}
    return [row[0] for row in db.fetch_all(conn, queries.DEAD_NEWEST_IDS, params)]


def dead_view(
    conn: psycopg.Connection[Any],
    where: DeadFilter,
    reason: DeadReason | None,
    *,
    before: tuple[CursorTime, int] | None = None,
    all_groups: bool = False,
    limit: int = DEAD_PAGE_SIZE,
) -> DeadView:
    """The dead-letter page for the filters ``where`` and ``reason``."""
    params = _dead_params(where, reason)
    rows = db.fetch_all(
        conn,
        queries.DEAD_LIST_PAGE,
        {
            **params,
            "before_at": before[0] if before else None,
            "before_id": before[1] if before else None,
            "limit": limit + 1,
        },
    )
    jobs = [db.dead_job_from_row(row) for row in rows[:limit]]
    next_cursor = (jobs[-1].failed_at, jobs[-1].id) if len(rows) > limit else None
    groups, complete = dead_groups(conn, where, reason, all_groups=all_groups)
    matching = None
    if where.fingerprint is None:
        counted = {**params, "cap": COUNT_CAP + 1}
        del counted["fingerprint"]
        (count,) = db.fetch_all(conn, queries.DEAD_COUNT_CAPPED, counted)[0]
        matching = int(count)
    return DeadView(
        groups,
        complete,
        jobs,
        next_cursor,
        matching,
        table_sizes(conn)["dead_letter"],
        now(conn),
    )


def dead_groups(
    conn: psycopg.Connection[Any],
    where: DeadFilter,
    reason: DeadReason | None,
    *,
    all_groups: bool = False,
) -> tuple[list[DeadGroup], bool]:
    """The groups of the matching dead jobs, and whether they cover all of them (else only the
    newest GROUP_SAMPLE)."""
    if all_groups:
        if reason is None:
            return admin.dead_groups(conn, where), True
        ids = dead_ids(conn, where, reason)
        complete = True
    else:
        # The newest jobs by the filters that an index serves; the fingerprint (computed per
        # job, and which the planner cannot estimate) then narrows only those.
        ids = dead_ids(conn, replace(where, fingerprint=None), reason, GROUP_SAMPLE + 1)
        complete = len(ids) <= GROUP_SAMPLE
        ids = ids[:GROUP_SAMPLE]
    if not ids:
        return [], True
    sample = DeadFilter(ids=tuple(ids), fingerprint=where.fingerprint)
    return admin.dead_groups(conn, sample), complete


def jobs_by_key(conn: psycopg.Connection[Any], key: str, limit: int = 50) -> list[int]:
    """Ids of the jobs holding the idempotency key ``key``, newest first."""
    return [
        row[0] for row in db.fetch_all(conn, queries.JOB_IDS_BY_KEY, {"key": key, "limit": limit})
    ]


def queue_tasks(conn: psycopg.Connection[Any], queue: str) -> list[TaskLine]:
    """One queue's jobs by task."""
    return [
        TaskLine(*row) for row in db.fetch_all(conn, queries.QUEUE_STATS_BY_TASK, {"queue": queue})
    ]


@dataclass(frozen=True, slots=True)
class QueueView:
    """A queue's page: its totals (its tasks' sums), its settings, and the live workers."""

    totals: TaskLine
    tasks: list[TaskLine]
    state: QueueState
    workers: list[WorkerInfo]

    @property
    def empty(self) -> bool:
        return not self.tasks


def queue_view(conn: psycopg.Connection[Any], queue: str) -> QueueView:
    """One queue's page, without reading the other queues (`pgjobs stats` reads them all)."""
    tasks = queue_tasks(conn, queue)
    ages = [t.oldest_ready_age for t in tasks if t.oldest_ready_age is not None]
    totals = TaskLine(
        task="",
        ready=sum(t.ready for t in tasks),
        scheduled=sum(t.scheduled for t in tasks),
        running=sum(t.running for t in tasks),
        dead=sum(t.dead for t in tasks),
        finished_last_hour=sum(t.finished_last_hour for t in tasks),
        failed_last_hour=sum(t.failed_last_hour for t in tasks),
        oldest_ready_age=max(ages) if ages else None,
    )
    workers = [w for w in db.live_workers(conn, STALE_AFTER) if queue in w.queues]
    return QueueView(totals, tasks, queues.queue(conn, queue), workers)
