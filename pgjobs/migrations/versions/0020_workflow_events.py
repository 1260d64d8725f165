"""Workflow events and children: a mailbox per workflow job, the waits a send wakes, and the
batch of a workflow's children that wakes it when the last one ends

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02

* ``pgjobs_events``: events sent to a workflow job (``app.send_event``), kept until its
  ``ctx.wait_for`` takes them, oldest first per name (index on ``(job_id, name, id)``).
* ``pgjobs_event_waits``: the events a suspended workflow waits for, with the wait's deadline;
  a send of that name makes the job ready at once.
* ``pgjobs_workflow_history``: two more kinds of entry (``event``, ``children``) and a status
  for a wait not ended yet (``waiting``).
* ``pgjobs_batches.parent_job_id``: the workflow whose children (``ctx.map``) the batch's
  members are; the row trigger ``pgjobs_children_ended`` makes it ready when the last one ends.

Online safety: two new, empty tables; a nullable column without a default on the batches (a
catalog change, no rewrite); a function and a trigger on that small table; all in one short
transaction. Workers of the previous release go on working (their batches have no parent, so
the trigger's condition is false for them). Downgrade drops them (events not yet taken are lost
with them; a workflow waiting for its children then waits until someone redrives it).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


#: The history's checks, before and after this revision: (constraint, column, old, new values).
CHECKS = (
    (
        "ck_pgjobs_workflow_history_kind",
        "kind",
        ("step", "sleep"),
        ("step", "sleep", "event", "children"),
    ),
    (
        "ck_pgjobs_workflow_history_status",
        "status",
        ("done", "failed", "retrying"),
        ("done", "failed", "retrying", "waiting"),
    ),
)


def _replace_checks(new: bool) -> None:
    """The history's checks widened (or narrowed back): added NOT VALID under a temporary name,
    validated outside the transaction's lock, then renamed, as 0012 does for dead_letter."""
    for name, column, old_values, new_values in CHECKS:
        values = new_values if new else old_values
        listed = ", ".join(f"'{value}'" for value in values)
        incoming = f"{name}_incoming"
        op.execute(f"ALTER TABLE pgjobs_workflow_history DROP CONSTRAINT IF EXISTS {incoming}")
        op.execute(
            f"ALTER TABLE pgjobs_workflow_history ADD CONSTRAINT {incoming} "
            f"CHECK ({column} IN ({listed})) NOT VALID"
        )
        op.execute(f"ALTER TABLE pgjobs_workflow_history VALIDATE CONSTRAINT {incoming}")
        op.execute(f"ALTER TABLE pgjobs_workflow_history DROP CONSTRAINT {name}")
        op.execute(f"ALTER TABLE pgjobs_workflow_history RENAME CONSTRAINT {incoming} TO {name}")


# The function as this revision creates it (pgjobs.queries.triggers shows the current text).
CHILDREN_ENDED_FUNCTION = """
CREATE OR REPLACE FUNCTION pgjobs_children_ended() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    woken bigint;
BEGIN
    WITH released AS (
        UPDATE queued_jobs q SET run_at = now()
        WHERE q.id = NEW.parent_job_id AND q.lease_expires_at IS NULL AND q.run_at > now()
        RETURNING q.queue
    )
    SELECT count(pg_notify('pgjobs', queue)) INTO woken FROM released;
    RETURN NULL;
END
$fn$
"""

CHILDREN_ENDED_TRIGGER = """
CREATE TRIGGER pgjobs_children_ended AFTER UPDATE OF pending ON pgjobs_batches
FOR EACH ROW WHEN (NEW.pending = 0 AND OLD.pending > 0 AND NEW.parent_job_id IS NOT NULL)
EXECUTE FUNCTION pgjobs_children_ended()
"""


def upgrade() -> None:
    op.create_table(
        "pgjobs_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), primary_key=True),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("payload", JSONB(), server_default=sa.text("'null'::jsonb"), nullable=False),
        sa.Column(
            "sent_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name="pk_pgjobs_events"),
    )
    op.create_index("ix_pgjobs_events_job_id_name_id", "pgjobs_events", ["job_id", "name", "id"])
    op.create_table(
        "pgjobs_event_waits",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "since", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("job_id", "name", name="pk_pgjobs_event_waits"),
    )
    op.add_column("pgjobs_batches", sa.Column("parent_job_id", sa.BigInteger(), nullable=True))
    op.execute(CHILDREN_ENDED_FUNCTION)
    op.execute(CHILDREN_ENDED_TRIGGER)
    _replace_checks(new=True)


def downgrade() -> None:
    # The waits' entries go with the tables they wait on (their workflows then run from there).
    op.execute(
        "DELETE FROM pgjobs_workflow_history WHERE kind IN ('event', 'children') "
        "OR status = 'waiting'"
    )
    _replace_checks(new=False)
    op.execute("DROP TRIGGER IF EXISTS pgjobs_children_ended ON pgjobs_batches")
    op.execute("DROP FUNCTION IF EXISTS pgjobs_children_ended()")
    op.drop_column("pgjobs_batches", "parent_job_id")
    op.drop_table("pgjobs_event_waits")
    op.drop_table("pgjobs_events")
