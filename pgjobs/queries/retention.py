"""Retention: one service at a time across the fleet, and the batched deletes (and exports) of rows
older than their period.
"""

from __future__ import annotations

#: Key of the session-level advisory lock of the retention service: one round at a time across
#: all the workers of a database.
RETENTION_LOCK_KEY = 7_106_873_430_004

#: Take the retention service's turn if no other session holds it. Rows: (taken).
RETENTION_TRY_LOCK = "SELECT pg_try_advisory_lock(%(key)s)"

#: Give the retention service's turn back.
RETENTION_UNLOCK = "SELECT pg_advisory_unlock(%(key)s)"

#: Delete at most ``limit`` rows of {table} (archived_jobs, its DEFAULT partition or
#: dead_letter) whose {at} (finished_at or failed_at) is before ``cutoff``, of the queues in
#: ``queues`` (NULL: any queue) and none in ``kept`` (the queues with periods of their own),
#: oldest first; rows another session holds are left for the next batch. RETURNING every column,
#: so that wrapped in ``COPY (...) TO STDOUT`` the rows are exported as they go. Compose {table}
#: and {at} with psycopg.sql.
RETENTION_DELETE_OLDER = """
DELETE FROM {table}
WHERE (id, {at}) IN (
    SELECT id, {at} FROM {table}
    WHERE {at} < %(cutoff)s
      AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
      AND queue <> ALL(%(kept)s::text[])
    ORDER BY {at}
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING *
"""

#: RETENTION_DELETE_OLDER as {delete}, counted. Rows: (deleted).
RETENTION_DELETE_COUNT = "WITH gone AS ({delete}) SELECT count(*) FROM gone"

#: RETENTION_DELETE_OLDER as {delete}, its rows copied out ({options}: the COPY options).
RETENTION_DELETE_COPY_OUT = "COPY ({delete}) TO STDOUT ({options})"
