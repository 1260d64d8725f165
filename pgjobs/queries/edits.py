"""Edits of a queued job (pgjobs.editing): lock it against a claim, change its fields, record
who changed what; read a job's edits; forget the edits of jobs no table holds any more.

The fence: ``JOB_EDIT_LOCK`` takes the job's row with ``FOR UPDATE NOWAIT`` in the edit's
transaction. A claim (``FOR UPDATE SKIP LOCKED``) skips a row an edit holds, and an edit refuses
a row a claim (or anything else) holds, or that a worker has leased: of an edit and a claim that
race, exactly one wins. ``JOB_EDIT_APPLY`` runs in the same transaction, under that lock.
"""

from __future__ import annotations

from pgjobs.queries.channels import NOTIFY_CHANNEL

#: Lock queued job ``id`` for an edit, without waiting (a row another transaction holds raises
#: lock_not_available): (task, queue, whether leased, attempts, priority, run_at (NULL while it
#: waits for its dependencies: 'infinity'), whether it waits, payload, payload_version,
#: max_attempts, tags). No row when the job is not in queued_jobs.
JOB_EDIT_LOCK = """
SELECT task, queue, lease_expires_at IS NOT NULL, attempts, priority,
       CASE WHEN run_at = 'infinity' THEN NULL ELSE run_at END, run_at = 'infinity',
       payload, payload_version, max_attempts, tags
FROM queued_jobs
WHERE id = %(id)s
FOR UPDATE NOWAIT
"""

#: Lock the waiting row of job ``id`` (a job waiting for its dependencies), without waiting:
#: (the run_at it takes when they have succeeded). No row when it no longer waits.
JOB_EDIT_LOCK_WAITING = """
SELECT run_at FROM pgjobs_waiting WHERE job_id = %(id)s FOR UPDATE NOWAIT
"""

#: Change the fields of locked queued job ``id`` that are not NULL here (``set_tags``: replace
#: its tags with ``tags``, NULL for none; a new payload takes ``payload_version`` unless
#: ``keep_version``), and record the edit (``changes``: each field's old and
#: new value) as ``by`` (NULL: the database role). A waiting job's run_at stays 'infinity': the
#: new run time is kept in pgjobs_waiting for its release. Idle workers of its queue are woken.
#: Rows: (edit id, edited_at); none when the job was leased meanwhile (it cannot be: it is
#: locked).
JOB_EDIT_APPLY = f"""
WITH edited AS (
    UPDATE queued_jobs SET
        priority = coalesce(%(priority)s::smallint, priority),
        run_at = CASE WHEN %(run_at)s::timestamptz IS NULL OR run_at = 'infinity' THEN run_at
                      ELSE %(run_at)s::timestamptz END,
        payload = coalesce(%(payload)s::jsonb, payload),
        payload_version = CASE WHEN %(payload)s::jsonb IS NULL OR %(keep_version)s::boolean
                               THEN payload_version ELSE %(payload_version)s::integer END,
        max_attempts = coalesce(%(max_attempts)s::integer, max_attempts),
        tags = CASE WHEN %(set_tags)s::boolean THEN %(tags)s::text[] ELSE tags END
    WHERE id = %(id)s AND lease_expires_at IS NULL
    RETURNING id, queue
),
rewaited AS (
    UPDATE pgjobs_waiting w SET run_at = %(run_at)s::timestamptz
    FROM edited WHERE w.job_id = edited.id AND %(run_at)s::timestamptz IS NOT NULL
),
recorded AS (
    INSERT INTO pgjobs_job_edits (job_id, edited_by, changes)
    SELECT id, coalesce(%(by)s::text, current_user), %(changes)s::jsonb FROM edited
    RETURNING id, edited_at
)
SELECT recorded.id, recorded.edited_at FROM recorded, edited,
       pg_notify('{NOTIFY_CHANNEL}', edited.queue)
"""

#: The edits of job ``id``, oldest first: (edit id, edited_at, edited_by, changes).
JOB_EDITS_OF = """
SELECT id, edited_at, edited_by, changes FROM pgjobs_job_edits
WHERE job_id = %(id)s
ORDER BY id
"""

#: Delete the edits of the jobs in none of the three tables (purged, pruned): their record goes
#: with them. Rows: (deleted). Each probe is an index lookup by id in each table.
JOB_EDITS_FORGET_GONE = """
WITH gone AS (
    DELETE FROM pgjobs_job_edits e
    WHERE NOT EXISTS (SELECT 1 FROM queued_jobs q WHERE q.id = e.job_id)
      AND NOT EXISTS (SELECT 1 FROM archived_jobs a WHERE a.id = e.job_id)
      AND NOT EXISTS (SELECT 1 FROM dead_letter d WHERE d.id = e.job_id)
    RETURNING 1
)
SELECT count(*) FROM gone
"""
