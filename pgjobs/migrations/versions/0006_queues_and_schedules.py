"""Queue settings (pause and resume) and periodic schedules

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23

* ``pgjobs_queues``: one row per queue that has a setting; a queue without a row has none (it is
  active). ``paused_at`` set means paused: the claim skips the queue's jobs, which stay ready.
  Written by `pgjobs queue pause/resume` (``pgjobs.queues``); read by every claim through the
  primary key, once per queue a worker serves. Later settings (per-queue limits) become columns
  of this table.
* ``pgjobs_schedules``: one row per periodic schedule a worker declared (``@app.periodic``). The
  scheduler of every worker locks a due row (``FOR UPDATE SKIP LOCKED``), enqueues its due
  occurrences and advances ``next_run_at`` in one transaction, so each occurrence is enqueued
  once however many workers run. Rows stay when the code stops declaring a schedule.

Online safety: two new, empty tables; nothing existing is touched. Workers of the previous
version ignore them. Downgrade drops them (pauses and schedule positions are lost).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pgjobs_queues",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("paused_by", sa.Text(), nullable=True),
        sa.Column("pause_reason", sa.Text(), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_pgjobs_queues")),
    )
    op.create_table(
        "pgjobs_schedules",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("schedule", sa.Text(), nullable=False),
        sa.Column("timezone", sa.Text(), nullable=False),
        sa.Column("catch_up", sa.Text(), nullable=False),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_enqueued_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_job_id", sa.BigInteger(), nullable=True),
        sa.Column("declared_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_pgjobs_schedules")),
    )


def downgrade() -> None:
    op.drop_table("pgjobs_schedules")
    op.drop_table("pgjobs_queues")
