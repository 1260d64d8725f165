"""Statements of the test helpers (pgjobs.testing): throwaway databases, empty tables, a moved
clock.
"""

from __future__ import annotations

from pgjobs.queries.columns import JOB_COLUMNS

#: Create an empty throwaway database {database} (compose with psycopg.sql).
TESTING_CREATE_DATABASE = "CREATE DATABASE {database}"

#: Drop the throwaway database {database}, ending the sessions still connected to it.
TESTING_DROP_DATABASE = "DROP DATABASE IF EXISTS {database} WITH (FORCE)"

#: Empty pgjobs' {tables} between two tests (compose with psycopg.sql; pgjobs.testing names
#: every table of pgjobs.schema): no job, worker, queue setting (a pause or a limit left by one
#: test would hold the next one's jobs back), limit state or schedule is left over.
TESTING_EMPTY_TABLES = "TRUNCATE {tables} RESTART IDENTITY"

#: Every job in queued_jobs (ready, scheduled or running), oldest first, as models.Job.
TESTING_QUEUED_JOBS = f"SELECT {JOB_COLUMNS} FROM queued_jobs ORDER BY id"

#: Advance the clock of the scheduled jobs of ``queues`` to the next moment one is due (not past
#: ``until``, when given): the jobs due then become ready now, as if now were their run_at; their
#: expires_at moves back by as much. Jobs being run are not touched, nor jobs waiting for their
#: dependencies (run_at 'infinity': only the trigger releases them). Returns the ids moved (none
#: when no job is due by ``until``).
TESTING_ADVANCE_CLOCK = """
WITH next AS (
    SELECT min(run_at) AS run_at FROM queued_jobs
    WHERE queue = ANY(%(queues)s::text[]) AND lease_expires_at IS NULL AND run_at > now()
      AND run_at <> 'infinity'
),
due AS (
    SELECT q.id FROM queued_jobs q, next
    WHERE q.queue = ANY(%(queues)s::text[]) AND q.lease_expires_at IS NULL
      AND q.run_at > now() AND q.run_at <> 'infinity'
      AND q.run_at <= next.run_at
      AND (%(until)s::timestamptz IS NULL OR q.run_at <= %(until)s::timestamptz)
    FOR UPDATE OF q SKIP LOCKED
)
UPDATE queued_jobs q
SET expires_at = q.expires_at - (q.run_at - now()),
    run_at = now()
FROM due
WHERE q.id = due.id
RETURNING q.id
"""
