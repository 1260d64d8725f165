"""Dead-letter reason 'timeout': a job whose handler ran past its task's timeout on its last attempt

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23

``dead_letter.reason`` is checked against the reasons pgjobs knows (``DeadReason``). This
revision widens the check with ``timeout``.

Online safety: the wider check is added under a temporary name ``NOT VALID`` (a brief lock, no
scan) and validated outside any transaction (``VALIDATE CONSTRAINT`` scans dead_letter under a
lock that lets writers go on); only then, in one short transaction, the old check is dropped
and the new one takes its name. Every row valid under the old check is valid under the new one,
so the validation cannot fail. A run interrupted half-way is simply run again: the temporary
check is dropped first if it is left over.

Downgrade turns the ``timeout`` rows into ``exhausted`` (what they were before this revision:
failed on the last attempt; their last_error still says "timeout: ...") and narrows the check
the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_REASONS = (
    "exhausted",
    "non_retryable",
    "lease_expired",
    "unknown_task",
    "invalid_payload",
    "interrupted",
)
NEW_REASONS = (*OLD_REASONS, "timeout")

CHECK = "ck_dead_letter_reason"
#: The wider (or narrower) check while both exist.
INCOMING = "ck_dead_letter_reason_incoming"


def _replace_reason_check(reasons: tuple[str, ...]) -> None:
    listed = ", ".join(f"'{reason}'" for reason in reasons)
    # The slow part (a scan of dead_letter) outside a transaction: no lock held while it scans.
    with op.get_context().autocommit_block():
        op.execute(f"ALTER TABLE dead_letter DROP CONSTRAINT IF EXISTS {INCOMING}")
        op.execute(
            f"ALTER TABLE dead_letter ADD CONSTRAINT {INCOMING} "
            f"CHECK (reason IN ({listed})) NOT VALID"
        )
        op.execute(f"ALTER TABLE dead_letter VALIDATE CONSTRAINT {INCOMING}")
    # Catalog changes only, in the migration's transaction.
    op.execute(f"ALTER TABLE dead_letter DROP CONSTRAINT {CHECK}")
    op.execute(f"ALTER TABLE dead_letter RENAME CONSTRAINT {INCOMING} TO {CHECK}")


def upgrade() -> None:
    _replace_reason_check(NEW_REASONS)


def downgrade() -> None:
    op.execute("UPDATE dead_letter SET reason = 'exhausted' WHERE reason = 'timeout'")
    _replace_reason_check(OLD_REASONS)
