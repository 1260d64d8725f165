"""One job by id: look it up, cancel it, replay it, find it by key, read its result."""

from __future__ import annotations

from pgjobs.models import ArchivedStatus, JobStatus
from pgjobs.queries.channels import CANCEL_NOTICE, NOTIFY_CHANNEL
from pgjobs.queries.columns import _MOVED_COLUMNS, _NEXT_JOB_ID_SEQ
from pgjobs.queries.dead import _GROUPS_TOUCHED, _KEY_IF_FREE, _requeue

# A row of queued_jobs as JOB_LOOKUP finds it, up to its replays: the columns of
# models.JobHistory, with the job's status now.
_QUEUED_AS_FOUND = f"""id, 'queued_jobs' AS home,
           CASE WHEN lease_expires_at IS NOT NULL THEN '{JobStatus.RUNNING}'
                WHEN run_at = 'infinity' THEN '{JobStatus.WAITING}'
                WHEN run_at > now() THEN '{JobStatus.SCHEDULED}'
                ELSE '{JobStatus.READY}' END AS status,
           queue, task, payload, priority, run_at, attempts, max_attempts, created_at,
           expires_at, idempotency_key, last_error, lease_owner, lease_expires_at,
           NULL::jsonb AS result, NULL::text AS worker, NULL::timestamptz AS finished_at,
           NULL::text AS reason, NULL::text AS error_type, NULL::text AS traceback,
           redrive_count, redriven_at, replay_of, started_at, group_key, unique_key,
           snoozes, progress, tags"""

#: A job wherever it lives, in the order of models.JobHistory (status as text, replays as an
#: array); no row when the id is in none of the three tables.
JOB_LOOKUP = f"""
WITH found AS (
    SELECT {_QUEUED_AS_FOUND}
    FROM queued_jobs WHERE id = %(id)s
    UNION ALL
    SELECT id, 'archived_jobs', status,
           queue, task, payload, priority, run_at, attempts, max_attempts, created_at,
           expires_at, idempotency_key, last_error, NULL, NULL,
           result, worker, finished_at,
           NULL, NULL, NULL,
           redrive_count, redriven_at, replay_of, started_at, group_key, unique_key,
           snoozes, progress, tags
    FROM archived_jobs WHERE id = %(id)s
    UNION ALL
    SELECT id, 'dead_letter', '{JobStatus.DEAD}',
           queue, task, payload, priority, run_at, attempts, max_attempts, created_at,
           expires_at, idempotency_key, last_error, NULL, NULL,
           NULL, worker, failed_at,
           reason, error_type, traceback,
           redrive_count, redriven_at, replay_of, started_at, group_key, unique_key,
           snoozes, progress, tags
    FROM dead_letter WHERE id = %(id)s
)
SELECT found.*, ARRAY(
    SELECT id FROM queued_jobs WHERE replay_of = %(id)s
    UNION ALL SELECT id FROM archived_jobs WHERE replay_of = %(id)s
    UNION ALL SELECT id FROM dead_letter WHERE replay_of = %(id)s
    ORDER BY 1
)
FROM found
"""

#: Archive a queued job as cancelled, unrun; a running (leased) one only when ``force``: its
#: worker is told (``CANCEL_NOTICE``) to stop the handler, whose outcome the fence discards
#: anyway, and a running job of a group keeps its place in the group (pgjobs_group_holds) until
#: the handler has ended or the lease runs out. Returns (id, lease owner) when cancelled.
JOB_CANCEL = f"""
WITH target AS (
    SELECT id FROM queued_jobs
    WHERE id = %(id)s AND (lease_expires_at IS NULL OR %(force)s::boolean)
    FOR UPDATE
),
gone AS (
    DELETE FROM queued_jobs q USING target WHERE q.id = target.id
    RETURNING q.*
),
archived AS (
    INSERT INTO archived_jobs ({_MOVED_COLUMNS}, status, last_error, worker)
    SELECT {_MOVED_COLUMNS}, '{ArchivedStatus.CANCELLED}', last_error, lease_owner FROM gone
    RETURNING id, worker, attempts
),
-- A running job of a group keeps its place there while its handler may still run: until its
-- worker ends the attempt's lease (JOB_EXTEND_LEASES) or the lease runs out.
held AS (
    INSERT INTO pgjobs_group_holds
        (job_id, queue, task, group_key, attempts, lease_owner, lease_expires_at)
    SELECT id, queue, task, group_key, attempts, lease_owner, lease_expires_at FROM gone
    WHERE group_key IS NOT NULL AND lease_expires_at > now()
    ON CONFLICT (job_id) DO NOTHING
),
-- A running job's worker learns at commit that the attempt it runs was cancelled.
notified AS (
    SELECT count(pg_notify('{NOTIFY_CHANNEL}', '{CANCEL_NOTICE}' || id || chr(9) || attempts))
    FROM archived WHERE worker IS NOT NULL
)
SELECT id, worker FROM archived, notified
"""

#: The lease of a job, locked until the transaction ends, for an outcome reported from outside
#: a worker (external tasks): (attempts, max_attempts, lease owner, whether the lease is live,
#: task, the attempt claimed for delivery to a downstream). No row when the job is not in
#: queued_jobs.
JOB_LEASE_HOLDER = """
SELECT attempts, max_attempts, lease_owner, lease_expires_at > now(), task, external_attempt
FROM queued_jobs
WHERE id = %(id)s
FOR UPDATE
"""

_REPLAYED_COLUMNS = (
    "id, queue, task, payload, priority, max_attempts, expires_at, replay_of, payload_version, "
    "group_key, unique_key, tags"
)

#: Enqueue a finished (archived) or dead job again as a new job linked by replay_of: same queue,
#: task, payload (and its version), priority, max_attempts and group; no idempotency key; its
#: unique key when no job of the task not started yet holds it (_KEY_IF_FREE); ready now.
#: Its expiry is the one given (``expires_at``, else ``expires_in`` seconds from now); with none,
#: the copy of an expired job keeps the original's expiry, long passed, and any other copy never
#: expires. A copy whose expiry has passed is archived at once as expired, unrun (never queued);
#: any other wakes idle workers of its queue and touches its group's row. Rows: (new id, whether
#: it was archived as expired); none when the id is neither archived nor dead.
JOB_REPLAY = f"""
WITH original AS (
    SELECT id, queue, task, payload, priority, max_attempts, payload_version, group_key,
           unique_key, tags,
           CASE WHEN status = '{ArchivedStatus.EXPIRED}' THEN coalesce(expires_at, now()) END
               AS lapsed_at
    FROM archived_jobs WHERE id = %(id)s
    UNION ALL
    SELECT id, queue, task, payload, priority, max_attempts, payload_version, group_key,
           unique_key, tags, NULL
    FROM dead_letter WHERE id = %(id)s
),
made AS MATERIALIZED (
    SELECT nextval({_NEXT_JOB_ID_SEQ}) AS new_id, o.*,
           coalesce(%(expires_at)s::timestamptz,
                    now() + %(expires_in)s::float8 * interval '1 second',
                    o.lapsed_at) AS expiry
    FROM original o
),
copy AS (
    SELECT new_id AS id, queue, task, payload, priority, max_attempts, expiry AS expires_at,
           id AS replay_of, payload_version, group_key,
           {_KEY_IF_FREE.format(rows="made")} AS unique_key, tags
    FROM made WHERE expiry IS NULL OR expiry > now()
),
{_requeue(_REPLAYED_COLUMNS, "copy")},
queued AS (
    SELECT * FROM keyed UNION ALL SELECT * FROM unkeyed
),
grouped AS ({_GROUPS_TOUCHED.format(rows="copy")}),
expired AS (
    INSERT INTO archived_jobs (id, queue, task, payload, priority, run_at, attempts, max_attempts,
                               status, created_at, expires_at, replay_of, payload_version,
                               group_key, unique_key, tags)
    SELECT new_id, queue, task, payload, priority, now(), 0, max_attempts,
           '{ArchivedStatus.EXPIRED}', now(), expiry, id, payload_version, group_key, unique_key,
           tags
    FROM made WHERE expiry <= now()
    RETURNING id
)
SELECT id, false FROM queued, pg_notify('{NOTIFY_CHANNEL}', queue)
UNION ALL
SELECT id, true FROM expired
"""

#: The jobs holding the idempotency key ``key`` in any table, newest first, at most ``limit``:
#: (id). A key is unique among queued jobs only; the archive and dead letters may hold several.
JOB_IDS_BY_KEY = """
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

#: Where job ``id`` is and how it ended: (table, status, result, reason, error_type,
#: last_error); no row when the id is in no table. One snapshot: a job moving meanwhile is
#: found in exactly one of them.
RESULT_LOOKUP = f"""
SELECT 'archived_jobs', status, result, NULL::text, NULL::text, NULL::text
FROM archived_jobs WHERE id = %(id)s
UNION ALL
SELECT 'dead_letter', '{JobStatus.DEAD}', NULL::jsonb, reason, error_type, last_error
FROM dead_letter WHERE id = %(id)s
UNION ALL
SELECT 'queued_jobs', NULL::text, NULL::jsonb, NULL::text, NULL::text, NULL::text
FROM queued_jobs WHERE id = %(id)s
"""

#: Which of the jobs ``ids`` have ended (are in archived_jobs or dead_letter): the one batched
#: re-check of every pending waiter.
RESULT_ENDED = """
SELECT id FROM archived_jobs WHERE id = ANY(%(ids)s::bigint[])
UNION ALL
SELECT id FROM dead_letter WHERE id = ANY(%(ids)s::bigint[])
"""
