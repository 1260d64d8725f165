"""The background services' statements: lease rescue, lapsed limits, expiry, and the locks
migrations and retention take.
"""

from __future__ import annotations

from pgjobs.models import ArchivedStatus, DeadReason
from pgjobs.queries.columns import _INTO_DEAD, _MOVED_COLUMNS
from pgjobs.queries.outcomes import _ends_locked

#: Rescue up to ``limit`` jobs whose lease expired: back to ready, or to dead_letter when that
#: was their last attempt or their task is at-most-once. Returns (requeued, dead). The rows the
#: ends change are locked first, in the settles' order (``_ends_locked``).
JOB_RESCUE_EXPIRED_LEASES = f"""
WITH lost AS (
    SELECT id FROM queued_jobs
    WHERE lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
exhausted AS (
    DELETE FROM queued_jobs q USING lost
    WHERE q.id = lost.id AND (q.attempts >= q.max_attempts OR q.at_most_once)
    RETURNING q.*
),
{_ends_locked("SELECT id, watched, batch_id, redrive_count FROM exhausted")},
buried AS (
    INSERT INTO dead_letter ({_MOVED_COLUMNS}, reason, last_error, worker)
    SELECT {_INTO_DEAD}, '{DeadReason.LEASE_EXPIRED}',
           format('lease of worker %%s expired on attempt %%s of %%s%%s',
                  lease_owner, attempts, max_attempts,
                  CASE WHEN at_most_once THEN ' (at-most-once task: not run again)' ELSE '' END),
           lease_owner
    FROM exhausted
    WHERE (SELECT n FROM ends_locked) >= 0
    RETURNING id
),
requeued AS (
    UPDATE queued_jobs q
    SET lease_owner = NULL,
        lease_expires_at = NULL,
        last_error = format('lease of worker %%s expired on attempt %%s of %%s',
                            q.lease_owner, q.attempts, q.max_attempts)
    FROM lost
    WHERE q.id = lost.id AND q.attempts < q.max_attempts AND NOT q.at_most_once
    RETURNING q.id
)
SELECT (SELECT count(*) FROM requeued), (SELECT count(*) FROM buried)
"""

#: Give back to their queue's claim range up to ``limit`` ready jobs of ``queues`` held back for
#: the limit of one of ``tasks`` (tasks the calling worker runs without a limit). Returns their
#: ids.
JOB_RELEASE_LAPSED_LIMITS = """
UPDATE queued_jobs
SET limit_key = NULL
WHERE id = ANY(ARRAY(
    SELECT id FROM queued_jobs
    WHERE queue = ANY(%(queues)s::text[]) AND limit_key = ANY(%(tasks)s::text[])
      AND lease_expires_at IS NULL
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
))
RETURNING id
"""

#: Archive up to ``limit`` unleased jobs whose expires_at has passed, as expired, unrun; the rows
#: the ends change locked first, in the settles' order (``_ends_locked``).
JOB_EXPIRE_MANY = f"""
WITH gone AS (
    DELETE FROM queued_jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM queued_jobs
        WHERE expires_at <= now() AND lease_expires_at IS NULL
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING *
),
{_ends_locked("SELECT id, watched, batch_id, redrive_count FROM gone")},
archived AS (
    INSERT INTO archived_jobs ({_MOVED_COLUMNS}, status, last_error)
    SELECT {_MOVED_COLUMNS}, '{ArchivedStatus.EXPIRED}', last_error FROM gone
    WHERE (SELECT n FROM ends_locked) >= 0
    RETURNING id
)
SELECT count(*) FROM archived
"""

#: The revision of pgjobs' schema in this database (fails with UndefinedTable when never migrated).
SCHEMA_REVISION = "SELECT version_num FROM pgjobs_alembic_version"

#: Key of the transaction-level advisory lock held around DDL on archived_jobs' partitions
#: (creating, detaching, dropping), so that workers and `pgjobs prune` take turns.
ARCHIVE_DDL_LOCK_KEY = 7_106_873_430_001

#: Key of the session-level advisory lock of `pgjobs prune`: one prune at a time per database.
ARCHIVE_PRUNE_LOCK_KEY = 7_106_873_430_002

#: Key of the session-level advisory lock of `pgjobs migrate`: one migration at a time, so a
#: second one waits, then finds the schema already at head.
MIGRATION_LOCK_KEY = 7_106_873_430_003

#: Take the turn to migrate if no other session holds it. Rows: (taken). Released by
#: MIGRATION_UNLOCK or disconnecting. Polled, never waited for in a statement: a waiting statement
#: holds a snapshot, which CREATE INDEX CONCURRENTLY in the running migration would wait for.
MIGRATION_TRY_LOCK = "SELECT pg_try_advisory_lock(%(key)s)"

#: Give the turn to migrate back.
MIGRATION_UNLOCK = "SELECT pg_advisory_unlock(%(key)s)"

#: Bound lock waits for the rest of the transaction (value: a PostgreSQL duration, e.g. '5s').
LOCK_TIMEOUT_LOCAL = "SELECT set_config('lock_timeout', %(timeout)s, true)"

#: Bound lock waits for the rest of the session.
LOCK_TIMEOUT_SESSION = "SELECT set_config('lock_timeout', %(timeout)s, false)"

#: Wait (within lock_timeout) for the turn to change archived_jobs' partitions.
ARCHIVE_DDL_LOCK = "SELECT pg_advisory_xact_lock(%(key)s)"

#: Take the prune lock if no other session holds it. Rows: (taken).
ARCHIVE_PRUNE_TRY_LOCK = "SELECT pg_try_advisory_lock(%(key)s)"

#: The database's clock (the dashboard shows ages against it, not the web server's).
DATABASE_NOW = "SELECT now()"
