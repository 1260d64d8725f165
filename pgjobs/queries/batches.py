"""Batches: their row, their members, their counts and status."""

from __future__ import annotations

from pgjobs.models import JobStatus
from pgjobs.queries.channels import NOTIFY_CHANNEL

#: One page of batches, newest first, before batch ``before`` (NULL: from the newest): a keyset
#: on the primary key (Index Scan Backward of pgjobs_batches_pkey, stopped at the LIMIT). Rows:
#: batches.BatchStatus's columns but its members' counts.
BATCHES_PAGE = """
SELECT id, total, pending, succeeded, dead, cancelled, created_at, completed_at,
       callback_task, callback_queue, callback_job_id
FROM pgjobs_batches
WHERE id < coalesce(%(before)s::bigint, 9223372036854775807)
ORDER BY id DESC
LIMIT %(limit)s
"""

# A batch is written in one transaction: its row (BATCH_INSERT), its members (the statements of
# queries/enqueue.py and DEPENDENCY_INSERT, with the batch's id), then BATCH_SEAL. The trigger
# pgjobs_job_ended counts each member's first end and enqueues the callback once (migration 0013).
#: The batch's counts and its callback as a JSON object: the "batch" key of the callback's payload.
_BATCH_COUNTS = """jsonb_build_object(
    'id', b.id, 'total', b.total, 'succeeded', b.succeeded, 'dead', b.dead,
    'cancelled', b.cancelled)"""

#: Create a batch, members not counted yet (BATCH_SEAL counts them), with its callback (NULL task:
#: none). Rows: (id,).
BATCH_INSERT = """
INSERT INTO pgjobs_batches (total, pending, callback_task, callback_queue, callback_payload,
                            callback_priority, callback_max_attempts, callback_payload_version)
VALUES (0, 0, %(task)s, %(queue)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s,
        %(payload_version)s)
RETURNING id
"""

#: Count batch ``id``'s members (the jobs its inserts wrote, not the holders of keys they met) as
#: its total and pending; a batch with none is complete at once, its callback enqueued now with
#: counts of 0 (as the trigger would: its id reserved first, to be named by the batch's row).
#: Rows: (total, callback job id).
BATCH_SEAL = f"""
WITH members AS (
    SELECT count(*)::int AS n FROM queued_jobs WHERE batch_id = %(id)s
),
sealed AS (
    UPDATE pgjobs_batches b
    SET total = m.n, pending = m.n,
        completed_at = CASE WHEN m.n = 0 THEN now() END,
        callback_job_id = CASE WHEN m.n = 0 AND b.callback_task IS NOT NULL
                               THEN nextval(pg_get_serial_sequence('queued_jobs', 'id')) END
    FROM members m
    WHERE b.id = %(id)s
    RETURNING b.*
),
callback AS (
    INSERT INTO queued_jobs (id, queue, task, payload, priority, max_attempts, payload_version)
    SELECT b.callback_job_id, b.callback_queue, b.callback_task,
           b.callback_payload || jsonb_build_object('batch', {_BATCH_COUNTS}),
           b.callback_priority, b.callback_max_attempts, b.callback_payload_version
    FROM sealed b
    WHERE b.callback_job_id IS NOT NULL
    RETURNING id, queue
),
notified AS (
    SELECT count(pg_notify('{NOTIFY_CHANNEL}', queue)) AS n FROM callback
)
SELECT s.total, (SELECT id FROM callback)
FROM sealed s CROSS JOIN notified
"""

#: Batch ``id`` in the order of batches.BatchStatus, then its members' count per status as a JSON
#: object, read from the three tables through their batch_id indexes. No row: no such batch.
BATCH_STATUS = f"""
SELECT b.id, b.total, b.pending, b.succeeded, b.dead, b.cancelled, b.created_at, b.completed_at,
       b.callback_task, b.callback_queue, b.callback_job_id,
       (SELECT coalesce(jsonb_object_agg(m.status, m.n), '{{}}') FROM (
            SELECT status, count(*) AS n FROM (
                SELECT CASE WHEN run_at = 'infinity' THEN '{JobStatus.WAITING}'
                            WHEN lease_expires_at IS NOT NULL THEN '{JobStatus.RUNNING}'
                            WHEN run_at > now() THEN '{JobStatus.SCHEDULED}'
                            ELSE '{JobStatus.READY}' END AS status
                FROM queued_jobs WHERE batch_id = b.id
                UNION ALL
                SELECT status FROM archived_jobs WHERE batch_id = b.id
                UNION ALL
                SELECT '{JobStatus.DEAD}' FROM dead_letter WHERE batch_id = b.id
            ) s GROUP BY status
        ) m)
FROM pgjobs_batches b
WHERE b.id = %(id)s
"""

#: Up to ``limit`` member ids of batch ``id`` per status, lowest first, as a JSON object of
#: arrays (the batch page's links).
BATCH_MEMBERS = f"""
SELECT coalesce(jsonb_object_agg(status, ids), '{{}}') FROM (
    SELECT status, (array_agg(id ORDER BY id))[1:%(limit)s] AS ids FROM (
        SELECT id, CASE WHEN run_at = 'infinity' THEN '{JobStatus.WAITING}'
                        WHEN lease_expires_at IS NOT NULL THEN '{JobStatus.RUNNING}'
                        WHEN run_at > now() THEN '{JobStatus.SCHEDULED}'
                        ELSE '{JobStatus.READY}' END AS status
        FROM queued_jobs WHERE batch_id = %(id)s
        UNION ALL
        SELECT id, status FROM archived_jobs WHERE batch_id = %(id)s
        UNION ALL
        SELECT id, '{JobStatus.DEAD}' FROM dead_letter WHERE batch_id = %(id)s
    ) s GROUP BY status
) m
"""

#: The batch job ``id`` is a member of, wherever the job is. Rows: (batch_id,) or none.
BATCH_OF_JOB = """
SELECT batch_id FROM queued_jobs WHERE id = %(id)s AND batch_id IS NOT NULL
UNION ALL
SELECT batch_id FROM archived_jobs WHERE id = %(id)s AND batch_id IS NOT NULL
UNION ALL
SELECT batch_id FROM dead_letter WHERE id = %(id)s AND batch_id IS NOT NULL
LIMIT 1
"""

#: One page of batch ``id``'s members in id order after member ``after`` (0: from the first): at
#: most ``limit`` of them, and fewer when their results add up to more than ``bytes`` bytes of
#: JSON text (the first always comes). Each table's members through its batch_id index, merged.
#: Rows: (id, task, table, status, result, reason, error_type, last_error, kept); the last row
#: has kept = false, and no result, when more members follow (the page's end).
BATCH_RESULTS_PAGE = f"""
WITH page AS (
    SELECT * FROM (
        (SELECT id, task, 'queued_jobs' AS home,
                CASE WHEN run_at = 'infinity' THEN '{JobStatus.WAITING}'
                     WHEN lease_expires_at IS NOT NULL THEN '{JobStatus.RUNNING}'
                     WHEN run_at > now() THEN '{JobStatus.SCHEDULED}'
                     ELSE '{JobStatus.READY}' END AS status,
                NULL::jsonb AS result, NULL::text AS reason, NULL::text AS error_type,
                last_error
         FROM queued_jobs WHERE batch_id = %(id)s AND id > %(after)s
         ORDER BY id LIMIT %(limit)s + 1)
        UNION ALL
        (SELECT id, task, 'archived_jobs', status, result, NULL, NULL, last_error
         FROM archived_jobs WHERE batch_id = %(id)s AND id > %(after)s
         ORDER BY id LIMIT %(limit)s + 1)
        UNION ALL
        (SELECT id, task, 'dead_letter', '{JobStatus.DEAD}', NULL, reason, error_type, last_error
         FROM dead_letter WHERE batch_id = %(id)s AND id > %(after)s
         ORDER BY id LIMIT %(limit)s + 1)
    ) m
    ORDER BY id
    LIMIT %(limit)s + 1
),
sized AS (
    SELECT p.*, row_number() OVER w AS n,
           coalesce(sum(octet_length(p.result::text)) OVER w, 0)
               - coalesce(octet_length(p.result::text), 0) AS before
    FROM page p
    WINDOW w AS (ORDER BY id ROWS UNBOUNDED PRECEDING)
),
marked AS (
    SELECT s.*, (n <= %(limit)s AND (n = 1 OR before < %(bytes)s)) AS kept FROM sized s
)
SELECT id, task, home, status, CASE WHEN kept THEN result END, reason, error_type, last_error,
       kept
FROM marked
WHERE kept OR n = (SELECT min(n) FROM marked WHERE NOT kept)
ORDER BY id
"""

#: Whether batch ``id`` exists, and the job its callback is (NULL: none yet). Rows: one, or none.
BATCH_CALLBACK = "SELECT callback_job_id FROM pgjobs_batches WHERE id = %(id)s"
