"""Workflow events: a mailbox per workflow job, and the waits that a send wakes

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02

* ``pgjobs_events``: events sent to a workflow job (``app.send_event``), kept until its
  ``ctx.wait_for`` takes them, oldest first per name (index on ``(job_id, name, id)``).
* ``pgjobs_event_waits``: the events a suspended workflow waits for, with the wait's deadline;
  a send of that name makes the job ready at once.

Online safety: two new, empty tables, created in one short transaction; no existing table is
touched, so workers of the previous release go on working. Downgrade drops them (events not yet
taken are lost with them).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


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


def downgrade() -> None:
    op.drop_table("pgjobs_event_waits")
    op.drop_table("pgjobs_events")
