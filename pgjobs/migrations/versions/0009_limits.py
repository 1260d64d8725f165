"""Concurrency and rate limits: per task and per queue, held by the claim

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25

* ``pgjobs_queues`` gets ``concurrency`` (the most jobs of the queue leased at once) and
  ``rate_jobs`` / ``rate_seconds`` (at most so many starts per period), set by `pgjobs queue
  limit`; NULL means no limit.
* ``pgjobs_rate_buckets``: the token bucket of every rate-limited task or queue.
* ``queued_jobs.limit_key``: the task whose limit a job counts against and waits for, set by
  the claims of workers that limit the task. The claim index now covers only ready jobs without
  one (``ix_queued_jobs_claim``); held-back jobs of a limited task have their own range per queue
  (``ix_queued_jobs_limit_ready``), and a limited task's running jobs are counted from
  ``ix_queued_jobs_limit_leased``. The lease index gains the queue as its first column
  (``ix_queued_jobs_queue_lease_expires_at``), so that a queue's running jobs are one index range.
* ``pgjobs_limit_capacity(...)``: how many jobs each task or queue with a concurrency limit
  allows the calling claim to take. It is a function because a concurrency limit needs a view of
  the table taken *after* the claim holds the limit's lock: a statement sees the database as of
  its start, and a count made before the lock misses what another worker claimed and committed
  meanwhile; the queries of a VOLATILE function each see every transaction committed before
  they start. Per limit it takes a transaction-level advisory lock without waiting (another
  worker claiming under the same limit makes this claim skip it, not queue behind it), then
  counts the running jobs. The claim statement (``queries.JOB_CLAIM_LIMITED``) takes at most what
  it returns, and handles rates itself (their bucket rows are locked by the claim).

Online safety: the new column, the queue settings, the table and the function are catalog
changes in one short transaction. The indexes are built CONCURRENTLY outside any transaction
(writers go on), then the old claim and lease indexes are dropped CONCURRENTLY and the new claim
index takes the old one's name. A run interrupted half-way is run again: an index left INVALID
is dropped and rebuilt. Workers of the previous release go on working on the migrated schema,
but their claim cannot use the new claim index (its condition names ``limit_key``) and sorts
their queues' ready jobs instead, which grows slow with deep queues: deploy the new release
right after migrating. Downgrade rebuilds the old indexes the same way, then drops the function,
the table, the settings and the column (held-back jobs become ordinary ready jobs).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The first key of every limit's advisory lock (the two-int4 form, which never meets the
#: single-bigint keys of pgjobs' other locks); the second is hashtext('task<US>name') or
#: hashtext('queue<US>name'). Two limits whose names hash alike share a lock: each claim then
#: skips the other's limit while it holds it, nothing worse.
LIMIT_LOCK_CLASS = 710_687_343

# pgjobs_limit_capacity(queues, tasks, task concurrency, settled ids, wanted) returns one row per
# paused queue or queue with a concurrency limit among ``queues`` (read from pgjobs_queues) and
# per task of ``tasks`` (each with its concurrency limit), saying how many jobs the calling claim
# may take under that limit:
#   capacity     at most this many (``wanted`` at most; 0 for a paused queue, or when locked out);
#   limited      it has a concurrency limit (false for a queue that is only paused);
#   locked_out   another claim holds this limit's lock right now: try again soon.
# ``settled`` are ids the calling statement archives in the same breath: still leased in the
# table the function sees, they no longer count against a limit. (Rates need no fresh view: the
# claim locks a rate's bucket row itself, and a row lock gives the row as last committed.)
LIMIT_CAPACITY = f"""
CREATE OR REPLACE FUNCTION pgjobs_limit_capacity(
    queues text[], tasks text[], task_concurrency int[], settled bigint[], wanted int)
RETURNS TABLE (kind text, name text, capacity int, limited boolean, locked_out boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    s record;
    running int;
BEGIN
    FOR s IN
        SELECT 'queue'::text AS k, p.name AS n, p.paused_at IS NOT NULL AS paused,
               p.concurrency AS c
        FROM pgjobs_queues p
        WHERE p.name = ANY(queues) AND (p.paused_at IS NOT NULL OR p.concurrency IS NOT NULL)
        UNION ALL
        SELECT 'task', t.n, false, t.c
        FROM unnest(tasks, task_concurrency) AS t(n, c)
        WHERE t.c IS NOT NULL
    LOOP
        kind := s.k;
        name := s.n;
        capacity := wanted;
        limited := s.c IS NOT NULL;
        locked_out := false;
        IF s.paused THEN
            capacity := 0;
        ELSIF s.c IS NOT NULL THEN
            IF NOT pg_try_advisory_xact_lock({LIMIT_LOCK_CLASS}, hashtext(s.k || chr(31) || s.n)) THEN
                capacity := 0;
                locked_out := true;
            ELSE
                -- A fresh view: this query starts after the lock was taken. LIMIT: counting
                -- past the limit changes nothing, and it keeps the scan a plain index scan.
                IF s.k = 'task' THEN
                    SELECT count(*) INTO running FROM (
                        SELECT 1 FROM queued_jobs q
                        WHERE q.limit_key = s.n AND q.lease_expires_at IS NOT NULL
                          AND q.id <> ALL(settled)
                        LIMIT s.c) r;
                ELSE
                    SELECT count(*) INTO running FROM (
                        SELECT 1 FROM queued_jobs q
                        WHERE q.queue = s.n AND q.lease_expires_at IS NOT NULL
                          AND q.id <> ALL(settled)
                        LIMIT s.c) r;
                END IF;
                capacity := greatest(least(capacity, s.c - running), 0);
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$
"""

LIMIT_CAPACITY_SIGNATURE = "pgjobs_limit_capacity(text[], text[], int[], bigint[], int)"

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
        "pgjobs_rate_buckets",
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("refilled_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('task', 'queue')", name=op.f("ck_pgjobs_rate_buckets_kind")),
        sa.PrimaryKeyConstraint("kind", "name", name=op.f("pk_pgjobs_rate_buckets")),
    )
    op.execute(LIMIT_CAPACITY)
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
    op.execute(f"DROP FUNCTION IF EXISTS {LIMIT_CAPACITY_SIGNATURE}")
    op.drop_table("pgjobs_rate_buckets")
    op.drop_constraint(op.f("ck_pgjobs_queues_rate_complete"), "pgjobs_queues", type_="check")
    op.drop_constraint(
        op.f("ck_pgjobs_queues_concurrency_positive"), "pgjobs_queues", type_="check"
    )
    op.drop_column("pgjobs_queues", "rate_seconds")
    op.drop_column("pgjobs_queues", "rate_jobs")
    op.drop_column("pgjobs_queues", "concurrency")
    op.drop_column("queued_jobs", "limit_key")
