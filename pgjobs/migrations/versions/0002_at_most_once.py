"""At-most-once tasks: queued_jobs.at_most_once, and dead_letter reason 'interrupted'

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21

Adding a NOT NULL column with a constant default is a catalog-only change in PostgreSQL 11+:
no table rewrite, a brief ACCESS EXCLUSIVE lock. The new CHECK constraint on dead_letter is
added NOT VALID and validated separately, so validation does not block writers.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


OLD_REASONS = ("exhausted", "non_retryable", "lease_expired", "unknown_task", "invalid_payload")
NEW_REASONS = (*OLD_REASONS, "interrupted")


def _replace_reason_check(reasons: tuple[str, ...]) -> None:
    listed = ", ".join(f"'{reason}'" for reason in reasons)
    op.drop_constraint(op.f("ck_dead_letter_reason"), "dead_letter", type_="check")
    op.execute(
        f"ALTER TABLE dead_letter ADD CONSTRAINT ck_dead_letter_reason "
        f"CHECK (reason IN ({listed})) NOT VALID"
    )
    op.execute("ALTER TABLE dead_letter VALIDATE CONSTRAINT ck_dead_letter_reason")


def upgrade() -> None:
    op.add_column(
        "queued_jobs",
        sa.Column("at_most_once", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    _replace_reason_check(NEW_REASONS)


def downgrade() -> None:
    # Rows that only the new revision allows cannot stay; keep them as lease_expired.
    op.execute("UPDATE dead_letter SET reason = 'lease_expired' WHERE reason = 'interrupted'")
    _replace_reason_check(OLD_REASONS)
    op.drop_column("queued_jobs", "at_most_once")
