"""queued_jobs, archived_jobs and dead_letter

Revision ID: 0001
Revises:
Create Date: 2026-11-21

The three tables a job moves between, with the indexes of the hot paths: the claim (ready rows
by queue, priority, run_at), the lease rescuer, the expirer, idempotency keys, and triage by time.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "archived_jobs",
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("run_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("worker", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "finished_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "status IN ('succeeded', 'cancelled', 'expired')", name=op.f("ck_archived_jobs_status")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_archived_jobs")),
    )
    op.create_index("ix_archived_jobs_finished_at", "archived_jobs", ["finished_at"], unique=False)
    op.create_index(
        "ix_archived_jobs_idempotency_key",
        "archived_jobs",
        ["idempotency_key"],
        unique=False,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.create_table(
        "dead_letter",
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("run_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("error_type", sa.Text(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("traceback", sa.Text(), nullable=True),
        sa.Column("worker", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "failed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "reason IN ('exhausted', 'non_retryable', 'lease_expired', 'unknown_task', 'invalid_payload')",
            name=op.f("ck_dead_letter_reason"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dead_letter")),
    )
    op.create_index("ix_dead_letter_failed_at", "dead_letter", ["failed_at"], unique=False)
    op.create_index(
        "ix_dead_letter_idempotency_key",
        "dead_letter",
        ["idempotency_key"],
        unique=False,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.create_index(
        "ix_dead_letter_task_failed_at", "dead_letter", ["task", "failed_at"], unique=False
    )
    op.create_table(
        "queued_jobs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("queue", sa.Text(), server_default=sa.text("'default'"), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column(
            "payload",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("priority", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "run_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), server_default=sa.text("5"), nullable=False),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_queued_jobs_attempts_not_negative")),
        sa.CheckConstraint("max_attempts >= 1", name=op.f("ck_queued_jobs_max_attempts_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_queued_jobs")),
    )
    op.create_index(
        "ix_queued_jobs_claim",
        "queued_jobs",
        ["queue", sa.literal_column("priority DESC"), "run_at", "id"],
        unique=False,
        postgresql_where=sa.text("lease_expires_at IS NULL"),
    )
    op.create_index(
        "ix_queued_jobs_expires_at",
        "queued_jobs",
        ["expires_at"],
        unique=False,
        postgresql_where=sa.text("expires_at IS NOT NULL"),
    )
    op.create_index(
        "ix_queued_jobs_lease_expires_at",
        "queued_jobs",
        ["lease_expires_at"],
        unique=False,
        postgresql_where=sa.text("lease_expires_at IS NOT NULL"),
    )
    op.create_index(
        "uq_queued_jobs_idempotency_key",
        "queued_jobs",
        ["idempotency_key"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )


def downgrade() -> None:
    # Dropping a table drops its indexes and constraints.
    op.drop_table("queued_jobs")
    op.drop_table("dead_letter")
    op.drop_table("archived_jobs")
