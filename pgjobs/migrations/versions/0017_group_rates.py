"""Group rates: at most N starts of one group per period, a queue's or a task's

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02

* ``pgjobs_queues.group_rate_jobs`` and ``group_rate_seconds``: `pgjobs queue limit
  --group-rate 10/m`, at most so many starts of one group of the queue per period (both NULL: no
  group rate).
* ``pgjobs_group_starts``: the starts of each group under a group rate, one row per claim that
  started its jobs, per (group, queue) for a queue's group rate and per (group, task) for a
  task's, with the rate the claim obeyed. A claim counts a group's rows of the last period (a
  sliding window) only while it holds the group's rows locked and current, as for the group's
  running jobs; the maintenance services remove the rows older than their period.

Online safety: two nullable columns and a new table, catalog changes in one short transaction;
nothing is rewritten. Workers of the previous release go on working on the migrated schema and
ignore group rates (they neither read nor write the new table): deploy this release's workers
right after migrating, before setting a group rate. Downgrade drops what the upgrade added.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("pgjobs_queues", sa.Column("group_rate_jobs", sa.Integer(), nullable=True))
    op.add_column("pgjobs_queues", sa.Column("group_rate_seconds", sa.Float(), nullable=True))
    op.create_check_constraint(
        op.f("ck_pgjobs_queues_group_rate_complete"),
        "pgjobs_queues",
        "(group_rate_jobs IS NULL) = (group_rate_seconds IS NULL) "
        "AND group_rate_jobs >= 1 AND group_rate_seconds > 0",
    )
    op.create_table(
        "pgjobs_group_starts",
        sa.Column("group_key", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("rate_jobs", sa.Integer(), nullable=False),
        sa.Column("rate_seconds", sa.Float(), nullable=False),
        sa.CheckConstraint("kind IN ('task', 'queue')", name=op.f("ck_pgjobs_group_starts_kind")),
        sa.PrimaryKeyConstraint(
            "group_key", "kind", "name", "started_at", name=op.f("pk_pgjobs_group_starts")
        ),
    )
    op.create_index(
        op.f("ix_pgjobs_group_starts_started_at"), "pgjobs_group_starts", ["started_at"]
    )


def downgrade() -> None:
    op.drop_table("pgjobs_group_starts")
    op.drop_constraint(op.f("ck_pgjobs_queues_group_rate_complete"), "pgjobs_queues", type_="check")
    op.drop_column("pgjobs_queues", "group_rate_seconds")
    op.drop_column("pgjobs_queues", "group_rate_jobs")
