"""The statements only the dashboard sends, beside ``pgjobs.queries`` (whose fragments they
reuse: the dead-letter filters and fingerprint are the CLI's and the API's, so a filter means the
same thing on every surface). Each is index-backed and LIMITed, or reads the small hot table, or
reads the planner's statistics instead of counting a big table.

Plans at 1M archived and 100k dead rows (``benchmarks/dashboard.py`` fills such a database):

    CHART_LAST_HOUR     Index Only Scan of ix_archived_jobs_finished_at (today's partition) and
                        of ix_dead_letter_failed_at over the last hour
    TABLE_ESTIMATES     pg_class.reltuples of each table and archive partition: no table read
    DEAD_LIST           Index Scan Backward of ix_dead_letter_failed_at, stopped at the LIMIT
    DEAD_NEWEST_IDS     the same, ids only
    DEAD_COUNT_CAPPED   a scan of dead_letter (no fingerprint) stopped at ``cap`` matching rows
    JOBS_BY_KEY         the three idempotency-key indexes
    QUEUE_TASKS         queued_jobs (small), dead_letter of one queue, the last hour of the archive
"""

from __future__ import annotations

from pgjobs import queries

# The dead-letter filters of pgjobs.admin, plus the reason (which the dashboard filters on too).
_DEAD_WHERE = f"""
{queries._DEAD_WHERE}
AND (%(reason)s::text IS NULL OR d.reason = %(reason)s::text)
"""

#: Jobs archived and dead-lettered in each of the last 60 minutes (the current one included),
#: oldest first. Rows: (minute, archived, of which succeeded, dead-lettered).
CHART_LAST_HOUR = """
WITH minutes AS (
    SELECT generate_series(date_trunc('minute', now()) - interval '59 minutes',
                           date_trunc('minute', now()), interval '1 minute') AS minute
),
finished AS (
    SELECT date_trunc('minute', finished_at) AS minute, count(*) AS finished,
           count(*) FILTER (WHERE status = 'succeeded') AS succeeded
    FROM archived_jobs
    -- A bound the planner sees (now() is stable): it prunes to today's partitions and reads
    -- them by index. (Joined from a CTE, it would scan every partition.)
    WHERE finished_at >= date_trunc('minute', now()) - interval '59 minutes'
    GROUP BY 1
),
failed AS (
    SELECT date_trunc('minute', failed_at) AS minute, count(*) AS failed
    FROM dead_letter
    WHERE failed_at >= date_trunc('minute', now()) - interval '59 minutes'
    GROUP BY 1
)
SELECT m.minute, coalesce(finished.finished, 0), coalesce(finished.succeeded, 0),
       coalesce(failed.failed, 0)
FROM minutes m
LEFT JOIN finished USING (minute)
LEFT JOIN failed USING (minute)
ORDER BY m.minute
"""

#: The planner's row estimate of each pgjobs table (archived_jobs summed over its partitions),
#: from the statistics ANALYZE left: NULL for a table never analysed. Rows: (table, rows).
TABLE_ESTIMATES = """
SELECT t.name,
       (SELECT sum(c.reltuples)::bigint
        FROM pg_class c
        WHERE c.relkind = 'r' AND c.reltuples >= 0
          AND (c.oid = t.name::regclass
               OR c.oid IN (SELECT relid FROM pg_partition_tree(t.name::regclass)
                            WHERE isleaf)))
FROM unnest(ARRAY['queued_jobs', 'archived_jobs', 'dead_letter']) AS t(name)
"""

#: Dead jobs matching the filters (reason included), newest first, after the cursor
#: (``before_at``, ``before_id``: the last job of the previous page), at most ``limit``, without
#: tracebacks, in the columns of models.DeadJob.
DEAD_LIST = f"""
SELECT {queries._DEAD_JOB_COLUMNS.format(traceback="NULL::text")}
FROM {queries._DEAD_FROM}
WHERE {_DEAD_WHERE}
  AND (%(before_at)s::timestamptz IS NULL
       OR (d.failed_at, d.id) < (%(before_at)s::timestamptz, %(before_id)s::bigint))
ORDER BY d.failed_at DESC, d.id DESC
LIMIT %(limit)s
"""

#: The ids of the newest ``limit`` dead jobs matching the filters (all of them when ``limit`` is
#: NULL), newest first.
DEAD_NEWEST_IDS = f"""
SELECT d.id
FROM {queries._DEAD_FROM}
WHERE {_DEAD_WHERE}
ORDER BY d.failed_at DESC, d.id DESC
LIMIT %(limit)s
"""

#: How many dead jobs match the filters but the fingerprint, counting no further than ``cap``.
#: The filters are ``pgjobs.admin``'s (``queries._DEAD_WHERE``) without the fingerprint, whose
#: per-row computation a count without it need not pay for.
DEAD_COUNT_CAPPED = """
SELECT count(*) FROM (
    SELECT 1 FROM dead_letter d
    WHERE (%(ids)s::bigint[] IS NULL OR d.id = ANY(%(ids)s::bigint[]))
      AND (%(queue)s::text IS NULL OR d.queue = %(queue)s::text)
      AND (%(task)s::text IS NULL OR d.task = %(task)s::text)
      AND (%(since)s::timestamptz IS NULL OR d.failed_at >= %(since)s::timestamptz)
      AND (%(until)s::timestamptz IS NULL OR d.failed_at < %(until)s::timestamptz)
      AND (%(error)s::text IS NULL
           OR strpos(lower(coalesce(d.last_error, '')), lower(%(error)s::text)) > 0)
      AND (%(reason)s::text IS NULL OR d.reason = %(reason)s::text)
    LIMIT %(cap)s
) matching
"""

#: The jobs holding the idempotency key ``key`` in any table, newest first, at most ``limit``:
#: (id). A key is unique among queued jobs only; the archive and dead letters may hold several.
JOBS_BY_KEY = """
SELECT id FROM (
    SELECT id, created_at FROM queued_jobs WHERE idempotency_key = %(key)s
    UNION ALL
    SELECT id, created_at FROM archived_jobs WHERE idempotency_key = %(key)s
    UNION ALL
    SELECT id, created_at FROM dead_letter WHERE idempotency_key = %(key)s
) found
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s
"""

#: One queue's jobs by task: ready, scheduled, running, dead, archived in the last hour and
#: dead-lettered in the last hour; ages in seconds. Rows: (task, ready, scheduled, running, dead,
#: finished last hour, failed last hour, oldest ready age), by task.
QUEUE_TASKS = """
WITH hot AS (
    SELECT task,
           count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at <= now()) AS ready,
           count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at > now()) AS scheduled,
           count(*) FILTER (WHERE lease_expires_at IS NOT NULL) AS running,
           extract(epoch FROM now() - min(run_at)
                   FILTER (WHERE lease_expires_at IS NULL AND run_at <= now()))::float8
               AS oldest_ready_age
    FROM queued_jobs
    WHERE queue = %(queue)s
    GROUP BY task
),
dead AS (
    SELECT task, count(*) AS dead,
           count(*) FILTER (WHERE failed_at > now() - interval '1 hour') AS failed_last_hour
    FROM dead_letter
    WHERE queue = %(queue)s
    GROUP BY task
),
finished AS (
    SELECT task, count(*) AS finished_last_hour
    FROM archived_jobs
    WHERE queue = %(queue)s AND finished_at > now() - interval '1 hour'
    GROUP BY task
)
SELECT t.task,
       coalesce(hot.ready, 0), coalesce(hot.scheduled, 0), coalesce(hot.running, 0),
       coalesce(dead.dead, 0), coalesce(finished.finished_last_hour, 0),
       coalesce(dead.failed_last_hour, 0), hot.oldest_ready_age
FROM (SELECT task FROM hot UNION SELECT task FROM dead UNION SELECT task FROM finished) t
LEFT JOIN hot USING (task)
LEFT JOIN dead USING (task)
LEFT JOIN finished USING (task)
ORDER BY t.task
"""
