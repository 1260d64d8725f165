"""The fleet's tables: the workers, the queues' settings, the state of limits and rates, and
the periodic schedules."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    Integer,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY

from pgjobs.schema.base import metadata

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
    # `pgjobs queue limit --group-rate`: at most group_rate_jobs starts of one group of the
    # queue per group_rate_seconds, in any window of that length (both NULL: no group rate).
    # Migration 0017.
    Column("group_rate_jobs", Integer),
    Column("group_rate_seconds", Float),
    CheckConstraint("concurrency >= 1", name="concurrency_positive"),
    CheckConstraint("group_concurrency >= 1", name="group_concurrency_positive"),
    CheckConstraint(
        "(rate_jobs IS NULL) = (rate_seconds IS NULL) AND rate_jobs >= 1 AND rate_seconds > 0",
        name="rate_complete",
    ),
    CheckConstraint(
        "(group_rate_jobs IS NULL) = (group_rate_seconds IS NULL) "
        "AND group_rate_jobs >= 1 AND group_rate_seconds > 0",
        name="group_rate_complete",
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
