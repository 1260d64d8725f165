"""Durable workflows' history (``pgjobs_workflow_history``): read a run's entries, record a step
or a sleep at its place, fenced by the run's lease; forget the history of jobs deleted for good.

A record is an ``INSERT`` at (job_id, seq), the table's primary key (an upsert over an entry that
has not succeeded): a second run recording the same place while the first's transaction is open
waits for it, then finds the place taken and records nothing (its statement returns no row).
That, in the transaction of a step's own writes, is what makes them happen once.
"""

from __future__ import annotations

#: The lease fence of a record: the run's attempt still holds the job (no newer attempt was
#: claimed, the lease was not taken back).
_FENCE = """
EXISTS (SELECT 1 FROM queued_jobs q
        WHERE q.id = %(job_id)s AND q.attempts = %(attempt)s AND q.lease_owner = %(owner)s)
"""

#: A workflow job's history in order, a sleep's wake time as seconds from now (the database's
#: clock). Rows: (seq, kind, name, status, result, error, error_type, attempts, wake_in).
WORKFLOW_HISTORY = """
SELECT seq, kind, name, status, result, error, error_type, attempts,
       extract(epoch FROM wake_at - now())::float8
FROM pgjobs_workflow_history
WHERE job_id = %(job_id)s
ORDER BY seq
"""

#: One entry of a workflow job's history, as WORKFLOW_HISTORY reads it. Rows: none, or one.
WORKFLOW_ENTRY = """
SELECT seq, kind, name, status, result, error, error_type, attempts,
       extract(epoch FROM wake_at - now())::float8
FROM pgjobs_workflow_history
WHERE job_id = %(job_id)s AND seq = %(seq)s
"""

#: A job's history as `pgjobs job show` shows it. Rows: (seq, kind, name, status, attempts,
#: result, error, error_type, transactional, started_at, recorded_at, wake_at), in order.
WORKFLOW_HISTORY_SHOW = """
SELECT seq, kind, name, status, attempts, result, error, error_type, transactional, started_at,
       recorded_at, wake_at
FROM pgjobs_workflow_history
WHERE job_id = %(job_id)s
ORDER BY seq
"""

#: Record a step's outcome at its place, fenced by the run's lease: a new place, or one whose
#: step has not succeeded yet (waiting for a retry, or the failure the run resumes from). A
#: place another run took (and committed) is left alone. Rows: one, (seq), when recorded; none
#: when the place was taken or the lease is lost.
WORKFLOW_STEP_RECORD = f"""
INSERT INTO pgjobs_workflow_history AS h
    (job_id, seq, kind, name, status, result, error, error_type, attempts, transactional,
     started_at, recorded_at)
SELECT %(job_id)s, %(seq)s, 'step', %(name)s, %(status)s, %(result)s::jsonb, %(error)s,
       %(error_type)s, %(attempts)s, %(transactional)s, %(started_at)s, now()
WHERE {_FENCE}
ON CONFLICT (job_id, seq) DO UPDATE
SET status = excluded.status,
    result = excluded.result,
    error = excluded.error,
    error_type = excluded.error_type,
    attempts = excluded.attempts,
    transactional = excluded.transactional,
    started_at = coalesce(h.started_at, excluded.started_at),
    recorded_at = excluded.recorded_at
WHERE h.status <> 'done' AND h.kind = 'step' AND h.name = excluded.name
RETURNING h.seq
"""

#: Record a sleep at its place, fenced by the run's lease: it wakes at %(until)s, or
#: %(seconds)s from now by the database's clock. Rows: one, (seconds until it wakes), when
#: recorded; none when the place was taken or the lease is lost.
WORKFLOW_SLEEP_RECORD = f"""
INSERT INTO pgjobs_workflow_history AS h
    (job_id, seq, kind, name, status, attempts, started_at, recorded_at, wake_at)
SELECT %(job_id)s, %(seq)s, 'sleep', %(name)s, 'done', 1, now(), now(),
       coalesce(%(until)s::timestamptz, now() + %(seconds)s::float8 * interval '1 second')
WHERE {_FENCE}
ON CONFLICT (job_id, seq) DO NOTHING
RETURNING extract(epoch FROM h.wake_at - now())::float8
"""

#: Forget the workflow history of the jobs in archive partition {partition} (compose with
#: psycopg.sql), before `pgjobs prune` drops it. Rows: none.
WORKFLOW_FORGET_PARTITION = """
DELETE FROM pgjobs_workflow_history h USING {partition} p WHERE h.job_id = p.id
"""

#: Create (or replace) the function of the triggers ``pgjobs_workflow_forget``: run once per
#: statement that deletes rows of ``dead_letter`` or ``archived_jobs`` (its transition table
#: ``gone``), it deletes the history of those jobs, but of the ones the same statement moved on
#: (a redrive sends a dead job back to ``queued_jobs``: its history resumes there).
WORKFLOW_FORGET_FUNCTION = """
CREATE OR REPLACE FUNCTION pgjobs_workflow_forget() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM pgjobs_workflow_history h
    USING gone g
    WHERE h.job_id = g.id
      AND NOT EXISTS (SELECT 1 FROM queued_jobs q WHERE q.id = g.id)
      AND NOT EXISTS (SELECT 1 FROM dead_letter d WHERE d.id = g.id)
      AND NOT EXISTS (SELECT 1 FROM archived_jobs a WHERE a.id = g.id);
    RETURN NULL;
END
$fn$
"""

#: The tables whose deletes forget the history (one statement trigger each).
WORKFLOW_FORGET_TABLES = ("archived_jobs", "dead_letter")
