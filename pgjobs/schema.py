"""The three tables a job can live in, as SQLAlchemy Core tables.

A job is in exactly one of them at any moment:

* ``queued_jobs``: ready, scheduled for later, or leased by a worker. Kept small.
* ``archived_jobs``: insert-only history of finished jobs (succeeded, cancelled, expired).
* ``dead_letter``: jobs that exhausted their attempts or failed for good; read by humans.

Alembic migrations create this schema; ``tests/integration/schema/test_migrations.py`` proves
that the migrated database and this module do not drift apart.
"""

from __future__ import annotations

import enum

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    Identity,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.schema import SchemaItem

from pgjobs.models import ArchivedStatus, DeadReason, WorkflowEntryKind, WorkflowEntryStatus

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _status_check(column: str, values: type[enum.StrEnum]) -> CheckConstraint:
    listed = ", ".join(f"'{value}'" for value in values)
    return CheckConstraint(f"{column} IN ({listed})", name=column)


def _operations_columns(table: str) -> tuple[SchemaItem, ...]:
    """The redrive record, replay link, run start, payload version and trace context every
    table carries, so they travel with the job."""
    return (
        # How many times `pgjobs dead redrive` sent the job back to queued_jobs; when it last did.
        Column("redrive_count", Integer, nullable=False, server_default=text("0")),
        Column("redriven_at", DateTime(timezone=True)),
        # The job that `pgjobs replay` copied into this one; NULL when the job is not a replay.
        Column("replay_of", BigInteger),
        # `pgjobs job show`: the replays of a job, wherever they are.
        Index(f"ix_{table}_replay_of", "replay_of", postgresql_where=text("replay_of IS NOT NULL")),
        # When the job's latest attempt started (set by the claim; NULL if it never ran): run time
        # is finished_at - started_at, pickup latency started_at - run_at. Migration 0005.
        Column("started_at", DateTime(timezone=True)),
        # The version of the payload's shape it was enqueued with (``@app.task(version=...)``);
        # NULL is version 1. A worker upgrades older payloads before running them. Migration 0007.
        Column("payload_version", Integer),
        # The enqueuing span's W3C trace context (traceparent, tracestate) when the producer
        # traces with OpenTelemetry; the worker's span for the job is its child. Migration 0007.
        Column("trace_context", JSONB),
        # The group the job belongs to (a tenant, a customer: ``enqueue(..., group=...)``): a task
        # or queue may limit how many of one group's jobs run at once, and claims take turns
        # between groups. NULL: no group. Migration 0011.
        Column("group_key", Text),
        # The unique key it was enqueued with (``enqueue(..., unique_key=...)``): while the job
        # has not started, a second enqueue of the task with the key keeps, replaces or debounces
        # it instead of adding a job. Migration 0011.
        Column("unique_key", Text),
        # The dashboard's search by unique key, in any table. Migration 0015.
        Index(
            f"ix_{table}_unique_key",
            "unique_key",
            postgresql_where=text("unique_key IS NOT NULL"),
        ),
        # How many times the job's handler snoozed it (``raise pgjobs.Snooze(seconds)``): back to
        # the queue for later without spending an attempt, at most the task's ``max_snoozes``
        # times. Migration 0012.
        Column("snoozes", Integer, nullable=False, server_default=text("0")),
        # Labels to search jobs by (``enqueue(..., tags=[...])``), e.g. "customer:42". Migration
        # 0013, as are the three columns below.
        Column("tags", ARRAY(Text)),
        Index(
            f"ix_{table}_tags",
            "tags",
            postgresql_using="gin",
            postgresql_where=text("tags IS NOT NULL"),
        ),
        # The handler's last reported progress (``current_job().progress(...)``): done, total,
        # message and when it was reported.
        Column("progress", JSONB),
        # The batch the job is a member of (pgjobs_batches.id).
        Column("batch_id", BigInteger),
        Index(f"ix_{table}_batch_id", "batch_id", postgresql_where=text("batch_id IS NOT NULL")),
        # Something waits for the job's end: a job that depends on it, a caller of
        # ``app.wait``, or the job itself waits for others. When a watched row (or a batch
        # member's) enters archived_jobs or dead_letter, the trigger pgjobs_job_ended settles
        # what waited (see pgjobs_dependencies); every other row costs the trigger's condition.
        Column("watched", Boolean, nullable=False, server_default=text("false")),
    )


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

# Worker processes, registered at start, refreshed by a heartbeat, removed at a clean exit (or by
# another worker once the heartbeat is stale). Running jobs per worker come from
# queued_jobs.lease_owner, which holds the worker's id. Prefixed because a plain `workers` table
# is likely to exist in the application's own schema.
pgjobs_workers = Table(
    "pgjobs_workers",
    metadata,
    # host:pid:random, as the worker writes it into queued_jobs.lease_owner.
    Column("id", Text, primary_key=True),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("queues", ARRAY(Text), nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("last_seen_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)

# Settings of a queue, one row per queue that has any (a queue without a row is active).
# `pgjobs queue pause` sets paused_at: the claim reads it by primary key, in the same statement,
# and skips the queue's jobs, which stay ready. Migration 0006.
pgjobs_queues = Table(
    "pgjobs_queues",
    metadata,
    Column("name", Text, primary_key=True),
    # NULL: not paused.
    Column("paused_at", DateTime(timezone=True)),
    # Who paused it (the database role, or user@host from the CLI) and why (free text).
    Column("paused_by", Text),
    Column("pause_reason", Text),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # `pgjobs queue limit`: the most jobs of the queue leased at once across every worker (NULL:
    # no limit), and at most rate_jobs starts per rate_seconds (both NULL: no rate). Read by
    # every claim, in the claim's own statement. Migration 0009.
    Column("concurrency", Integer),
    Column("rate_jobs", Integer),
    Column("rate_seconds", Float),
    # `pgjobs queue limit --group-concurrency`: the most jobs of one group of the queue leased
    # at once (NULL: no limit). Migration 0011.
    Column("group_concurrency", Integer),
    CheckConstraint("concurrency >= 1", name="concurrency_positive"),
    CheckConstraint("group_concurrency >= 1", name="group_concurrency_positive"),
    CheckConstraint(
        "(rate_jobs IS NULL) = (rate_seconds IS NULL) AND rate_jobs >= 1 AND rate_seconds > 0",
        name="rate_complete",
    ),
)

# The state of each concurrency limit and rate (a task's, declared in code; a queue's, in
# pgjobs_queues), one row per limited task or queue, created by the first claim that needs it.
# A claim that may take jobs under a limit locks its row (FOR UPDATE SKIP LOCKED), and a claim
# that takes jobs writes it. That makes the count of running jobs safe without a lock held across
# statements: the claim counts them in its own snapshot, and trusts the count only when the row
# it locked is the version its snapshot sees (no claim under the limit committed since).
# Migration 0009.
pgjobs_limit_states = Table(
    "pgjobs_limit_states",
    metadata,
    # 'task' or 'queue', and the task's or queue's name.
    Column("kind", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    # A rate's token bucket: tokens left at refilled_at (fractional: it refills continuously).
    # NULL without a rate.
    Column("tokens", Float),
    Column("refilled_at", DateTime(timezone=True)),
    # When a claim last started jobs under the limit.
    Column("last_claim_at", DateTime(timezone=True)),
    CheckConstraint("kind IN ('task', 'queue')", name="kind"),
)

# The groups that have jobs in a queue, one row per (queue, group), written by every enqueue of a
# job with a group (so that a claim that counted the group's running jobs in an older snapshot
# sees a newer version) and by every claim that starts jobs of the group. A claim takes turns
# between groups by last_claim_at (oldest first), locks the rows of the groups it may take jobs
# from (FOR UPDATE SKIP LOCKED) and trusts a group's count of running jobs only when the row it
# locked is the version its snapshot sees, as for pgjobs_limit_states. Rows of groups that have
# had no job for a while are removed by the maintenance services. Migration 0011.
pgjobs_group_states = Table(
    "pgjobs_group_states",
    metadata,
    Column("queue", Text, primary_key=True),
    Column("group_key", Text, primary_key=True),
    # When a claim last started jobs of the group (the epoch, 1970-01-01: never): the claim's
    # turn order.
    Column(
        "last_claim_at",
        DateTime(timezone=True),
        nullable=False,
        server_default=text("'epoch'"),
    ),
    # When an enqueue last added a job to the group.
    Column("touched_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Index("ix_pgjobs_group_states_queue_last_claim_at", "queue", "last_claim_at"),
)

# One row per group, whatever its queues: the version a claim checks its count of the group's
# running jobs in every queue against, so that a task's group concurrency and order hold per
# (task, group) across queues. Written with the group's rows of pgjobs_group_states, by their
# triggers (pgjobs_group_touched, after each statement that inserts or updates them, in group
# order), so every enqueue into the group and every claim that starts its jobs, in any queue,
# writes it. A claim locks it beside the (queue, group) row, FOR UPDATE SKIP LOCKED, and trusts
# its count only when both are the versions its snapshot sees. Removed with the group's last row
# of pgjobs_group_states by the maintenance services. Migration 0014.
pgjobs_groups = Table(
    "pgjobs_groups",
    metadata,
    Column("group_key", Text, primary_key=True),
    # When an enqueue or a claim in any queue last wrote one of the group's rows.
    Column("touched_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)

# The place in its group of a running job that `pgjobs cancel --force` archived: its handler may
# run on (a sync handler cannot be stopped), so the attempt's lease keeps counting against the
# group's limits (and holds an ordered group) until the worker says the handler ended (it ends
# the row's lease) or the lease runs out. Written by the cancel, read by every claim of the
# group; rows whose lease ended are removed by the maintenance services. Migration 0014.
pgjobs_group_holds = Table(
    "pgjobs_group_holds",
    metadata,
    Column("job_id", BigInteger, primary_key=True),
    Column("queue", Text, nullable=False),
    Column("task", Text, nullable=False),
    Column("group_key", Text, nullable=False),
    # The cancelled attempt and its worker: only they may end the lease.
    Column("attempts", Integer, nullable=False),
    Column("lease_owner", Text, nullable=False),
    Column("lease_expires_at", DateTime(timezone=True), nullable=False),
    Index("ix_pgjobs_group_holds_group_key", "group_key"),
)

# Unique keys of tasks declared with a throttle: the job that last took the key, whose start
# opens the next window. Migration 0011.
pgjobs_throttles = Table(
    "pgjobs_throttles",
    metadata,
    Column("task", Text, primary_key=True),
    Column("unique_key", Text, primary_key=True),
    Column("job_id", BigInteger, nullable=False),
    # When the latest job of the key may start at the earliest.
    Column("window_start_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)

# The dependencies of jobs enqueued with ``after=[...]``: one row per (job, job it depends on),
# kept after both have ended, for a job's page. Migration 0013.
pgjobs_dependencies = Table(
    "pgjobs_dependencies",
    metadata,
    Column("job_id", BigInteger, primary_key=True),
    Column("depends_on", BigInteger, primary_key=True),
    # The trigger pgjobs_job_ended finds a job's dependents by it.
    Index("ix_pgjobs_dependencies_depends_on", "depends_on"),
)

# The jobs still waiting for dependencies, one row each. A waiting job sits in queued_jobs with
# run_at 'infinity', which no claim takes; when the last of its dependencies succeeds, the
# trigger deletes this row and sets the job's run_at to the time kept here (or now, if that has
# passed). Migration 0013.
pgjobs_waiting = Table(
    "pgjobs_waiting",
    metadata,
    Column("job_id", BigInteger, primary_key=True),
    # Its dependencies that have not succeeded yet.
    Column("waiting_on", Integer, nullable=False),
    # The run_at it was enqueued with.
    Column("run_at", DateTime(timezone=True), nullable=False),
)

# Batches (``app.batch(on_complete=...)``): the counts of the members' ends and the callback job
# the trigger pgjobs_job_ended enqueues, in the transaction that ended the last member. Its lock
# on this row serialises members ending at once, so the callback is enqueued once. Migration 0013.
pgjobs_batches = Table(
    "pgjobs_batches",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("total", Integer, nullable=False),
    # Members that have not ended yet.
    Column("pending", Integer, nullable=False),
    Column("succeeded", Integer, nullable=False, server_default=text("0")),
    Column("dead", Integer, nullable=False, server_default=text("0")),
    # Cancelled or expired.
    Column("cancelled", Integer, nullable=False, server_default=text("0")),
    # The callback (NULL task: none): its payload gets a "batch" key with the id and counts.
    Column("callback_task", Text),
    Column("callback_queue", Text),
    Column("callback_payload", JSONB),
    Column("callback_priority", SmallInteger),
    Column("callback_max_attempts", Integer),
    Column("callback_payload_version", Integer),
    Column("callback_job_id", BigInteger),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # When the last member ended.
    Column("completed_at", DateTime(timezone=True)),
    # The workflow job that waits for the batch's members (its children: ``ctx.map``), made
    # ready by the trigger pgjobs_children_ended when the last one ends. Migration 0017.
    Column("parent_job_id", BigInteger),
    CheckConstraint("pending >= 0", name="pending_not_negative"),
)

# The history of durable workflows (``@app.workflow``): one row per step or sleep a run recorded,
# at its place (seq) in the run. Keyed by the job's id, it stays while the job moves between the
# three tables, and goes when the job is deleted for good (the triggers pgjobs_workflow_forget,
# and `pgjobs prune` before it drops an archive partition). The primary key is what makes a
# step's record happen once: a second run recording the same place waits for the first's
# transaction and then finds the place taken. Migration 0016.
pgjobs_workflow_history = Table(
    "pgjobs_workflow_history",
    metadata,
    Column("job_id", BigInteger, primary_key=True, autoincrement=False),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("kind", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("status", Text, nullable=False),
    # A step's JSON result (NULL for None); a sleep's none.
    Column("result", JSONB),
    # A failed step's last error, one line, and its exception's qualified type name.
    Column("error", Text),
    Column("error_type", Text),
    # A step's attempts so far (1 for a sleep).
    Column("attempts", Integer, nullable=False, server_default=text("1")),
    # Whether the step's own writes committed with its record (ctx.transaction()).
    Column("transactional", Boolean, nullable=False, server_default=text("false")),
    # When its first attempt started, and when it was recorded (the database's clock).
    Column("started_at", DateTime(timezone=True)),
    Column("recorded_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # A sleep's wake time, from the database's clock.
    Column("wake_at", DateTime(timezone=True)),
    _status_check("kind", WorkflowEntryKind),
    _status_check("status", WorkflowEntryStatus),
    CheckConstraint("seq >= 0", name="seq_not_negative"),
)

# Periodic schedules (`@app.periodic`), one row per schedule name, written by the scheduler of
# every worker that declares it. A due row is locked (FOR UPDATE SKIP LOCKED) while its
# occurrences are enqueued and next_run_at advanced, so each occurrence is enqueued once.
# Migration 0006.
pgjobs_schedules = Table(
    "pgjobs_schedules",
    metadata,
    Column("name", Text, primary_key=True),
    # What the declaring worker enqueues, as it last declared it (for listings).
    Column("task", Text, nullable=False),
    Column("queue", Text, nullable=False),
    # The cron expression, or "every <seconds>s".
    Column("schedule", Text, nullable=False),
    # The IANA timezone the cron expression is read in.
    Column("timezone", Text, nullable=False),
    # "last", "skip" or a number of missed occurrences to run.
    Column("catch_up", Text, nullable=False),
    # The first occurrence not enqueued yet.
    Column("next_run_at", DateTime(timezone=True), nullable=False),
    # The scheduled instant of the last occurrence enqueued, when it was enqueued, and its job.
    Column("last_run_at", DateTime(timezone=True)),
    Column("last_enqueued_at", DateTime(timezone=True)),
    Column("last_job_id", BigInteger),
    # When a worker last declared the schedule (refreshed every few seconds by each worker that
    # declares it); an old value means no running worker declares it any more.
    Column("declared_at", DateTime(timezone=True), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # `pgjobs schedule pause`: a paused schedule enqueues nothing until resumed (NULL: active);
    # who paused it. Migration 0013.
    Column("paused_at", DateTime(timezone=True)),
    Column("paused_by", Text),
)

# Events sent to workflow jobs (`app.send_event`), kept until the workflow's `ctx.wait_for`
# takes them (a taken event leaves; the workflow's history keeps its payload). Events of one
# name are taken oldest first. Mail of a job that has ended is swept by the maintenance round.
# Migration 0017.
pgjobs_events = Table(
    "pgjobs_events",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("job_id", BigInteger, nullable=False),
    Column("name", Text, nullable=False),
    Column("payload", JSONB, nullable=False, server_default=text("'null'::jsonb")),
    Column("sent_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Index("ix_pgjobs_events_job_id_name_id", "job_id", "name", "id"),
)

# The events a workflow job waits for (`ctx.wait_for`): while it has a row here, a send of that
# name makes the job ready at once; the row goes when the wait ends. Migration 0017.
pgjobs_event_waits = Table(
    "pgjobs_event_waits",
    metadata,
    Column("job_id", BigInteger, primary_key=True),
    Column("name", Text, primary_key=True),
    # When the wait times out (the job is suspended until then).
    Column("deadline", DateTime(timezone=True), nullable=False),
    Column("since", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)
