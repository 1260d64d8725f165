"""Browsing jobs across the three tables, newest first, for the dashboard and the CLI."""

from __future__ import annotations

from pgjobs.models import JobStatus

# A job of each table in the columns of models.JobHistory (by name; ``replays`` aside), plus
# ``at``, the moment it entered its table as far as the table records it: created_at (or
# redriven_at, for a redriven job) in queued_jobs, finished_at in archived_jobs, failed_at in
# dead_letter. Listings page by (at, id), newest first.
_BROWSE_QUEUED = f"""
SELECT id, 'queued_jobs' AS "table",
       CASE WHEN lease_expires_at IS NOT NULL THEN '{JobStatus.RUNNING}'
            WHEN run_at = 'infinity' THEN '{JobStatus.WAITING}'
            WHEN run_at > now() THEN '{JobStatus.SCHEDULED}'
            ELSE '{JobStatus.READY}' END AS status,
       queue, task, payload, priority, run_at, attempts, max_attempts, created_at, expires_at,
       idempotency_key, last_error, lease_owner, lease_expires_at, NULL::jsonb AS result,
       NULL::text AS worker, NULL::timestamptz AS finished_at, NULL::text AS reason,
       NULL::text AS error_type, {{traceback}} AS traceback, redrive_count, redriven_at,
       replay_of, started_at, group_key, unique_key, snoozes, progress, tags,
       coalesce(redriven_at, created_at) AS at
FROM queued_jobs
"""

_BROWSE_ARCHIVED = """
SELECT id, 'archived_jobs' AS "table", status,
       queue, task, payload, priority, run_at, attempts, max_attempts, created_at, expires_at,
       idempotency_key, last_error, NULL::text AS lease_owner,
       NULL::timestamptz AS lease_expires_at, {result} AS result, worker, finished_at,
       NULL::text AS reason, NULL::text AS error_type, {traceback} AS traceback, redrive_count,
       redriven_at, replay_of, started_at, group_key, unique_key, snoozes, progress, tags,
       finished_at AS at
FROM archived_jobs
"""

_BROWSE_DEAD = f"""
SELECT id, 'dead_letter' AS "table", '{JobStatus.DEAD}' AS status,
       queue, task, payload, priority, run_at, attempts, max_attempts, created_at, expires_at,
       idempotency_key, last_error, NULL::text AS lease_owner,
       NULL::timestamptz AS lease_expires_at, NULL::jsonb AS result, worker,
       failed_at AS finished_at, reason, error_type, {{traceback}} AS traceback, redrive_count,
       redriven_at, replay_of, started_at, group_key, unique_key, snoozes, progress, tags,
       failed_at AS at
FROM dead_letter
"""

# The filters of a listing, on one table whose entry moment is {at}; a NULL parameter does not
# filter. (%(before_at)s, %(before_id)s) is the cursor: the last row of the previous page.
_BROWSE_WHERE = """
(%(queue)s::text IS NULL OR queue = %(queue)s::text)
AND (%(task)s::text IS NULL OR task = %(task)s::text)
AND (%(tags)s::text[] IS NULL OR tags @> %(tags)s::text[])
AND (%(since)s::timestamptz IS NULL OR {at} >= %(since)s::timestamptz)
AND (%(until)s::timestamptz IS NULL OR {at} < %(until)s::timestamptz)
AND (%(before_at)s::timestamptz IS NULL
     OR ({at}, id) < (%(before_at)s::timestamptz, %(before_id)s::bigint))
"""

#: Jobs of the states ``states`` (JobStatus values) matching the filters, across the three
#: tables, newest first by (at, id), at most ``limit``; without results and tracebacks. Each
#: table gives its own newest ``limit`` rows by its time index (archived_jobs by finished_at,
#: pruned to the partitions of the time window; dead_letter by failed_at, or (task, failed_at));
#: queued_jobs is the small hot table. A table no state asks for is not read.
BROWSE_JOBS = f"""
SELECT * FROM (
    (SELECT * FROM ({_BROWSE_QUEUED.format(traceback="NULL::text")}) q
     WHERE %(states)s::text[] && ARRAY['{JobStatus.READY}', '{JobStatus.SCHEDULED}',
                                       '{JobStatus.WAITING}', '{JobStatus.RUNNING}']
       AND status = ANY(%(states)s::text[])
       AND {_BROWSE_WHERE.format(at="at")}
     ORDER BY at DESC, id DESC
     LIMIT %(limit)s)
    UNION ALL
    (SELECT * FROM ({_BROWSE_ARCHIVED.format(result="NULL::jsonb", traceback="NULL::text")}
                    WHERE status = ANY(%(states)s::text[])
                      AND {_BROWSE_WHERE.format(at="finished_at")}
                    ORDER BY finished_at DESC, id DESC
                    LIMIT %(limit)s) a
     WHERE %(states)s::text[] && ARRAY['{JobStatus.SUCCEEDED}', '{JobStatus.CANCELLED}',
                                       '{JobStatus.EXPIRED}'])
    UNION ALL
    (SELECT * FROM ({_BROWSE_DEAD.format(traceback="NULL::text")}
                    WHERE {_BROWSE_WHERE.format(at="failed_at")}
                    ORDER BY failed_at DESC, id DESC
                    LIMIT %(limit)s) d
     WHERE '{JobStatus.DEAD}' = ANY(%(states)s::text[]))
) jobs
ORDER BY at DESC, id DESC
LIMIT %(limit)s
"""

#: The jobs with these ids wherever they are, in the columns of models.JobHistory (``replays``
#: included), in no particular order; an id in no table gives no row. The replays come from one
#: grouped read of the three replay_of indexes (a subquery per job would be costed so high that
#: PostgreSQL compiles the statement with JIT, which takes longer than running it).
BROWSE_JOBS_BY_ID = f"""
SELECT found.*, coalesce(r.replays, '{{}}') AS replays
FROM (
    {_BROWSE_QUEUED.format(traceback="NULL::text")} WHERE id = ANY(%(ids)s::bigint[])
    UNION ALL
    {_BROWSE_ARCHIVED.format(result="result", traceback="NULL::text")}
    WHERE id = ANY(%(ids)s::bigint[])
    UNION ALL
    {_BROWSE_DEAD.format(traceback="traceback")} WHERE id = ANY(%(ids)s::bigint[])
) found
LEFT JOIN (
    SELECT replay_of, array_agg(id ORDER BY id) AS replays
    FROM (
        SELECT id, replay_of FROM queued_jobs WHERE replay_of = ANY(%(ids)s::bigint[])
        UNION ALL
        SELECT id, replay_of FROM archived_jobs WHERE replay_of = ANY(%(ids)s::bigint[])
        UNION ALL
        SELECT id, replay_of FROM dead_letter WHERE replay_of = ANY(%(ids)s::bigint[])
    ) replay
    GROUP BY replay_of
) r ON r.replay_of = found.id
"""

#: Whether the queued job ``id`` was inserted by the current transaction (an idempotent enqueue
#: that created the job, rather than finding the one holding its key).
BROWSE_JOB_IS_NEW = """
SELECT EXISTS (
    SELECT 1 FROM queued_jobs WHERE id = %(id)s AND xmin = pg_current_xact_id()::xid
)
"""

# The dashboard's search (pgjobs.web.dashboard.search): each kind reads the three tables through
# one index each, every table LIMITed on its own, newest (highest id) first. Rows: (id,).
#   by id               the primary keys (the archive's (id, finished_at), partition by partition)
#   by idempotency key  JOB_IDS_BY_KEY above: uq_queued_jobs_idempotency_key,
#                       ix_archived_jobs_idempotency_key, ix_dead_letter_idempotency_key
#   by unique key       ix_queued_jobs_unique_key, ix_archived_jobs_unique_key,
#                       ix_dead_letter_unique_key (migration 0015)
#   by tag              the GIN indexes ix_queued_jobs_tags, ix_archived_jobs_tags,
#                       ix_dead_letter_tags (a Bitmap Index Scan; the matches are then sorted)
#   by group            ix_queued_jobs_group_sequence (group_key first), ix_archived_jobs_group_key
#                       (migration 0015), ix_dead_letter_group_key_task
# tests/integration/schema/test_search_plans.py checks each plan with sequential scans off.
_SEARCH_TABLES = ("queued_jobs", "archived_jobs", "dead_letter")


def _search(where: str) -> str:
    parts = "\n    UNION ALL\n".join(
        f"    (SELECT id FROM {table} WHERE {where} ORDER BY id DESC LIMIT %(limit)s)"
        for table in _SEARCH_TABLES
    )
    return f"SELECT id FROM (\n{parts}\n) found\nORDER BY id DESC\nLIMIT %(limit)s\n"


#: Job ``id`` wherever it is (one row), or no row.
SEARCH_BY_ID = """
SELECT id FROM queued_jobs WHERE id = %(id)s::bigint
UNION ALL
SELECT id FROM archived_jobs WHERE id = %(id)s::bigint
UNION ALL
SELECT id FROM dead_letter WHERE id = %(id)s::bigint
"""

#: The newest ``limit`` jobs enqueued with unique key ``value``, in any table.
SEARCH_BY_UNIQUE_KEY = _search("unique_key = %(value)s::text")

#: The newest ``limit`` jobs tagged ``value``, in any table (``tags IS NOT NULL`` matches the GIN
#: indexes' predicate).
SEARCH_BY_TAG = _search("tags IS NOT NULL AND tags @> ARRAY[%(value)s::text]")

#: The newest ``limit`` jobs of group ``value``, in any table.
SEARCH_BY_GROUP = _search("group_key = %(value)s::text")
