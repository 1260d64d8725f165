"""Events sent to workflows: the mailbox a workflow's ``ctx.wait_for`` reads, and what wakes a
workflow that waits.

Sending and waiting both lock the workflow's row in ``queued_jobs`` first (``FOR UPDATE``), so
one of them always sees the other: an event sent before the wait is found by it, and a wait
registered before the event is woken by it.
"""

from __future__ import annotations

from pgjobs.queries.channels import NOTIFY_CHANNEL

#: Lock the job an event is sent to, named by id or by idempotency key (one of the two NULL):
#: its id, queue and whether a lease holds it; no row when it is not in queued_jobs.
EVENT_LOCK_TARGET = """
SELECT id, queue, lease_expires_at IS NOT NULL AS running
FROM queued_jobs
WHERE (id = %(id)s OR idempotency_key = %(key)s)
FOR UPDATE
"""

#: Where the named job is if not in queued_jobs (its home table), for the refusal's words.
EVENT_TARGET_ENDED = """
SELECT 'archived_jobs' AS home, status FROM archived_jobs
WHERE id = %(id)s OR idempotency_key = %(key)s
UNION ALL
SELECT 'dead_letter', 'dead' FROM dead_letter WHERE id = %(id)s OR idempotency_key = %(key)s
LIMIT 1
"""

#: Put one event in the job's mailbox; returns its id and when it was sent.
EVENT_INSERT = """
INSERT INTO pgjobs_events (job_id, name, payload)
VALUES (%(job_id)s, %(name)s, %(payload)s::jsonb)
RETURNING id, sent_at
"""

#: Wake the job if it waits for this event and no lease holds it: it becomes ready now, and the
#: queue's idle workers are told at the commit, as for a new job. Returns a row when it woke.
EVENT_WAKE = f"""
UPDATE queued_jobs q SET run_at = now()
FROM pgjobs_event_waits w
WHERE q.id = %(job_id)s AND w.job_id = q.id AND w.name = %(name)s
  AND q.lease_expires_at IS NULL AND q.run_at > now()
RETURNING pg_notify('{NOTIFY_CHANNEL}', q.queue)
"""

#: Lock the waiting workflow's own row, fenced by its lease: no row when this attempt no longer
#: holds the job (the wait then changes nothing).
EVENT_LOCK_OWN = """
SELECT 1 FROM queued_jobs
WHERE id = %(job_id)s AND lease_owner = %(worker)s AND attempts = %(attempt)s
FOR UPDATE
"""

#: Take the oldest event of this name in the job's mailbox (it leaves the mailbox; the
#: workflow's history keeps its payload); no row when none was sent.
EVENT_TAKE = """
DELETE FROM pgjobs_events
WHERE id = (SELECT id FROM pgjobs_events
            WHERE job_id = %(job_id)s AND name = %(name)s
            ORDER BY id LIMIT 1)
RETURNING payload, sent_at
"""

#: Register that the job waits for the event until ``deadline`` (a second wait for the same
#: name moves the deadline).
EVENT_WAIT_REGISTER = """
INSERT INTO pgjobs_event_waits (job_id, name, deadline)
VALUES (%(job_id)s, %(name)s, %(deadline)s)
ON CONFLICT (job_id, name) DO UPDATE SET deadline = EXCLUDED.deadline, since = now()
"""

#: Give a waiting workflow's slot back from its own transaction: the job returns to the queue
#: until ``until`` (the wait's deadline) with its attempt refunded, fenced by its lease; no row
#: when this attempt no longer holds it.
EVENT_SUSPEND = """
UPDATE queued_jobs
SET run_at = %(until)s, attempts = attempts - 1, lease_owner = NULL, lease_expires_at = NULL
WHERE id = %(job_id)s AND lease_owner = %(worker)s AND attempts = %(attempt)s
RETURNING id
"""

#: The job stops waiting for the event (it came, or the wait timed out).
EVENT_WAIT_END = "DELETE FROM pgjobs_event_waits WHERE job_id = %(job_id)s AND name = %(name)s"

#: The events waiting in a job's mailbox and the waits it registered (for ``job show``).
EVENT_MAILBOX = """
SELECT 'event' AS kind, name, sent_at AS at, payload FROM pgjobs_events
WHERE job_id = %(job_id)s
UNION ALL
SELECT 'wait', name, nullif(deadline, 'infinity'), NULL FROM pgjobs_event_waits
WHERE job_id = %(job_id)s
ORDER BY at
"""

#: Remove the mail and waits of jobs that are no longer in queued_jobs, a batch at a time
#: (the maintenance round); returns how many rows went.
EVENT_SWEEP = """
WITH gone AS (
    DELETE FROM pgjobs_events e
    WHERE e.id IN (SELECT e2.id FROM pgjobs_events e2
                   WHERE NOT EXISTS (SELECT 1 FROM queued_jobs q WHERE q.id = e2.job_id)
                   LIMIT %(limit)s)
    RETURNING 1
), waits AS (
    DELETE FROM pgjobs_event_waits w
    WHERE NOT EXISTS (SELECT 1 FROM queued_jobs q WHERE q.id = w.job_id)
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM waits)
"""

#: Record a wait (an event's, or children's) at its place of the workflow's history, fenced by
#: the run's lease (the caller holds the job's row lock): a new place, or the same wait's
#: place not done yet. ``wake_at``: the event's deadline (NULL without one, and for children),
#: kept from the first record. Rows: one, (seq, whether the deadline passed, the deadline as
#: text), when recorded; none when another kind or name holds the place or it is done.
WORKFLOW_WAIT_RECORD = """
INSERT INTO pgjobs_workflow_history AS h
    (job_id, seq, kind, name, status, result, error, error_type, attempts, started_at,
     recorded_at, wake_at)
VALUES (%(job_id)s, %(seq)s, %(kind)s, %(name)s, %(status)s, %(result)s::jsonb, %(error)s,
        %(error_type)s, 1, now(), now(),
        coalesce(%(until)s::timestamptz, now() + %(seconds)s::float8 * interval '1 second'))
ON CONFLICT (job_id, seq) DO UPDATE
SET status = excluded.status,
    result = coalesce(excluded.result, h.result),
    error = excluded.error,
    error_type = excluded.error_type,
    recorded_at = excluded.recorded_at,
    wake_at = coalesce(h.wake_at, excluded.wake_at)
WHERE h.status <> 'done' AND h.kind = excluded.kind AND h.name = excluded.name
RETURNING h.seq, h.wake_at <= now() AS due, h.wake_at::text
"""
