"""Payload versions and trace context, on every table

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23

* ``payload_version`` (integer, NULL): the version of the payload's shape a job was enqueued
  with (``@app.task(version=2, upgrade={1: ...})``); NULL is version 1, what every job enqueued
  before this revision (or for an unversioned task) holds. A worker upgrades an older payload
  before running it and gives a newer one back for another worker.
* ``trace_context`` (jsonb, NULL): the W3C trace context (``traceparent``, ``tracestate``) of the
  span that enqueued the job, when the producer traces with OpenTelemetry; the worker's span for
  the job is its child.

Both travel with the job to ``archived_jobs`` and ``dead_letter`` (a redriven job keeps them).

Online safety: adding nullable columns without a default is a catalog-only change (no table
rewrite, no scan), under a brief ACCESS EXCLUSIVE lock per table, taken with the lock_timeout of
`pgjobs migrate` (5 s by default). On the partitioned ``archived_jobs`` the columns are added to
every partition in the same statement. Workers of the previous version keep working during the
upgrade: they name the columns they read and write, so their jobs carry NULL in both (version 1,
no trace). Downgrade drops the columns, with the rows in place (versions and trace contexts are
lost: every job then counts as version 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("queued_jobs", "archived_jobs", "dead_letter")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("payload_version", sa.Integer(), nullable=True))
        op.add_column(table, sa.Column("trace_context", JSONB(), nullable=True))


def downgrade() -> None:
    # In the order a worker's moves lock the tables (queued_jobs, then archived_jobs or
    # dead_letter), not the reverse: a settle in flight holding queued_jobs while this holds
    # archived_jobs would deadlock with it.
    for table in TABLES:
        op.drop_column(table, "trace_context")
        op.drop_column(table, "payload_version")
