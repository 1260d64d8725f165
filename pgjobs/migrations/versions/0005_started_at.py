"""Run time: when a job's latest attempt started, on every table

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

``started_at`` (timestamptz, NULL until a worker first claims the job) is set by the claim to the
start of the attempt and travels with the job to ``archived_jobs`` and ``dead_letter``, so that
run time (``finished_at - started_at``) and pickup latency (``started_at - run_at``) are plain
SQL, and the metrics of `pgjobs serve` can be read from the tables.

Online safety: adding a nullable column without a default is a catalog-only change (no table
rewrite, no scan), under a brief ACCESS EXCLUSIVE lock per table, taken with the lock_timeout of
`pgjobs migrate` (5 s by default) so that it never queues workers behind a long transaction. On
the partitioned ``archived_jobs`` the column is added to every partition in the same statement.
Workers of the previous version keep working during the upgrade: they name the columns they
write, so their rows simply carry no ``started_at``. Downgrade drops the column, with the rows in
place.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("queued_jobs", "archived_jobs", "dead_letter")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("started_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # In the order a worker's moves lock the tables (queued_jobs, then archived_jobs or
    # dead_letter): the reverse could deadlock with a settle in flight.
    for table in TABLES:
        op.drop_column(table, "started_at")
