"""What every table of pgjobs' schema shares: the MetaData (its naming convention), the CHECK
built from an enum, and the columns every job table carries so that they travel with the job."""

from __future__ import annotations

import enum

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.schema import SchemaItem

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
