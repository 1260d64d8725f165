"""Workflows and results: dependencies, batches with a callback, waiting for a job, progress, tags

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26

* On the three tables (they travel with the job): ``tags`` (text[], searched through GIN
  indexes), ``progress`` (the handler's last reported progress), ``batch_id`` (the batch the job
  is a member of, indexed) and ``watched`` (something waits for the job's end: a dependent job,
  a caller of ``app.wait``, or the job itself waits for others).
* ``pgjobs_dependencies``: one row per (job, job it depends on), kept for the job's page;
  ``pgjobs_waiting``: one row per job still waiting, with the count of its dependencies not yet
  succeeded and the time it asked to run at. A waiting job sits in ``queued_jobs`` with
  ``run_at = 'infinity'``, which no claim takes.
* ``pgjobs_batches``: a batch's counts and its callback, enqueued once when the last member
  ends.
* ``dead_letter.reason`` is widened with ``dependency_failed``.
* ``pgjobs_schedules.paused_at`` and ``paused_by``: a paused schedule enqueues nothing.
* ``pgjobs_job_ended()``, run by a trigger after a row enters ``archived_jobs`` or
  ``dead_letter`` when it is watched or counts for a batch (the trigger's WHEN clause: other rows
  cost nothing). In the transaction that moved the job it NOTIFYs ``pgjobs_ended`` (payload: the
  job's id), releases the dependents whose last dependency succeeded, moves the dependents of a
  job that did not succeed (and theirs, transitively) to ``dead_letter`` with reason
  ``dependency_failed``, and counts the job's end in its batch, enqueueing the callback when it
  was the last. Rows locked in that order (the waiting row, the batch row) make each release and
  each callback happen once however many workers end members at the same instant.

Online safety: the columns (nullable, or NOT NULL with a constant default), the tables, the
function and the triggers are catalog changes in one short transaction (CREATE TRIGGER holds its
lock for no longer than that). The wider reason check is added NOT VALID and validated outside
any transaction, as in 0012. The indexes of ``queued_jobs`` and ``dead_letter`` are built
CONCURRENTLY; the archive's on its partitions one by one CONCURRENTLY, then attached to an index
created ON ONLY the partitioned table. A run interrupted half-way is run again: an index left
INVALID is dropped and rebuilt. Workers of the previous release go on working on the migrated
schema (they write none of the new columns; a waiting job's ``infinity`` is never due for them
either). Downgrade locks the three tables in the order a worker's statements do, makes waiting
jobs ready at the time they asked for, turns ``dependency_failed`` rows into ``non_retryable``
and drops what the upgrade added.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("queued_jobs", "archived_jobs", "dead_letter")

OLD_REASONS = (
    "exhausted",
    "non_retryable",
    "lease_expired",
    "unknown_task",
    "invalid_payload",
    "interrupted",
    "timeout",
    "snoozed_out",
)
NEW_REASONS = (*OLD_REASONS, "dependency_failed")

CHECK = "ck_dead_letter_reason"
INCOMING = "ck_dead_letter_reason_incoming"

#: (suffix, definition after ON table) of the indexes each of the three tables gets, named
#: ix_<table>_<suffix>.
INDEXES = (
    ("batch_id", "(batch_id) WHERE batch_id IS NOT NULL"),
    ("tags", "USING gin (tags) WHERE tags IS NOT NULL"),
)

#: The columns a job takes with it from queued_jobs into dead_letter, as the worker's moves list
#: them (queries._MOVED_COLUMNS as of this revision).
MOVED = (
    "id, queue, task, payload, priority, run_at, attempts, max_attempts, created_at, expires_at, "
    "idempotency_key, redrive_count, redriven_at, replay_of, started_at, payload_version, "
    "trace_context, group_key, unique_key, snoozes, tags, progress, batch_id, watched"
)

FUNCTION = f"""
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
            INSERT INTO dead_letter ({MOVED}, reason, last_error)
            SELECT {MOVED}, 'dependency_failed',
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

#: Which rows the trigger runs for: the rest pay for this condition alone.
TRIGGER_WHEN = "NEW.watched OR (NEW.batch_id IS NOT NULL AND NEW.redrive_count = 0)"

TRIGGERS = (("archived_jobs", "archived"), ("dead_letter", "dead"))


def _replace_reason_check(reasons: tuple[str, ...]) -> None:
    listed = ", ".join(f"'{reason}'" for reason in reasons)
    with op.get_context().autocommit_block():
        op.execute(f"ALTER TABLE dead_letter DROP CONSTRAINT IF EXISTS {INCOMING}")
        op.execute(
            f"ALTER TABLE dead_letter ADD CONSTRAINT {INCOMING} "
            f"CHECK (reason IN ({listed})) NOT VALID"
        )
        op.execute(f"ALTER TABLE dead_letter VALIDATE CONSTRAINT {INCOMING}")
    op.execute(f"ALTER TABLE dead_letter DROP CONSTRAINT {CHECK}")
    op.execute(f"ALTER TABLE dead_letter RENAME CONSTRAINT {INCOMING} TO {CHECK}")


def _drop_if_invalid(name: str) -> None:
    op.execute(
        f"""
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index
               WHERE indexrelid = to_regclass('{name}') AND NOT indisvalid) THEN
        DROP INDEX {name};
    END IF;
END $$
"""
    )


def _build_indexes() -> None:
    """Build INDEXES CONCURRENTLY (inside an autocommit block): on queued_jobs and dead_letter
    directly, on the archive partition by partition, attached to the partitioned table's."""
    for table in ("queued_jobs", "dead_letter"):
        for suffix, definition in INDEXES:
            name = f"ix_{table}_{suffix}"
            _drop_if_invalid(name)
            op.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} {definition}")
    if op.get_context().as_sql:
        # Printed DDL (no database to list the partitions from): one plain build per index on
        # the partitioned table, which holds off the archive's writes while it runs.
        for suffix, definition in INDEXES:
            op.execute(
                f"CREATE INDEX IF NOT EXISTS ix_archived_jobs_{suffix} ON archived_jobs {definition}"
            )
        return
    partitions = [
        row[0]
        for row in op.get_bind().execute(
            sa.text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = 'archived_jobs'::regclass ORDER BY c.relname"
            )
        )
    ]
    for suffix, definition in INDEXES:
        parent = f"ix_archived_jobs_{suffix}"
        op.execute(f"CREATE INDEX IF NOT EXISTS {parent} ON ONLY archived_jobs {definition}")
        for partition in partitions:
            name = f"{partition}_{suffix}_idx"
            _drop_if_invalid(name)
            op.execute(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {partition} {definition}"
            )
            op.execute(
                f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_inherits
                   WHERE inhrelid = '{name}'::regclass AND inhparent = '{parent}'::regclass) THEN
        ALTER INDEX {parent} ATTACH PARTITION {name};
    END IF;
END $$
"""
            )


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("tags", ARRAY(sa.Text()), nullable=True))
        op.add_column(table, sa.Column("progress", JSONB(), nullable=True))
        op.add_column(table, sa.Column("batch_id", sa.BigInteger(), nullable=True))
        op.add_column(
            table,
            sa.Column("watched", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        )
    op.create_table(
        "pgjobs_dependencies",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("depends_on", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "depends_on", name=op.f("pk_pgjobs_dependencies")),
    )
    op.create_index(
        op.f("ix_pgjobs_dependencies_depends_on"), "pgjobs_dependencies", ["depends_on"]
    )
    op.create_table(
        "pgjobs_waiting",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("waiting_on", sa.Integer(), nullable=False),
        sa.Column("run_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_pgjobs_waiting")),
    )
    op.create_table(
        "pgjobs_batches",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("pending", sa.Integer(), nullable=False),
        sa.Column("succeeded", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("dead", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("cancelled", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("callback_task", sa.Text(), nullable=True),
        sa.Column("callback_queue", sa.Text(), nullable=True),
        sa.Column("callback_payload", JSONB(), nullable=True),
        sa.Column("callback_priority", sa.SmallInteger(), nullable=True),
        sa.Column("callback_max_attempts", sa.Integer(), nullable=True),
        sa.Column("callback_payload_version", sa.Integer(), nullable=True),
        sa.Column("callback_job_id", sa.BigInteger(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("pending >= 0", name=op.f("ck_pgjobs_batches_pending_not_negative")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pgjobs_batches")),
    )
    op.add_column("pgjobs_schedules", sa.Column("paused_at", sa.DateTime(timezone=True)))
    op.add_column("pgjobs_schedules", sa.Column("paused_by", sa.Text()))
    op.execute(FUNCTION)
    for table, kind in TRIGGERS:
        op.execute(
            f"CREATE TRIGGER pgjobs_job_ended AFTER INSERT ON {table} FOR EACH ROW "
            f"WHEN ({TRIGGER_WHEN}) EXECUTE FUNCTION pgjobs_job_ended('{kind}')"
        )
    _replace_reason_check(NEW_REASONS)
    with op.get_context().autocommit_block():
        _build_indexes()


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for table in TABLES:
            for suffix, _ in INDEXES:
                # The archive's index is dropped with its column (the partitions' with it).
                if table != "archived_jobs":
                    op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS ix_{table}_{suffix}")
    # In the order a worker's statements lock them (queued_jobs first, then the archive and the
    # dead letter), before anything else, as in 0012.
    op.execute(
        "LOCK TABLE queued_jobs, archived_jobs, dead_letter, pgjobs_waiting, "
        "pgjobs_dependencies, pgjobs_batches, pgjobs_schedules IN ACCESS EXCLUSIVE MODE"
    )
    for table, _ in TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS pgjobs_job_ended ON {table}")
    op.execute("DROP FUNCTION IF EXISTS pgjobs_job_ended()")
    op.execute(
        "UPDATE queued_jobs q SET run_at = greatest(w.run_at, now()) "
        "FROM pgjobs_waiting w WHERE q.id = w.job_id"
    )
    op.execute("UPDATE dead_letter SET reason = 'non_retryable' WHERE reason = 'dependency_failed'")
    op.drop_column("pgjobs_schedules", "paused_by")
    op.drop_column("pgjobs_schedules", "paused_at")
    op.drop_table("pgjobs_batches")
    op.drop_table("pgjobs_waiting")
    op.drop_table("pgjobs_dependencies")
    for table in reversed(TABLES):
        for column in ("watched", "batch_id", "progress", "tags"):
            op.drop_column(table, column)
    _replace_reason_check(OLD_REASONS)
