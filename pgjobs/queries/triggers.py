"""Logic that lives in the database: the current text of its triggers' functions.

Migrations create them (``pgjobs_job_ended``: 0013; ``pgjobs_group_touched``: 0014;
``pgjobs_children_ended``: 0020); this is the
text a migrated database runs, kept here beside the statements that move rows into
``archived_jobs`` and ``dead_letter``, so that one reading shows what such a move sets off. A
migration that changes a function changes this text in the same commit
(``tests/integration/schema/test_trigger_text.py`` compares the two).

``pgjobs_job_ended``, in the transaction that moved a watched job or a batch member: NOTIFYs
``pgjobs_ended`` (payload: the job's id); releases the dependents whose last dependency
succeeded; moves the dependents of a job that did not succeed (and theirs, transitively) to
``dead_letter`` with reason ``dependency_failed``; counts the job's end in its batch and enqueues
the batch's callback when it was the last member. The rows are locked in that order (the waiting
row, then the batch row), so each release and each callback happens once however many workers
end members at the same instant.
"""

from __future__ import annotations

from pgjobs.queries.channels import NOTIFY_CHANNEL
from pgjobs.queries.columns import _MOVED_COLUMNS

#: Create (or replace) the function the trigger runs; its argument is the table's kind
#: ('archived' or 'dead': dead_letter's rows have no status).
JOB_ENDED_FUNCTION = f"""
CREATE OR REPLACE FUNCTION pgjobs_job_ended() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    outcome text := 'dead';
    batch pgjobs_batches%ROWTYPE;
    callback_id bigint;
    woken bigint;
BEGIN
    -- A branch of its own: dead_letter's rows have no status (an expression is prepared when it
    -- first runs, per table).
    IF TG_ARGV[0] = 'archived' THEN
        outcome := NEW.status;
    END IF;
    IF NEW.watched THEN
        PERFORM pg_notify('pgjobs_ended', NEW.id::text);
        -- The job itself no longer waits (it was cancelled or expired while waiting).
        DELETE FROM pgjobs_waiting WHERE job_id = NEW.id;
        IF outcome = 'succeeded' THEN
            UPDATE pgjobs_waiting w SET waiting_on = w.waiting_on - 1
            FROM pgjobs_dependencies d
            WHERE d.depends_on = NEW.id AND w.job_id = d.job_id;
            -- A statement of its own: it sees the counts this transaction left at 0, and a
            -- concurrent end of the same dependent's other dependency waited for the row lock.
            WITH ready AS (
                DELETE FROM pgjobs_waiting w
                USING pgjobs_dependencies d
                WHERE d.depends_on = NEW.id AND w.job_id = d.job_id AND w.waiting_on <= 0
                RETURNING w.job_id, w.run_at
            ),
            released AS (
                UPDATE queued_jobs q SET run_at = greatest(ready.run_at, now())
                FROM ready WHERE q.id = ready.job_id
                RETURNING q.queue
            )
            SELECT count(pg_notify('pgjobs', queue)) INTO woken
            FROM (SELECT DISTINCT queue FROM released) r;
        ELSE
            WITH RECURSIVE doomed(job_id) AS (
                SELECT d.job_id FROM pgjobs_dependencies d
                JOIN pgjobs_waiting w ON w.job_id = d.job_id
                WHERE d.depends_on = NEW.id
                UNION
                SELECT d.job_id FROM doomed
                JOIN pgjobs_dependencies d ON d.depends_on = doomed.job_id
                JOIN pgjobs_waiting w ON w.job_id = d.job_id
            ),
            unwaited AS (
                DELETE FROM pgjobs_waiting w USING doomed WHERE w.job_id = doomed.job_id
                RETURNING w.job_id
            ),
            gone AS (
                DELETE FROM queued_jobs q USING unwaited WHERE q.id = unwaited.job_id
                RETURNING q.*
            )
            INSERT INTO dead_letter ({_MOVED_COLUMNS}, reason, last_error)
            SELECT {_MOVED_COLUMNS}, 'dependency_failed',
                   format('dependency %s ended %s', NEW.id, outcome)
            FROM gone;
        END IF;
    END IF;
    IF NEW.batch_id IS NOT NULL AND NEW.redrive_count = 0 THEN
        UPDATE pgjobs_batches b SET
            pending = b.pending - 1,
            succeeded = b.succeeded + (outcome = 'succeeded')::int,
            dead = b.dead + (outcome = 'dead')::int,
            cancelled = b.cancelled + (outcome IN ('cancelled', 'expired'))::int,
            completed_at = CASE WHEN b.pending = 1 THEN now() END
        WHERE b.id = NEW.batch_id
        RETURNING b.* INTO batch;
        IF FOUND AND batch.pending = 0 AND batch.callback_task IS NOT NULL THEN
            INSERT INTO queued_jobs (queue, task, payload, priority, max_attempts, payload_version)
            VALUES (
                batch.callback_queue,
                batch.callback_task,
                batch.callback_payload || jsonb_build_object('batch', jsonb_build_object(
                    'id', batch.id, 'total', batch.total, 'succeeded', batch.succeeded,
                    'dead', batch.dead, 'cancelled', batch.cancelled)),
                batch.callback_priority,
                batch.callback_max_attempts,
                batch.callback_payload_version
            )
            RETURNING id INTO callback_id;
            UPDATE pgjobs_batches SET callback_job_id = callback_id WHERE id = batch.id;
            PERFORM pg_notify('pgjobs', batch.callback_queue);
        END IF;
    END IF;
    RETURN NULL;
END
$fn$
"""

#: Which inserted rows the trigger runs for: every other row pays for this condition alone.
JOB_ENDED_WHEN = "NEW.watched OR (NEW.batch_id IS NOT NULL AND NEW.redrive_count = 0)"

#: (table, the function's argument) of each table the trigger is on.
JOB_ENDED_TABLES = (("archived_jobs", "archived"), ("dead_letter", "dead"))


#: Create (or replace) the function that keeps one ``pgjobs_groups`` row per group across its
#: queues: run once per statement that inserts or updates ``pgjobs_group_states`` (its transition
#: table ``changed``), it writes the rows of the groups the statement touched, in group order (so
#: that two statements touching the same groups lock their rows in one order).
GROUP_TOUCHED_FUNCTION = """
CREATE OR REPLACE FUNCTION pgjobs_group_touched() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO pgjobs_groups AS g (group_key)
    SELECT DISTINCT group_key FROM changed
    ORDER BY group_key
    ON CONFLICT (group_key) DO UPDATE SET touched_at = clock_timestamp();
    RETURN NULL;
END
$fn$
"""

#: (trigger, event) of the statement triggers on pgjobs_group_states that run it: a trigger with
#: a transition table takes one event, so one trigger for each.
GROUP_TOUCHED_TRIGGERS = (("pgjobs_group_inserted", "INSERT"), ("pgjobs_group_updated", "UPDATE"))


#: Create (or replace) the function that makes a workflow ready when the last of its children
#: (the members of a batch whose ``parent_job_id`` it is) has ended: run by the row trigger on
#: ``pgjobs_batches`` when a member's end brings ``pending`` to 0, under that row's lock, so that
#: a workflow checking its children's batch (``FOR UPDATE``) before it suspends sees the end or
#: is woken by it. A parent that a lease holds is not touched (it reads the count itself).
CHILDREN_ENDED_FUNCTION = f"""
CREATE OR REPLACE FUNCTION pgjobs_children_ended() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    woken bigint;
BEGIN
    WITH released AS (
        UPDATE queued_jobs q SET run_at = now()
        WHERE q.id = NEW.parent_job_id AND q.lease_expires_at IS NULL AND q.run_at > now()
        RETURNING q.queue
    )
    SELECT count(pg_notify('{NOTIFY_CHANNEL}', queue)) INTO woken FROM released;
    RETURN NULL;
END
$fn$
"""

#: When the trigger on ``pgjobs_batches`` runs it: the last member of a workflow's children ended.
CHILDREN_ENDED_WHEN = "NEW.pending = 0 AND OLD.pending > 0 AND NEW.parent_job_id IS NOT NULL"
