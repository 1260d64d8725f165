"""Snoozes: a handler may put its job back for later without spending an attempt

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26

* ``snoozes`` on the three tables (it travels with the job): how many times the job's handler
  snoozed it (``raise pgjobs.Snooze(seconds)``); a task's ``max_snoozes`` bounds it.
* ``dead_letter.reason`` is widened with ``snoozed_out``: a job that snoozed more than its task's
  ``max_snoozes`` times.

Online safety: a NOT NULL column with a constant default is a catalog change since PostgreSQL 11
(no rewrite of the hot table nor of the archive's partitions), in one short transaction. The
wider reason check is added NOT VALID under a temporary name and validated outside any
transaction, then takes the old check's name, as in 0008. Workers of the previous release go on
working on the migrated schema (their jobs never snooze). Downgrade locks the three tables in the
order a worker's statements do, turns the ``snoozed_out`` rows into ``non_retryable`` (what the
previous release would have made of a handler's exception) and drops the columns, then narrows
the check the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("queued_jobs", "archived_jobs", "dead_letter")

OLD_REASONS = (
    "exhausted",
    "non_retryable",
    "lease_expired",
    "unknown_task",
    "invalid_payload",
    "interrupted",
    "timeout",
)
NEW_REASONS = (*OLD_REASONS, "snoozed_out")

CHECK = "ck_dead_letter_reason"
#: The wider (or narrower) check while both exist.
INCOMING = "ck_dead_letter_reason_incoming"


def _replace_reason_check(reasons: tuple[str, ...]) -> None:
    listed = ", ".join(f"'{reason}'" for reason in reasons)
    with op.get_context().autocommit_block():
        op.execute(f"ALTER TABLE dead_letter DROP CONSTRAINT IF EXISTS {INCOMING}")
        op.execute(
            f"ALTER TABLE dead_letter ADD CONSTRAINT {INCOMING} "
            f"CHECK (reason IN ({listed})) NOT VALID"
        )
        op.execute(f"ALTER TABLE dead_letter VALIDATE CONSTRAINT {INCOMING}")
    op.execute(f"ALTER TABLE dead_letter DROP CONSTRAINT {CHECK}")
    op.execute(f"ALTER TABLE dead_letter RENAME CONSTRAINT {INCOMING} TO {CHECK}")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(
            table,
            sa.Column("snoozes", sa.Integer(), server_default=sa.text("0"), nullable=False),
        )
    _replace_reason_check(NEW_REASONS)


def downgrade() -> None:
    # In the order a worker's statements lock them (queued_jobs first, then the archive and the
    # dead letter), before anything else: a downgrade that began with dead_letter deadlocked
    # with a worker's trip that held queued_jobs and waited for dead_letter.
    op.execute("LOCK TABLE queued_jobs, archived_jobs, dead_letter IN ACCESS EXCLUSIVE MODE")
    op.execute("UPDATE dead_letter SET reason = 'non_retryable' WHERE reason = 'snoozed_out'")
    for table in reversed(TABLES):
        op.drop_column(table, "snoozes")
    # Its own transaction, which touches dead_letter alone.
    _replace_reason_check(OLD_REASONS)
