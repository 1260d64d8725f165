"""The archive's daily partitions: create, detach, drop, and the default partition's rows."""

from __future__ import annotations

#: Give the prune lock back.
ARCHIVE_PRUNE_UNLOCK = "SELECT pg_advisory_unlock(%(key)s)"

#: When the oldest archived job finished (NULL when the archive is empty), and now(): how much
#: history the archive holds (`pgjobs doctor`). Each partition's ix_archived_jobs_finished_at
#: answers its min() with one index probe.
ARCHIVE_OLDEST = "SELECT min(finished_at), now() FROM archived_jobs"

#: Today as a UTC date, whether archived_jobs is partitioned (False before migration 0004), and
#: the database's now().
ARCHIVE_STATE = """
SELECT (now() AT TIME ZONE 'UTC')::date,
       EXISTS (SELECT 1 FROM pg_partitioned_table
               WHERE partrelid = to_regclass('archived_jobs')),
       now()
"""

#: The partitions of archived_jobs, oldest first, the DEFAULT partition last. Rows: (name,
#: lower bound or NULL for MINVALUE, upper bound or NULL for DEFAULT, is default, detach pending,
#: estimated rows or NULL when never analysed, total bytes with indexes and TOAST).
ARCHIVE_PARTITIONS = """
SELECT c.relname::text,
       CASE WHEN m.bounds[1] = 'MINVALUE' THEN NULL
            ELSE trim(BOTH '''' FROM m.bounds[1])::timestamptz END,
       trim(BOTH '''' FROM m.bounds[2])::timestamptz,
       b.expr = 'DEFAULT',
       i.inhdetachpending,
       CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint END,
       pg_total_relation_size(c.oid)
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS expr) b
LEFT JOIN LATERAL (
    SELECT regexp_match(b.expr, 'FROM \\((.+)\\) TO \\((.+)\\)') AS bounds
) m ON true
WHERE i.inhparent = to_regclass('archived_jobs')
ORDER BY b.expr = 'DEFAULT', 3 NULLS FIRST
"""

#: Create one partition of archived_jobs for [lower, upper); compose {partition}, {lower} and
#: {upper} with psycopg.sql. Takes an ACCESS EXCLUSIVE lock on archived_jobs for a moment.
ARCHIVE_PARTITION_CREATE = """
CREATE TABLE IF NOT EXISTS {partition} PARTITION OF archived_jobs
    FOR VALUES FROM ({lower}) TO ({upper})
"""

#: The UTC days of the rows in the DEFAULT partition {default}, oldest first, at most ``limit``.
ARCHIVE_DEFAULT_DAYS = """
SELECT DISTINCT (finished_at AT TIME ZONE 'UTC')::date AS day
FROM {default}
ORDER BY day
LIMIT %(limit)s
"""

#: Keep writers out of the DEFAULT partition {default} until the end of the transaction.
ARCHIVE_DEFAULT_LOCK = "LOCK TABLE {default} IN SHARE ROW EXCLUSIVE MODE"

#: Take the rows of [lower, upper) out of the DEFAULT partition {default} into a temporary table
#: (dropped at commit), so that a partition for that range can be created.
ARCHIVE_DEFAULT_STAGE = """
CREATE TEMP TABLE pgjobs_moving ON COMMIT DROP AS
WITH moved AS (
    DELETE FROM {default} WHERE finished_at >= {lower} AND finished_at < {upper}
    RETURNING *
)
SELECT * FROM moved
"""

#: Put the rows staged by ARCHIVE_DEFAULT_STAGE back, into the partition just created.
ARCHIVE_DEFAULT_UNSTAGE = "INSERT INTO archived_jobs SELECT * FROM pgjobs_moving"

#: Rows of the DEFAULT partition {default} that finished before ``cutoff``.
ARCHIVE_DEFAULT_COUNT_OLDER = "SELECT count(*) FROM {default} WHERE finished_at < %(cutoff)s"

#: Exact number of rows in one partition {partition}.
ARCHIVE_PARTITION_COUNT = "SELECT count(*) FROM ONLY {partition}"

#: Copy one partition {partition} out, as CSV with a header line ({options}: the COPY options).
ARCHIVE_PARTITION_COPY_OUT = "COPY {partition} TO STDOUT ({options})"

#: Detach one partition {partition} (ACCESS EXCLUSIVE on archived_jobs for a moment; the only
#: way while a DEFAULT partition exists).
ARCHIVE_PARTITION_DETACH = "ALTER TABLE archived_jobs DETACH PARTITION {partition}"

#: Detach one partition {partition} without blocking readers and writers of archived_jobs
#: (PostgreSQL 14+, outside a transaction, impossible while a DEFAULT partition exists).
ARCHIVE_PARTITION_DETACH_CONCURRENTLY = (
    "ALTER TABLE archived_jobs DETACH PARTITION {partition} CONCURRENTLY"
)

#: Complete a concurrent detach of {partition} that was interrupted.
ARCHIVE_PARTITION_DETACH_FINALIZE = (
    "ALTER TABLE archived_jobs DETACH PARTITION {partition} FINALIZE"
)

#: Drop a detached partition {partition}.
ARCHIVE_PARTITION_DROP = "DROP TABLE IF EXISTS {partition}"
