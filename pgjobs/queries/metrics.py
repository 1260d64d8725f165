"""The readers of finished jobs that pgjobs serve's /metrics walks by cursor."""

from __future__ import annotations

from pgjobs.models import JobStatus

#
# Read every few seconds by `pgjobs serve`'s /metrics, so each one is cheap at any size:
# queued_jobs is small and scanned; dead_letter is grouped whole (it holds what humans have yet
# to triage); archived_jobs, which may hold millions of rows, is only ever read by an index range
# on finished_at over what finished since the last reading (ix_archived_jobs_finished_at, on
# every partition; partitions of other days are pruned by the range).
#
# Plans (EXPLAIN ANALYZE) with 1,000,000 archived rows over 30 daily partitions, 2,000 queued
# jobs and 5,000 dead ones, PostgreSQL 15:
#   METRICS_QUEUED, METRICS_DEAD_LETTER
#       HashAggregate <- Seq Scan: 0.9 ms for 2,000 queued rows, 1.6 ms for 5,000 dead ones.
#   METRICS_ARCHIVED_NEXT
#       Limit <- Incremental Sort (finished_at presorted, then id) <- Merge Append of an Index
#       Scan of finished_at on each partition the range reaches (the others removed at executor
#       start, "Subplans Removed"): 0.08 ms when nothing finished, 7.8 ms for a page of 10,000.
#   METRICS_ARCHIVED_WINDOW_COUNT
#       Aggregate <- Append of index scans (finished_at, or index-only on the primary key) over
#       the window's partitions: 0.08 ms for a window of a few rows, 20 ms for 33,000 (the
#       count alone took 9 ms; the sum of times in microseconds costs the rest).
#   METRICS_ARCHIVED_WINDOW (only when that count shows a late row)
#       as METRICS_ARCHIVED_NEXT over the window: 24 ms for 33,000 rows.
#   METRICS_DEAD_NEXT, _WINDOW_COUNT, _WINDOW
#       the same shapes on ix_dead_letter_failed_at: 0.08 ms for 60 rows.
#: The database's clock, where the metrics' readings of the archive and dead letters start.
METRICS_NOW = "SELECT now()"

#: Jobs of queued_jobs by queue and task. Rows: (queue, task, ready, scheduled, running,
#: seconds since the oldest ready job's run_at or NULL when none is ready).
METRICS_QUEUED = """
SELECT queue, task,
       count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at <= now()),
       -- Jobs waiting for their dependencies (run_at 'infinity') are not scheduled ones.
       count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at > now()
                          AND run_at <> 'infinity'),
       count(*) FILTER (WHERE lease_expires_at IS NOT NULL),
       extract(epoch FROM now() - min(run_at)
               FILTER (WHERE lease_expires_at IS NULL AND run_at <= now()))::float8
FROM queued_jobs
GROUP BY queue, task
"""

#: Jobs in dead_letter by queue and task. Rows: (queue, task, jobs).
METRICS_DEAD_LETTER = """
SELECT queue, task, count(*) FROM dead_letter GROUP BY queue, task
"""


def _metrics_reading(table: str, at: str, columns: str) -> tuple[str, str, str]:
    """The three statements that read what entered ``table`` since the last reading, in
    (``at``, id) order: the next page after a cursor, the number of rows in the window behind
    the cursor with the sums of their ids and of their times in microseconds (a row that
    committed late and another deleted since leave the count alone, not the sums too), and that
    window's rows (to find rows that committed after the cursor passed)."""
    select = f"SELECT id, {at}, {columns} FROM {table}"
    following = f"""
{select}
WHERE {at} >= %(after)s AND ({at}, id) > (%(after)s, %(after_id)s)
  AND {at} < now() - %(hold)s * interval '1 second'
ORDER BY {at}, id
LIMIT %(limit)s
"""
    window = f"{at} > %(lower)s AND {at} <= %(upper)s AND ({at}, id) <= (%(upper)s, %(upper_id)s)"
    count = f"""
SELECT count(*), coalesce(sum(id), 0),
       coalesce(sum((extract(epoch FROM {at}) * 1000000)::bigint), 0)
FROM {table}
WHERE {window}
"""
    rows = f"""
{select}
WHERE {window}
ORDER BY {at}, id
LIMIT %(limit)s
"""
    return following, count, rows


_ARCHIVED_METRIC_COLUMNS = (
    "queue, task, status, "
    "extract(epoch FROM finished_at - started_at)::float8, "
    "extract(epoch FROM started_at - run_at)::float8"
)

_DEAD_METRIC_COLUMNS = f"queue, task, '{JobStatus.DEAD}', NULL::float8, NULL::float8"

#: METRICS_ARCHIVED_NEXT: up to ``limit`` archived jobs after the cursor (``after``,
#: ``after_id``) in (finished_at, id) order that finished at least ``hold`` seconds ago.
#: METRICS_ARCHIVED_WINDOW_COUNT: the number of archived jobs in the window (``lower``, cursor
#: ``upper``, ``upper_id``], the sum of their ids and the sum of their finished_at as Unix
#: microseconds. METRICS_ARCHIVED_WINDOW: those jobs, at most ``limit``.
#: Rows of both readers: (id, finished_at, queue, task, status, seconds from start to finish,
#: seconds from run_at to start; NULL when the job never started).
METRICS_ARCHIVED_NEXT, METRICS_ARCHIVED_WINDOW_COUNT, METRICS_ARCHIVED_WINDOW = _metrics_reading(
    "archived_jobs", "finished_at", _ARCHIVED_METRIC_COLUMNS
)

#: The METRICS_ARCHIVED_* statements for dead_letter, by failed_at; status is 'dead' and the
#: two durations NULL.
METRICS_DEAD_NEXT, METRICS_DEAD_WINDOW_COUNT, METRICS_DEAD_WINDOW = _metrics_reading(
    "dead_letter", "failed_at", _DEAD_METRIC_COLUMNS
)
