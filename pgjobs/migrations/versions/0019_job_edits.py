"""Job edits: the record of who changed a queued job's fields, and when

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02

A queued job that has not started may be edited (`pgjobs job edit`, ``PATCH /api/v1/jobs/{id}``,
the dashboard's job page): its priority, run time, payload, max attempts and tags. This revision
adds ``pgjobs_job_edits``, one row per edit: the job's id, when, who, and the fields it changed
with their old and new values (``changes``, a JSON object). The row is keyed by the job's id,
which the job keeps in every table, so no job table changes.

Online safety: a new, empty table and its index, in one short transaction; nothing else is
locked. Workers of the previous release keep working on the migrated schema (they never read
it). Downgrade drops the table (and with it the record of past edits; the jobs keep their edited
values).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pgjobs_job_edits",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "edited_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("edited_by", sa.Text(), nullable=False),
        sa.Column("changes", JSONB(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pgjobs_job_edits")),
    )
    op.create_index(op.f("ix_pgjobs_job_edits_job_id"), "pgjobs_job_edits", ["job_id", "id"])


def downgrade() -> None:
    op.drop_table("pgjobs_job_edits")
