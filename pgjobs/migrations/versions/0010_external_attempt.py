"""The attempt of a job claimed for delivery to an external task's downstream

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26

``queued_jobs.external_attempt``: set by every claim, to the attempt it starts when a worker
claims the job of a task it delivers (``app.external_task``), else NULL. A reported outcome
(``POST /api/v1/jobs/{id}/outcome``) settles only that attempt, so that a report can never
settle a job a Python handler is running.

Online safety: a nullable column without a default is a catalog change (no rewrite), in one
short transaction. Workers of the previous release go on working on the migrated schema (they
leave the column NULL); jobs they deliver cannot be reported until workers of this release claim
them: deploy the new workers right after migrating. Downgrade drops the column.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("queued_jobs", sa.Column("external_attempt", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("queued_jobs", "external_attempt")
