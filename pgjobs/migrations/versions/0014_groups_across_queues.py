"""Groups across queues: a task's group concurrency and order hold per (task, group)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01

* ``pgjobs_groups``: one row per group, whatever its queues, filled from the groups that
  ``pgjobs_group_states`` holds. A claim locks it beside the group's (queue, group) row and
  trusts its count of the group's running jobs in every queue only when both are the versions its
  snapshot sees.
* ``pgjobs_group_touched()``, run by two triggers after each statement that inserts or updates
  rows of ``pgjobs_group_states`` (every enqueue into a group, every claim that starts its jobs,
  a redrive, the maintenance's restore): it writes the groups' rows of ``pgjobs_groups`` in group
  order, so that concurrent statements lock them in one order.
* ``pgjobs_group_holds``: the place in its group of a running job that ``pgjobs cancel
  --force`` archived, held while its handler may still run (until the worker says it ended, or
  the attempt's lease runs out).
* Indexes on ``queued_jobs``: a group's running jobs by group first
  (``ix_queued_jobs_group_running``: group, queue, task) and a task's jobs of a group in enqueue
  order whatever their queue (``ix_queued_jobs_group_sequence``: group, task, id), in place of
  ``ix_queued_jobs_group_leased`` and ``ix_queued_jobs_group_order`` (queue first).

Online safety: the tables, the function and the triggers are catalog changes in one short
transaction; CREATE TRIGGER waits for the statements writing ``pgjobs_group_states`` and holds
off new ones until the copy of its groups into ``pgjobs_groups`` commits, so no group is missed.
The indexes are built CONCURRENTLY outside any transaction, then the old ones dropped
CONCURRENTLY; a run interrupted half-way is run again: an index left INVALID is dropped and
rebuilt. Workers of the previous release go on working on the migrated schema, with a group's
limit and order per queue as before; deploy this release's workers right after migrating.
Downgrade builds the old indexes again the same way and drops what the upgrade added.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (name, definition after ON queued_jobs) of the indexes this revision builds, and of those it
# replaces (built again by the downgrade).
NEW_INDEXES = (
    (
        "ix_queued_jobs_group_running",
        "(group_key, queue, task) WHERE lease_expires_at IS NOT NULL AND group_key IS NOT NULL",
    ),
    ("ix_queued_jobs_group_sequence", "(group_key, task, id) WHERE group_key IS NOT NULL"),
)
OLD_INDEXES = (
    (
        "ix_queued_jobs_group_leased",
        "(queue, group_key, task) WHERE lease_expires_at IS NOT NULL AND group_key IS NOT NULL",
    ),
    ("ix_queued_jobs_group_order", "(queue, group_key, task, id) WHERE group_key IS NOT NULL"),
)

# Writes the rows of pgjobs_groups of the groups a statement inserted or updated in
# pgjobs_group_states (its transition table ``changed``), in group order.
FUNCTION = """
CREATE OR REPLACE FUNCTION pgjobs_group_touched() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pgjobs_groups AS g (group_key)
    SELECT DISTINCT group_key FROM changed
    ORDER BY group_key
    ON CONFLICT (group_key) DO UPDATE SET touched_at = clock_timestamp();
    RETURN NULL;
END
$$
"""

# A trigger with a transition table takes one event: one trigger for each.
TRIGGERS = (("pgjobs_group_inserted", "INSERT"), ("pgjobs_group_updated", "UPDATE"))


def _build(indexes: tuple[tuple[str, str], ...]) -> None:
    """Build ``indexes`` CONCURRENTLY (call inside an autocommit block); one left INVALID by an
    interrupted run is dropped and built again."""
    for name, definition in indexes:
        op.execute(
            f"""
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index
               WHERE indexrelid = to_regclass('{name}') AND NOT indisvalid) THEN
        DROP INDEX {name};
    END IF;
END $$
"""
        )
        op.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON queued_jobs {definition}")


def _drop(indexes: tuple[tuple[str, str], ...]) -> None:
    for name, _ in indexes:
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def upgrade() -> None:
    op.create_table(
        "pgjobs_groups",
        sa.Column("group_key", sa.Text(), nullable=False),
        sa.Column(
            "touched_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("group_key", name=op.f("pk_pgjobs_groups")),
    )
    op.create_table(
        "pgjobs_group_holds",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("group_key", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.Text(), nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_pgjobs_group_holds")),
    )
    op.create_index(op.f("ix_pgjobs_group_holds_group_key"), "pgjobs_group_holds", ["group_key"])
    op.execute(FUNCTION)
    for name, event in TRIGGERS:
        op.execute(
            f"CREATE TRIGGER {name} AFTER {event} ON pgjobs_group_states "
            "REFERENCING NEW TABLE AS changed FOR EACH STATEMENT "
            "EXECUTE FUNCTION pgjobs_group_touched()"
        )
    op.execute(
        "INSERT INTO pgjobs_groups (group_key) "
        "SELECT DISTINCT group_key FROM pgjobs_group_states ORDER BY group_key "
        "ON CONFLICT DO NOTHING"
    )
    with op.get_context().autocommit_block():
        _build(NEW_INDEXES)
        _drop(OLD_INDEXES)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        _build(OLD_INDEXES)
        _drop(NEW_INDEXES)
    for name, _ in TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {name} ON pgjobs_group_states")
    op.execute("DROP FUNCTION IF EXISTS pgjobs_group_touched()")
    op.drop_table("pgjobs_group_holds")
    op.drop_table("pgjobs_groups")
