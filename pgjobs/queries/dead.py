"""Dead letters: list, group by fingerprint, redrive and purge."""

from __future__ import annotations

from pgjobs.queries.channels import NOTIFY_CHANNEL

# The error fingerprint of a dead_letter row ``d``: its first error line with quoted strings,
# UUIDs, hex ids and numbers replaced by placeholders (hex before numbers, so an id such as
# 3f9a2b1c becomes one <n>, like a decimal id), prefixed by the reason when no exception was
# recorded (lease_expired, unknown_task, ...). 40,000 failures of one outage share one
# fingerprint. Computed, never stored: the rows keep the raw error.
_FINGERPRINT = r"""
left(
    CASE WHEN d.error_type IS NULL THEN d.reason || ': ' ELSE '' END
    || regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
        split_part(left(coalesce(d.last_error, ''), 1000), E'\n', 1),
        $q$(^|[^[:alnum:]_])('[^']*'|"[^"]*")$q$, '\1<str>', 'g'),
        '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<uuid>', 'gi'),
        '0x[0-9a-f]+|(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{8,}', '<n>', 'gi'),
        '[0-9]+(\.[0-9]+)*', '<n>', 'g'),
        '\s+', ' ', 'g'),
    300)
"""

# dead_letter rows ``d`` with their fingerprint ``f.fingerprint`` and its short id.
_DEAD_FROM = f"""
dead_letter d
CROSS JOIN LATERAL (SELECT {_FINGERPRINT} AS fingerprint) f0
CROSS JOIN LATERAL (SELECT f0.fingerprint, left(md5(f0.fingerprint), 8) AS id) f
"""

# The filters of `pgjobs dead list/group/redrive/purge`; a NULL parameter does not filter.
# ``error`` is a case-insensitive substring of last_error; ``fingerprint`` is a fingerprint or its
# short id; ``until`` is exclusive. _DEAD_WHERE_BUT_FINGERPRINT needs no _DEAD_FROM (a count
# without a fingerprint filter need not compute each row's fingerprint).
_DEAD_WHERE_BUT_FINGERPRINT = """
(%(ids)s::bigint[] IS NULL OR d.id = ANY(%(ids)s::bigint[]))
AND (%(queue)s::text IS NULL OR d.queue = %(queue)s::text)
AND (%(task)s::text IS NULL OR d.task = %(task)s::text)
AND (%(tags)s::text[] IS NULL OR d.tags @> %(tags)s::text[])
AND (%(since)s::timestamptz IS NULL OR d.failed_at >= %(since)s::timestamptz)
AND (%(until)s::timestamptz IS NULL OR d.failed_at < %(until)s::timestamptz)
AND (%(error)s::text IS NULL
     OR strpos(lower(coalesce(d.last_error, '')), lower(%(error)s::text)) > 0)
"""

_DEAD_WHERE = (
    _DEAD_WHERE_BUT_FINGERPRINT
    + "AND (%(fingerprint)s::text IS NULL OR %(fingerprint)s::text IN (f.fingerprint, f.id))\n"
)

# Columns of dead_letter ``d`` in the order models.DeadJob takes them; {traceback} is
# ``d.traceback`` or NULL (listings leave it out).
_DEAD_JOB_COLUMNS = """
d.id, d.queue, d.task, d.payload, d.priority, d.run_at, d.attempts, d.max_attempts, d.reason,
d.error_type, d.last_error, {traceback}, d.worker, d.created_at, d.failed_at, d.expires_at,
d.idempotency_key, d.redrive_count, d.redriven_at, d.replay_of, d.started_at, f.fingerprint,
f.id, d.tags
"""


def _dead_list(traceback: str) -> str:
    """Dead jobs matching the filters, newest first, at most ``limit``; ``traceback`` is the
    traceback column's expression."""
    return f"""
SELECT {_DEAD_JOB_COLUMNS.format(traceback=traceback)}
FROM {_DEAD_FROM}
WHERE {_DEAD_WHERE}
ORDER BY d.failed_at DESC, d.id DESC
LIMIT %(limit)s
"""


#: Dead jobs matching the filters, newest first, at most ``limit``, without their tracebacks.
DEAD_LIST = _dead_list("NULL::text")

#: DEAD_LIST with each job's traceback (`pgjobs dead list --json`).
DEAD_LIST_WITH_TRACEBACK = _dead_list("d.traceback")

#: One dead job, with its traceback.
DEAD_GET = f"""
SELECT {_DEAD_JOB_COLUMNS.format(traceback="d.traceback")}
FROM {_DEAD_FROM}
WHERE d.id = %(id)s
"""

#: Dead jobs matching the filters, counted by task and error fingerprint, largest group first.
#: Rows: (task, fingerprint, fingerprint id, count, first failed_at, last failed_at, queues,
#: newest id).
DEAD_GROUP = f"""
SELECT d.task, f.fingerprint, f.id, count(*), min(d.failed_at), max(d.failed_at),
       array_agg(DISTINCT d.queue ORDER BY d.queue), max(d.id)
FROM {_DEAD_FROM}
WHERE {_DEAD_WHERE}
GROUP BY d.task, f.fingerprint, f.id
ORDER BY count(*) DESC, d.task, f.fingerprint
"""

#: The ids of the dead jobs matching the filters, ascending, and the transaction's now(): what a
#: redrive or purge will move, batch by batch by id (the filters are evaluated once here, not on
#: the whole table per batch), and only jobs that failed before it started.
DEAD_SELECT_IDS = f"""
SELECT coalesce(array_agg(d.id ORDER BY d.id), '{{}}'), now()
FROM {_DEAD_FROM}
WHERE {_DEAD_WHERE}
"""

#: Which of these ids are in dead_letter.
DEAD_FIND_IDS = """
SELECT id FROM dead_letter WHERE id = ANY(%(ids)s::bigint[])
"""

# Up to ``limit`` dead jobs matching the filters (``ids``: one batch of DEAD_SELECT_IDS), in id
# order, locked (SKIP LOCKED: two concurrent redrives or purges never take the same row).
_DEAD_PICK = f"""
SELECT d.id
FROM {_DEAD_FROM}
WHERE {_DEAD_WHERE}
ORDER BY d.id
LIMIT %(limit)s
FOR UPDATE OF d SKIP LOCKED
"""

# Upsert the pgjobs_group_states rows of the groups of jobs moved back into queued_jobs (``{rows}``:
# a CTE with queue and group_key), as an enqueue does, in (queue, group) order.
_GROUPS_TOUCHED = """
    INSERT INTO pgjobs_group_states (queue, group_key)
    SELECT DISTINCT queue, group_key FROM {rows} WHERE group_key IS NOT NULL
    ORDER BY queue, group_key
    ON CONFLICT (queue, group_key) DO UPDATE SET touched_at = clock_timestamp()
"""

# A job moved back into queued_jobs (``{rows}``: a CTE of them, with task, unique_key and id)
# keeps its unique key only when no job of its task not started yet holds the key (the first by
# id, when several moved together share one): otherwise its key becomes NULL. A concurrent
# enqueue that takes the key meanwhile is met by ON CONFLICT DO NOTHING, and the job goes in
# again without its key (see DEAD_REDRIVE_BATCH).
_KEY_IF_FREE = """CASE WHEN unique_key IS NOT NULL
         AND row_number() OVER (PARTITION BY task, unique_key ORDER BY id) = 1
         AND NOT EXISTS (
             SELECT 1 FROM queued_jobs h
             WHERE h.task = {rows}.task AND h.unique_key = {rows}.unique_key
               AND h.started_at IS NULL
         ) THEN unique_key END"""

_BY_ID = "\n    ORDER BY id"


def _requeue(columns: str, source: str, order: str = "") -> str:
    """Two CTEs, ``keyed`` and ``unkeyed``, that insert ``source``'s rows (``columns``) into
    queued_jobs: each with its unique key (as _KEY_IF_FREE left it), or without it when an
    enqueue took the key meanwhile. Both return (id, queue); ``order`` sorts the inserts."""
    return f"""keyed AS (
    INSERT INTO queued_jobs ({columns})
    SELECT {columns} FROM {source}{order}
    ON CONFLICT DO NOTHING
    RETURNING id, queue
),
unkeyed AS (
    INSERT INTO queued_jobs ({columns})
    SELECT {columns.replace("unique_key", "NULL")} FROM {source}
    WHERE id NOT IN (SELECT id FROM keyed){order}
    RETURNING id, queue
)"""


_REDRIVEN_COLUMNS = (
    "id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error, created_at, "
    "expires_at, idempotency_key, redrive_count, redriven_at, replay_of, payload_version, "
    "trace_context, group_key, unique_key, batch_id, tags"
)

#: Move one batch of up to ``limit`` dead jobs matching the filters back to queued_jobs, ready now
#: with fresh attempts (last_error, payload version, trace context and group kept; the unique key
#: kept when free, see _KEY_IF_FREE), their redrive record updated, their groups' rows touched,
#: and wake idle workers of their queues. Returns the ids moved.
DEAD_REDRIVE_BATCH = f"""
WITH picked AS ({_DEAD_PICK}),
gone AS (
    DELETE FROM dead_letter d USING picked WHERE d.id = picked.id
    RETURNING d.*
),
moving AS (
    SELECT id, queue, task, payload, priority, now() AS run_at, 0 AS attempts, max_attempts,
           last_error, created_at, expires_at, idempotency_key,
           redrive_count + 1 AS redrive_count, now() AS redriven_at, replay_of, payload_version,
           trace_context, group_key, {_KEY_IF_FREE.format(rows="gone")} AS unique_key, batch_id, tags
    FROM gone
),
{_requeue(_REDRIVEN_COLUMNS, "moving", _BY_ID)},
requeued AS (
    SELECT * FROM keyed UNION ALL SELECT * FROM unkeyed
),
grouped AS ({_GROUPS_TOUCHED.format(rows="gone")}),
notified AS (
    SELECT count(pg_notify('{NOTIFY_CHANNEL}', queue)) AS n
    FROM (SELECT DISTINCT queue FROM requeued) q
)
SELECT r.id FROM requeued r CROSS JOIN notified ORDER BY r.id
"""

#: Delete one batch of up to ``limit`` dead jobs matching the filters, for good, and the record
#: of their edits (pgjobs_job_edits). Returns the ids.
DEAD_PURGE_BATCH = f"""
WITH picked AS ({_DEAD_PICK}),
gone AS (
    DELETE FROM dead_letter d USING picked WHERE d.id = picked.id
    RETURNING d.id
),
forgotten AS (
    DELETE FROM pgjobs_job_edits e USING gone WHERE e.job_id = gone.id
)
SELECT id FROM gone
"""

# Each is index-backed and LIMITed, or reads the small hot table, or reads the planner's
# statistics instead of counting a big table. Plans at 1M archived and 100k dead rows
# (``benchmarks/dashboard.py`` fills such a database):
#   JOBS_FINISHED_PER_MINUTE  Index Only Scan of ix_archived_jobs_finished_at (today's
#                             partition) and of ix_dead_letter_failed_at over the last hour
#   TABLE_ROW_ESTIMATES       pg_class.reltuples of each table and archive partition: no table read
#   TABLE_ROWS_CAPPED         a scan of each table stopped at ``cap`` rows
#   DEAD_LIST_PAGE            Index Scan Backward of ix_dead_letter_failed_at, stopped at the LIMIT
#   DEAD_NEWEST_IDS           the same, ids only
#   DEAD_COUNT_CAPPED         a scan of dead_letter (no fingerprint) stopped at ``cap`` rows
#   JOB_IDS_BY_KEY            the three idempotency-key indexes
#   QUEUE_STATS_BY_TASK       queued_jobs (small), dead_letter of one queue, the last hour of the
#                             archive
# The dead-letter filters plus the reason (the dashboard filters on it; the CLI and the API
# do not).
_DEAD_WHERE_AND_REASON = (
    _DEAD_WHERE + "AND (%(reason)s::text IS NULL OR d.reason = %(reason)s::text)\n"
)

#: DEAD_LIST narrowed by ``reason`` too, one page after the cursor (``before_at``,
#: ``before_id``: the last job of the previous page; NULL for the first page).
DEAD_LIST_PAGE = f"""
SELECT {_DEAD_JOB_COLUMNS.format(traceback="NULL::text")}
FROM {_DEAD_FROM}
WHERE {_DEAD_WHERE_AND_REASON}
  AND (%(before_at)s::timestamptz IS NULL
       OR (d.failed_at, d.id) < (%(before_at)s::timestamptz, %(before_id)s::bigint))
ORDER BY d.failed_at DESC, d.id DESC
LIMIT %(limit)s
"""

#: The ids of the newest ``limit`` dead jobs matching the filters and ``reason`` (all of them
#: when ``limit`` is NULL), newest first.
DEAD_NEWEST_IDS = f"""
SELECT d.id
FROM {_DEAD_FROM}
WHERE {_DEAD_WHERE_AND_REASON}
ORDER BY d.failed_at DESC, d.id DESC
LIMIT %(limit)s
"""

#: How many dead jobs match the filters but the fingerprint, and ``reason``, counting no further
#: than ``cap``.
DEAD_COUNT_CAPPED = f"""
SELECT count(*) FROM (
    SELECT 1 FROM dead_letter d
    WHERE {_DEAD_WHERE_BUT_FINGERPRINT}
      AND (%(reason)s::text IS NULL OR d.reason = %(reason)s::text)
    LIMIT %(cap)s
) matching
"""
