"""Operations: a redrive record and a replay link on every job, wherever it lives

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22

All three tables get the same three columns, so they travel with a job from table to table:

* ``redrive_count`` (int, 0) and ``redriven_at``: how many times `pgjobs dead redrive` sent the
  job back from dead_letter to queued_jobs, and when it last did;
* ``replay_of``: the id of the job that `pgjobs replay` copied into this new job (NULL for a job
  that is not a replay), with a partial index per table to find the replays of a job.

Adding a nullable column, or a NOT NULL one with a constant default, is a catalog-only change in
PostgreSQL 11+: no table rewrite, a brief ACCESS EXCLUSIVE lock. The partial indexes start empty
(no existing row is a replay), so building them scans each table once but writes nothing; they
are built with a plain CREATE INDEX inside the migration's transaction. Downgrade drops the
columns and their indexes, with data in place: the redrive records and replay links are lost,
the jobs are not.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("queued_jobs", "archived_jobs", "dead_letter")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(
            table,
            sa.Column("redrive_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        )
        op.add_column(table, sa.Column("redriven_at", sa.DateTime(timezone=True), nullable=True))
        op.add_column(table, sa.Column("replay_of", sa.BigInteger(), nullable=True))
        op.create_index(
            f"ix_{table}_replay_of",
            table,
            ["replay_of"],
            unique=False,
            postgresql_where=sa.text("replay_of IS NOT NULL"),
        )


def downgrade() -> None:
    # In the order a worker's moves lock the tables (queued_jobs, then archived_jobs or
    # dead_letter): the reverse could deadlock with a settle in flight.
    for table in TABLES:
        op.drop_index(f"ix_{table}_replay_of", table_name=table)
        op.drop_column(table, "replay_of")
        op.drop_column(table, "redriven_at")
        op.drop_column(table, "redrive_count")
