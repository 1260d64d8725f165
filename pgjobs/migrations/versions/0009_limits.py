"""Concurrency and rate limits: per task and per queue, held by the claim

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25

* ``pgjobs_queues`` gets ``concurrency`` (the most jobs of the queue leased at once) and
  ``rate_jobs`` / ``rate_seconds`` (at most so many starts per period), set by `pgjobs queue
  limit`; NULL means no limit.
* ``pgjobs_limit_states``: the state of every limited task or queue (a rate's token bucket,
  and when a claim last started jobs under the limit), locked by the claims that may take jobs
  under it.
* ``queued_jobs.limit_key``: the task whose limit a job counts against and waits for, set by
  the claims of workers that limit the task. The claim index now covers only ready jobs without
  one (``ix_queued_jobs_claim``); held-back jobs of a limited task have their own range per queue
  (``ix_queued_jobs_limit_ready``), and a limited task's running jobs are counted from
  ``ix_queued_jobs_limit_leased``. The lease index gains the queue as its first column
  (``ix_queued_jobs_queue_lease_expires_at``), so that a queue's running jobs are one index range.

Online safety: the new column, the queue settings and the table are catalog changes in one short
transaction. The indexes are built CONCURRENTLY outside any transaction
(writers go on), then the old claim and lease indexes are dropped CONCURRENTLY and the new claim
index takes the old one's name. A run interrupted half-way is run again: an index left INVALID
is dropped and rebuilt. Workers of the previous release go on working on the migrated schema,
but their claim cannot use the new claim index (its condition names ``limit_key``) and sorts
their queues' ready jobs instead, which grows slow with deep queues: deploy the new release
right after migrating. Downgrade rebuilds the old indexes the same way, then drops the table, the
settings and the column (held-back jobs become ordinary ready jobs).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (name, definition after ON queued_jobs) of the indexes this revision builds, and of those it
# replaces (built again by the downgrade).
NEW_INDEXES = (
    (
        "ix_queued_jobs_claim_0009",
        "(queue, priority DESC, run_at, id) WHERE lease_expires_at IS NULL AND limit_key IS NULL",
    ),
    (
        "ix_queued_jobs_limit_ready",
        "(queue, limit_key, priority DESC, run_at, id) "
        "WHERE lease_expires_at IS NULL AND limit_key IS NOT NULL",
    ),
    (
        "ix_queued_jobs_limit_leased",
        "(limit_key) WHERE lease_expires_at IS NOT NULL AND limit_key IS NOT NULL",
    ),
    (
        "ix_queued_jobs_queue_lease_expires_at",
        "(queue, lease_expires_at) WHERE lease_expires_at IS NOT NULL",
    ),
)
OLD_INDEXES = (
    (
        "ix_queued_jobs_claim_0008",
        "(queue, priority DESC, run_at, id) WHERE lease_expires_at IS NULL",
    ),
    (
        "ix_queued_jobs_lease_expires_at",
        "(lease_expires_at) WHERE lease_expires_at IS NOT NULL",
    ),
)


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


def _swap_claim_index(incoming: str, dropped: tuple[str, ...]) -> None:
    """Drop ``dropped`` CONCURRENTLY, the claim index among them (call inside an autocommit
    block), then give ``incoming`` the claim index's name."""
    for name in ("ix_queued_jobs_claim", *dropped):
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    op.execute(f"ALTER INDEX IF EXISTS {incoming} RENAME TO ix_queued_jobs_claim")


def upgrade() -> None:
    op.add_column("queued_jobs", sa.Column("limit_key", sa.Text(), nullable=True))
    op.add_column("pgjobs_queues", sa.Column("concurrency", sa.Integer(), nullable=True))
    op.add_column("pgjobs_queues", sa.Column("rate_jobs", sa.Integer(), nullable=True))
    op.add_column("pgjobs_queues", sa.Column("rate_seconds", sa.Float(), nullable=True))
    op.create_check_constraint(
        op.f("ck_pgjobs_queues_concurrency_positive"), "pgjobs_queues", "concurrency >= 1"
    )
    op.create_check_constraint(
        op.f("ck_pgjobs_queues_rate_complete"),
        "pgjobs_queues",
        "(rate_jobs IS NULL) = (rate_seconds IS NULL) AND rate_jobs >= 1 AND rate_seconds > 0",
    )
    op.create_table(
        "pgjobs_limit_states",
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=True),
        sa.Column("refilled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_claim_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("kind IN ('task', 'queue')", name=op.f("ck_pgjobs_limit_states_kind")),
        sa.PrimaryKeyConstraint("kind", "name", name=op.f("pk_pgjobs_limit_states")),
    )
    with op.get_context().autocommit_block():
        _build(NEW_INDEXES)
        _swap_claim_index("ix_queued_jobs_claim_0009", ("ix_queued_jobs_lease_expires_at",))


def downgrade() -> None:
    with op.get_context().autocommit_block():
        _build(OLD_INDEXES)
        _swap_claim_index(
            "ix_queued_jobs_claim_0008",
            tuple(name for name, _ in NEW_INDEXES if name != "ix_queued_jobs_claim_0009"),
        )
    # In the order a worker's statements lock them (queued_jobs first, then pgjobs_queues and
    # pgjobs_limit_states), as the upgrade does: dropping the table first deadlocked with a
    # worker's trip that held queued_jobs and waited for pgjobs_queues.
    op.execute(
        "LOCK TABLE queued_jobs, pgjobs_queues, pgjobs_limit_states IN ACCESS EXCLUSIVE MODE"
    )
    op.drop_table("pgjobs_limit_states")
    op.drop_constraint(op.f("ck_pgjobs_queues_rate_complete"), "pgjobs_queues", type_="check")
    op.drop_constraint(
        op.f("ck_pgjobs_queues_concurrency_positive"), "pgjobs_queues", type_="check"
    )
    op.drop_column("pgjobs_queues", "rate_seconds")
    op.drop_column("pgjobs_queues", "rate_jobs")
    op.drop_column("pgjobs_queues", "concurrency")
    op.drop_column("queued_jobs", "limit_key")
