"""The tables that hold groups to their limits and turns, group rates and throttled keys."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    Table,
    Text,
    text,
)

from pgjobs.schema.base import metadata

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


# The starts of each group under a group rate (a queue's, `pgjobs queue limit --group-rate`, per
# (queue, group); a task's, ``group_rate=``, per (task, group) in every queue): one row per claim
# that started jobs of the group under the rate, at the claim's now() (the jobs' started_at), with
# the rate it obeyed. A claim counts a group's rows of the last period (a sliding window) only
# while it holds the group's rows of pgjobs_group_states and pgjobs_groups locked and current
# (every claim that writes rows here writes those), so no start committed meanwhile is missed.
# Rows older than their period are removed by the maintenance services. Migration 0017.
pgjobs_group_starts = Table(
    "pgjobs_group_starts",
    metadata,
    Column("group_key", Text, primary_key=True),
    # 'task' or 'queue', and the task's or queue's name.
    Column("kind", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    Column("started_at", DateTime(timezone=True), primary_key=True),
    # Jobs of the group the claim started under the rate.
    Column("jobs", Integer, nullable=False),
    # The rate the claim obeyed: at most rate_jobs starts per rate_seconds.
    Column("rate_jobs", Integer, nullable=False),
    Column("rate_seconds", Float, nullable=False),
    CheckConstraint("kind IN ('task', 'queue')", name="kind"),
    Index("ix_pgjobs_group_starts_started_at", "started_at"),
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
