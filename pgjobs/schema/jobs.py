"""The three tables a job can live in, and the record of edits made to a queued job.

A job is in exactly one of them at any moment:

* ``queued_jobs``: ready, scheduled for later, or leased by a worker. Kept small.
* ``archived_jobs``: insert-only history of finished jobs (succeeded, cancelled, expired).
* ``dead_letter``: jobs that exhausted their attempts or failed for good; read by humans.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Identity,
    Index,
    Integer,
    SmallInteger,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from pgjobs.models import ArchivedStatus, DeadReason
from pgjobs.schema.base import _operations_columns, _status_check, metadata

queued_jobs = Table(
    "queued_jobs",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("queue", Text, nullable=False, server_default=text("'default'")),
    Column("task", Text, nullable=False),
    Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # Higher runs first; 0 is the default.
    Column("priority", SmallInteger, nullable=False, server_default=text("0")),
    Column("run_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # Incremented by the claim, so a crash mid-run still uses up an attempt.
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False, server_default=text("5")),
    # NULL lease_expires_at means "not leased": ready or scheduled, by run_at.
    Column("lease_owner", Text),
    Column("lease_expires_at", DateTime(timezone=True)),
    Column("last_error", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("expires_at", DateTime(timezone=True)),
    Column("idempotency_key", Text),
    # Set by the claim for tasks declared at-most-once: an expired lease dead-letters the job
    # instead of running it again.
    Column("at_most_once", Boolean, nullable=False, server_default=text("false")),
    *_operations_columns("queued_jobs"),
    # The limit (concurrency or rate) the job counts against and waits for: its task's name,
    # set by the claim of a worker that limits the task (on the jobs it claims, and on those it
    # holds back because the task is at its limit); NULL for every other job. A ready job with
    # a limit_key leaves the queue's claim range for its task's own range, so that jobs held
    # back never stand in the way of the queue's other tasks. Migration 0009.
    Column("limit_key", Text),
    # The attempt a worker claimed the job for to deliver it to an external task's downstream
    # (the claim sets it, NULL for a job run by a Python handler): the only attempt an outcome
    # reported from outside (``admin.report_outcome``) may settle. Migration 0010.
    Column("external_attempt", Integer),
    CheckConstraint("max_attempts >= 1", name="max_attempts_positive"),
    CheckConstraint("attempts >= 0", name="attempts_not_negative"),
    # Where values enter, pgjobs refuses the same (submission.check_key); these hold for SQL
    # written by hand too. Migration 0011 (NOT VALID, then VALIDATE).
    CheckConstraint("group_key <> '' AND octet_length(group_key) <= 512", name="group_key_size"),
    CheckConstraint("unique_key <> '' AND octet_length(unique_key) <= 512", name="unique_key_size"),
    # The claim: ready rows of a queue in priority, then run_at, order; jobs of a group are
    # claimed from their group's range instead (below).
    Index(
        "ix_queued_jobs_claim",
        "queue",
        text("priority DESC"),
        "run_at",
        "id",
        postgresql_where=text(
            "lease_expires_at IS NULL AND limit_key IS NULL AND group_key IS NULL"
        ),
    ),
    # The claim of a group's jobs: its ready rows, per queue, in claim order. Migration 0011.
    Index(
        "ix_queued_jobs_group_ready",
        "queue",
        "group_key",
        text("priority DESC"),
        "run_at",
        "id",
        postgresql_where=text("lease_expires_at IS NULL AND group_key IS NOT NULL"),
    ),
    # A group's running jobs in every queue, by queue and task, counted by each claim against a
    # task's group concurrency (all queues) and a queue's (that queue). Migration 0014.
    Index(
        "ix_queued_jobs_group_running",
        "group_key",
        "queue",
        "task",
        postgresql_where=text("lease_expires_at IS NOT NULL AND group_key IS NOT NULL"),
    ),
    # A task's jobs of one group in enqueue order, whatever their queue: the claim takes an
    # ordered (task, group)'s oldest. Migration 0014.
    Index(
        "ix_queued_jobs_group_sequence",
        "group_key",
        "task",
        "id",
        postgresql_where=text("group_key IS NOT NULL"),
    ),
    # A unique key covers the task's jobs that have not started: at most one of them per key.
    Index(
        "uq_queued_jobs_unique_key",
        "task",
        "unique_key",
        unique=True,
        postgresql_where=text("unique_key IS NOT NULL AND started_at IS NULL"),
    ),
    # The claim of a limited task: its ready rows held back, per queue, in the same order.
    Index(
        "ix_queued_jobs_limit_ready",
        "queue",
        "limit_key",
        text("priority DESC"),
        "run_at",
        "id",
        postgresql_where=text("lease_expires_at IS NULL AND limit_key IS NOT NULL"),
    ),
    # A limited task's running jobs, counted against its concurrency by each limited claim.
    Index(
        "ix_queued_jobs_limit_leased",
        "limit_key",
        postgresql_where=text("lease_expires_at IS NOT NULL AND limit_key IS NOT NULL"),
    ),
    # The lease rescuer (leased rows by expiry) and a queue's running jobs (counted against the
    # queue's concurrency limit).
    Index(
        "ix_queued_jobs_queue_lease_expires_at",
        "queue",
        "lease_expires_at",
        postgresql_where=text("lease_expires_at IS NOT NULL"),
    ),
    # The expirer: rows that carry an expires_at.
    Index(
        "ix_queued_jobs_expires_at",
        "expires_at",
        postgresql_where=text("expires_at IS NOT NULL"),
    ),
    Index(
        "uq_queued_jobs_idempotency_key",
        "idempotency_key",
        unique=True,
        postgresql_where=text("idempotency_key IS NOT NULL"),
    ),
    # The hot table churns (an insert, an update per attempt and a delete per job): vacuum it
    # once 1% of its rows are dead (PostgreSQL's default is 20%), analyse it after 2% changed.
    # Set by migration 0004; Alembic does not compare storage parameters.
    postgresql_with={
        "autovacuum_vacuum_scale_factor": "0.01",
        "autovacuum_vacuum_insert_scale_factor": "0.01",
        "autovacuum_analyze_scale_factor": "0.02",
    },
)


# Range-partitioned by finished_at, one partition per UTC day, so that retention drops whole
# partitions (`pgjobs prune`) instead of deleting rows. The partitions (archived_jobs_pYYYYMMDD,
# archived_jobs_default, and archived_jobs_legacy for history converted by migration 0004) are
# created by that migration and by the archive-partitions service, not declared here. A primary
# key of a partitioned table must include the partition key: (id, finished_at).
archived_jobs = Table(
    "archived_jobs",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("queue", Text, nullable=False),
    Column("task", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("priority", SmallInteger, nullable=False),
    Column("run_at", DateTime(timezone=True), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("status", Text, nullable=False),
    # The handler's return value, when it returned something JSON can hold.
    Column("result", JSONB),
    Column("last_error", Text),
    # The worker that ran the job last (NULL for cancelled or expired jobs).
    Column("worker", Text),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column(
        "finished_at",
        DateTime(timezone=True),
        primary_key=True,
        nullable=False,
        server_default=text("now()"),
    ),
    Column("expires_at", DateTime(timezone=True)),
    Column("idempotency_key", Text),
    *_operations_columns("archived_jobs"),
    _status_check("status", ArchivedStatus),
    Index("ix_archived_jobs_finished_at", "finished_at"),
    Index(
        "ix_archived_jobs_idempotency_key",
        "idempotency_key",
        postgresql_where=text("idempotency_key IS NOT NULL"),
    ),
    # The dashboard's search by group: a group's newest archived jobs. Migration 0015.
    Index(
        "ix_archived_jobs_group_key",
        "group_key",
        "id",
        postgresql_where=text("group_key IS NOT NULL"),
    ),
    postgresql_partition_by="RANGE (finished_at)",
)


dead_letter = Table(
    "dead_letter",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("queue", Text, nullable=False),
    Column("task", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("priority", SmallInteger, nullable=False),
    Column("run_at", DateTime(timezone=True), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("reason", Text, nullable=False),
    # The exception's qualified type name, e.g. "builtins.ValueError" (NULL when no handler ran).
    Column("error_type", Text),
    Column("last_error", Text),
    Column("traceback", Text),
    Column("worker", Text),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("failed_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("expires_at", DateTime(timezone=True)),
    Column("idempotency_key", Text),
    *_operations_columns("dead_letter"),
    _status_check("reason", DeadReason),
    # Triage by time, newest first, optionally narrowed to one task.
    Index("ix_dead_letter_failed_at", "failed_at"),
    Index("ix_dead_letter_task_failed_at", "task", "failed_at"),
    Index(
        "ix_dead_letter_idempotency_key",
        "idempotency_key",
        postgresql_where=text("idempotency_key IS NOT NULL"),
    ),
    # An ordered task declared ``ordered="hold"``: a dead job holds its group. Migration 0011.
    Index(
        "ix_dead_letter_group_key_task",
        "group_key",
        "task",
        postgresql_where=text("group_key IS NOT NULL"),
    ),
)


# The edits of queued jobs (`pgjobs job edit`, ``PATCH /api/v1/jobs/{id}``, the dashboard's job
# page): who changed which fields of a job that had not started, when, each field's old and new
# value. Keyed by the job's id, which it keeps in every table, so the record follows the job from
# queued_jobs to the archive or the dead letter; purging a dead job deletes its edits, and
# `pgjobs prune` and the retention service delete the edits of jobs no table holds any more.
# Migration 0019.
pgjobs_job_edits = Table(
    "pgjobs_job_edits",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("job_id", BigInteger, nullable=False),
    Column("edited_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # The CLI's user (or --by), the host's principal over HTTP, the dashboard's session.
    Column("edited_by", Text, nullable=False),
    # {"priority": {"old": 0, "new": 7}, ...}: only the fields the edit changed.
    Column("changes", JSONB, nullable=False),
    # A job's edits in order, for `pgjobs job show`.
    Index("ix_pgjobs_job_edits_job_id", "job_id", "id"),
)
