"""Groups (per-group concurrency, ordered groups, turns between groups) and unique keys

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26

* ``group_key`` and ``unique_key`` on the three tables (they travel with the job), checked on
  ``queued_jobs`` (not empty, at most 512 bytes).
* ``pgjobs_queues.group_concurrency``: the most jobs of one group of the queue leased at once.
* ``pgjobs_group_states``: one row per (queue, group) with jobs, the claim's turn order and the
  version a claim checks its count of a group's running jobs against.
* ``pgjobs_throttles``: the window of each unique key of a throttled task.
* Indexes on ``queued_jobs``: a group's ready jobs (``ix_queued_jobs_group_ready``), its running
  jobs (``ix_queued_jobs_group_leased``), an ordered task's jobs in enqueue order
  (``ix_queued_jobs_group_order``) and the unique key of jobs not started
  (``uq_queued_jobs_unique_key``); the claim index leaves jobs of a group out. On
  ``dead_letter``: dead jobs by group (``ix_dead_letter_group_key_task``).

Online safety: the columns (nullable, no default), the tables and the queue setting are catalog
changes in one short transaction; the checks are added NOT VALID (no scan under the lock) and
validated afterwards, which lets writers go on. The indexes are built CONCURRENTLY outside any
transaction; the new claim index then takes the old one's name. A run interrupted half-way is run
again: an index left INVALID is dropped and rebuilt. Workers of the previous release go on
working on the migrated schema (they see no group and write none); a job enqueued with a group
by this release is claimed only by workers of this release: deploy them right after migrating.
Downgrade rebuilds the previous claim index the same way and drops what the upgrade added (jobs
of a group become ordinary jobs).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("queued_jobs", "archived_jobs", "dead_letter")

# (table, name, definition after ON table) of the indexes this revision builds, and of the claim
# index it replaces (built again by the downgrade).
NEW_INDEXES = (
    (
        "queued_jobs",
        "ix_queued_jobs_claim_0011",
        "(queue, priority DESC, run_at, id) "
        "WHERE lease_expires_at IS NULL AND limit_key IS NULL AND group_key IS NULL",
    ),
    (
        "queued_jobs",
        "ix_queued_jobs_group_ready",
        "(queue, group_key, priority DESC, run_at, id) "
        "WHERE lease_expires_at IS NULL AND group_key IS NOT NULL",
    ),
    (
        "queued_jobs",
        "ix_queued_jobs_group_leased",
        "(queue, group_key, task) WHERE lease_expires_at IS NOT NULL AND group_key IS NOT NULL",
    ),
    (
        "queued_jobs",
        "ix_queued_jobs_group_order",
        "(queue, group_key, task, id) WHERE group_key IS NOT NULL",
    ),
    (
        "queued_jobs",
        "uq_queued_jobs_unique_key",
        "(task, unique_key) WHERE unique_key IS NOT NULL AND started_at IS NULL",
    ),
    (
        "dead_letter",
        "ix_dead_letter_group_key_task",
        "(group_key, task) WHERE group_key IS NOT NULL",
    ),
)
OLD_INDEXES = (
    (
        "queued_jobs",
        "ix_queued_jobs_claim_0010",
        "(queue, priority DESC, run_at, id) WHERE lease_expires_at IS NULL AND limit_key IS NULL",
    ),
)
CHECKS = (
    ("ck_queued_jobs_group_key_size", "group_key <> '' AND octet_length(group_key) <= 512"),
    ("ck_queued_jobs_unique_key_size", "unique_key <> '' AND octet_length(unique_key) <= 512"),
)


def _build(indexes: tuple[tuple[str, str, str], ...]) -> None:
    """Build ``indexes`` CONCURRENTLY (call inside an autocommit block); one left INVALID by an
    interrupted run is dropped and built again."""
    for table, name, definition in indexes:
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
        unique = "UNIQUE " if name.startswith("uq_") else ""
        op.execute(
            f"CREATE {unique}INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} {definition}"
        )


def _swap_claim_index(incoming: str, dropped: tuple[str, ...] = ()) -> None:
    """Drop the claim index and ``dropped`` CONCURRENTLY (inside an autocommit block), then give
    ``incoming`` the claim index's name."""
    for name in ("ix_queued_jobs_claim", *dropped):
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    op.execute(f"ALTER INDEX IF EXISTS {incoming} RENAME TO ix_queued_jobs_claim")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("group_key", sa.Text(), nullable=True))
        op.add_column(table, sa.Column("unique_key", sa.Text(), nullable=True))
    for name, condition in CHECKS:
        op.execute(f"ALTER TABLE queued_jobs ADD CONSTRAINT {name} CHECK ({condition}) NOT VALID")
    op.add_column("pgjobs_queues", sa.Column("group_concurrency", sa.Integer(), nullable=True))
    op.create_check_constraint(
        op.f("ck_pgjobs_queues_group_concurrency_positive"),
        "pgjobs_queues",
        "group_concurrency >= 1",
    )
    op.create_table(
        "pgjobs_group_states",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("group_key", sa.Text(), nullable=False),
        sa.Column(
            "last_claim_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("'epoch'"),
            nullable=False,
        ),
        sa.Column(
            "touched_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("queue", "group_key", name=op.f("pk_pgjobs_group_states")),
    )
    op.create_index(
        op.f("ix_pgjobs_group_states_queue_last_claim_at"),
        "pgjobs_group_states",
        ["queue", "last_claim_at"],
    )
    op.create_table(
        "pgjobs_throttles",
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("unique_key", sa.Text(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("window_start_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("task", "unique_key", name=op.f("pk_pgjobs_throttles")),
    )
    with op.get_context().autocommit_block():
        # VALIDATE takes a lock that lets reads and writes go on while it scans.
        for name, _ in CHECKS:
            op.execute(f"ALTER TABLE queued_jobs VALIDATE CONSTRAINT {name}")
        _build(NEW_INDEXES)
        _swap_claim_index("ix_queued_jobs_claim_0011")


def downgrade() -> None:
    with op.get_context().autocommit_block():
        _build(OLD_INDEXES)
        _swap_claim_index(
            "ix_queued_jobs_claim_0010",
            tuple(name for _, name, _ in NEW_INDEXES if name != "ix_queued_jobs_claim_0011"),
        )
    # In the order a worker's statements lock them (queued_jobs first, then the archive and the
    # dead letter its trips write), as in 0009's downgrade.
    op.execute(
        "LOCK TABLE queued_jobs, archived_jobs, dead_letter, pgjobs_queues, pgjobs_group_states, "
        "pgjobs_throttles IN ACCESS EXCLUSIVE MODE"
    )
    op.drop_table("pgjobs_throttles")
    op.drop_table("pgjobs_group_states")
    op.drop_constraint(
        op.f("ck_pgjobs_queues_group_concurrency_positive"), "pgjobs_queues", type_="check"
    )
    op.drop_column("pgjobs_queues", "group_concurrency")
    for name, _ in CHECKS:
        op.execute(f"ALTER TABLE queued_jobs DROP CONSTRAINT IF EXISTS {name}")
    for table in reversed(TABLES):
        op.drop_column(table, "unique_key")
        op.drop_column(table, "group_key")
