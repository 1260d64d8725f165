"""Durable workflows: the history of their steps and sleeps, forgotten with the job

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02

* ``pgjobs_workflow_history``: one row per step or sleep a workflow's run recorded, keyed by
  (job_id, seq). It stays while the job moves between the three tables (a redrive resumes from
  it) and goes when the job is deleted for good.
* ``pgjobs_workflow_forget()`` and its statement triggers on ``archived_jobs`` and
  ``dead_letter`` (``AFTER DELETE ... REFERENCING OLD TABLE``): a retention delete or a purge
  forgets the history of the jobs it deleted (`pgjobs prune` forgets a partition's before it
  drops it: a drop fires no trigger).
* ``dead_letter.reason`` is widened with ``workflow_diverged``.

Online safety: a new table and a statement trigger on deletes only (no worker's statement
deletes from the archive or the dead letter: the hot path pays nothing); the wider reason check
is added NOT VALID under a temporary name and validated outside any transaction, then takes the
old check's name, as in 0012. Workers of the previous release keep working on the migrated
schema. Downgrade turns ``workflow_diverged`` rows into ``non_retryable``, drops the triggers,
the function and the table, then narrows the check the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_REASONS = (
    "exhausted",
    "non_retryable",
    "lease_expired",
    "unknown_task",
    "invalid_payload",
    "interrupted",
    "timeout",
    "snoozed_out",
    "dependency_failed",
)
NEW_REASONS = (*OLD_REASONS, "workflow_diverged")

CHECK = "ck_dead_letter_reason"
INCOMING = "ck_dead_letter_reason_incoming"

#: The function as this revision creates it (queries.WORKFLOW_FORGET_FUNCTION is the current
#: text; tests/integration/schema/test_trigger_text.py compares the two).
FORGET_FUNCTION = """
CREATE OR REPLACE FUNCTION pgjobs_workflow_forget() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM pgjobs_workflow_history h
    USING gone g
    WHERE h.job_id = g.id
      AND NOT EXISTS (SELECT 1 FROM queued_jobs q WHERE q.id = g.id)
      AND NOT EXISTS (SELECT 1 FROM dead_letter d WHERE d.id = g.id)
      AND NOT EXISTS (SELECT 1 FROM archived_jobs a WHERE a.id = g.id);
    RETURN NULL;
END
$fn$
"""

FORGET_TABLES = ("archived_jobs", "dead_letter")


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
    op.execute(
        """
CREATE TABLE pgjobs_workflow_history (
    job_id bigint NOT NULL,
    seq integer NOT NULL,
    kind text NOT NULL,
    name text NOT NULL,
    status text NOT NULL,
    result jsonb,
    error text,
    error_type text,
    attempts integer DEFAULT 1 NOT NULL,
    transactional boolean DEFAULT false NOT NULL,
    started_at timestamp with time zone,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    wake_at timestamp with time zone,
    CONSTRAINT pk_pgjobs_workflow_history PRIMARY KEY (job_id, seq),
    CONSTRAINT ck_pgjobs_workflow_history_kind CHECK (kind IN ('step', 'sleep')),
    CONSTRAINT ck_pgjobs_workflow_history_status
        CHECK (status IN ('done', 'failed', 'retrying')),
    CONSTRAINT ck_pgjobs_workflow_history_seq_not_negative CHECK (seq >= 0)
)
"""
    )
    op.execute(FORGET_FUNCTION)
    for table in FORGET_TABLES:
        op.execute(
            f"CREATE TRIGGER pgjobs_workflow_forget AFTER DELETE ON {table} "
            "REFERENCING OLD TABLE AS gone FOR EACH STATEMENT "
            "EXECUTE FUNCTION pgjobs_workflow_forget()"
        )
    _replace_reason_check(NEW_REASONS)


def downgrade() -> None:
    op.execute("UPDATE dead_letter SET reason = 'non_retryable' WHERE reason = 'workflow_diverged'")
    for table in FORGET_TABLES:
        op.execute(f"DROP TRIGGER IF EXISTS pgjobs_workflow_forget ON {table}")
    op.execute("DROP FUNCTION IF EXISTS pgjobs_workflow_forget()")
    op.execute("DROP TABLE IF EXISTS pgjobs_workflow_history")
    _replace_reason_check(OLD_REASONS)
