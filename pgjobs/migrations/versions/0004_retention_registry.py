"""Retention by partitions, autovacuum for the hot table, and a registry of workers

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22

* ``archived_jobs`` becomes range-partitioned by ``finished_at``, one partition per UTC day, so
  that `pgjobs prune` drops whole partitions instead of deleting rows. The existing table is
  converted in place, whatever its size, without rewriting or copying a row:

  1. outside a transaction, a unique index on (id, finished_at) is built CONCURRENTLY (writers
     go on), and a CHECK (finished_at < bound) is added NOT VALID, then validated (a scan that
     blocks no writer). ``bound`` is the midnight (UTC) after tomorrow, or later if a row
     finished later: every row inserted until the switch is below it.
  2. in one short transaction (catalog changes only): the table is renamed
     ``archived_jobs_legacy``, its primary key moves to the (id, finished_at) index, a
     partitioned ``archived_jobs`` with the same columns is created, and the old table is
     attached as its partition FROM (MINVALUE) TO (bound). The validated CHECK proves the
     partition constraint, so ATTACH scans nothing; the indexes of the old table match the new
     parent's and are attached as they are, not rebuilt. An empty old table is dropped instead.
     A DEFAULT partition catches rows no partition covers (an insert never fails), and the
     partitions of the days up to three days ahead are created; the archive-partitions service
     of every worker keeps creating them.

  Rows keep their ids, and ``archived_jobs_legacy`` is dropped by `pgjobs prune` once its newest
  row is older than the cutoff. Downgrade copies every row back into a plain table (writers wait
  for the copy; readers do not): prune first if the archive is large.
* ``queued_jobs`` gets per-table autovacuum settings: the hot table churns (every job is an
  insert, an update per attempt and a delete), so it is vacuumed after 1% of its rows are dead
  instead of 20%, and analysed after 2% changed instead of 10%.
* ``pgjobs_workers``: the registry of worker processes for `pgjobs stats`.

Online safety: `pgjobs migrate` and `alembic upgrade` run with a lock_timeout (5 s unless
``--lock-timeout`` / ``-x lock_timeout=`` says otherwise), so a statement that waits behind a
long transaction fails instead of queueing every worker behind it; steps 1 and 2 can be re-run.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The same key as pgjobs.queries.ARCHIVE_DDL_LOCK_KEY (copied: a migration does not import code
# that may change after it): workers creating partitions wait for the switch to commit.
ARCHIVE_DDL_LOCK_KEY = 7_106_873_430_001
# Partitions created ahead of today, as the archive-partitions service does.
DAYS_AHEAD = 3

QUEUED_JOBS_AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_insert_scale_factor": "0.01",
    "autovacuum_analyze_scale_factor": "0.02",
}

# Indexes of archived_jobs at revision 0003, as (name, definition after ON archived_jobs).
ARCHIVED_INDEXES = (
    ("ix_archived_jobs_finished_at", "(finished_at)"),
    ("ix_archived_jobs_idempotency_key", "(idempotency_key) WHERE idempotency_key IS NOT NULL"),
    ("ix_archived_jobs_replay_of", "(replay_of) WHERE replay_of IS NOT NULL"),
)

# A unique index built CONCURRENTLY that failed (lock_timeout, cancel) stays behind INVALID;
# drop it so that the next run builds it again.
DROP_INVALID_KEY_INDEX = """
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index
               WHERE indexrelid = to_regclass('archived_jobs_id_finished_at_key')
                 AND NOT indisvalid) THEN
        DROP INDEX archived_jobs_id_finished_at_key;
    END IF;
END $$
"""

ADD_RANGE_CHECK = """
DO $$
DECLARE
    bound timestamptz;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = 'archived_jobs'::regclass
                     AND conname = 'archived_jobs_legacy_range') THEN
        SELECT greatest(
                   date_trunc('day', max(finished_at) AT TIME ZONE 'UTC') + interval '1 day',
                   date_trunc('day', now() AT TIME ZONE 'UTC') + interval '2 days'
               ) AT TIME ZONE 'UTC'
        INTO bound
        FROM archived_jobs;
        EXECUTE format(
            'ALTER TABLE archived_jobs ADD CONSTRAINT archived_jobs_legacy_range '
            'CHECK (finished_at < %L) NOT VALID', bound);
    END IF;
END $$
"""

# Attach the renamed table when it holds rows (else drop it), then create the DEFAULT partition
# and one partition per UTC day from where the old table ends to DAYS_AHEAD days after today.
ATTACH_AND_CREATE_PARTITIONS = f"""
DO $$
DECLARE
    bound timestamptz;
    day timestamptz;
    last_day timestamptz := (date_trunc('day', now() AT TIME ZONE 'UTC')
                             + interval '{DAYS_AHEAD} days') AT TIME ZONE 'UTC';
BEGIN
    PERFORM pg_advisory_xact_lock({ARCHIVE_DDL_LOCK_KEY});
    IF EXISTS (SELECT 1 FROM archived_jobs_legacy) THEN
        SELECT substring(pg_get_constraintdef(oid) FROM '''([^'']+)''')::timestamptz
        INTO bound
        FROM pg_constraint
        WHERE conrelid = 'archived_jobs_legacy'::regclass
          AND conname = 'archived_jobs_legacy_range';
        EXECUTE format(
            'ALTER TABLE archived_jobs ATTACH PARTITION archived_jobs_legacy '
            'FOR VALUES FROM (MINVALUE) TO (%L)', bound);
    ELSE
        DROP TABLE archived_jobs_legacy;
        bound := date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    END IF;
    CREATE TABLE archived_jobs_default PARTITION OF archived_jobs DEFAULT;
    day := bound;
    WHILE day <= last_day LOOP
        EXECUTE format(
            'CREATE TABLE %I PARTITION OF archived_jobs FOR VALUES FROM (%L) TO (%L)',
            'archived_jobs_p' || to_char(day AT TIME ZONE 'UTC', 'YYYYMMDD'),
            day, day + interval '1 day');
        day := day + interval '1 day';
    END LOOP;
END $$
"""


def _autovacuum_settings() -> str:
    return ", ".join(f"{name} = {value}" for name, value in QUEUED_JOBS_AUTOVACUUM.items())


def upgrade() -> None:
    # 1. The slow parts, outside a transaction, so that no lock is held while they scan.
    with op.get_context().autocommit_block():
        op.execute(DROP_INVALID_KEY_INDEX)
        op.execute(
            "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS archived_jobs_id_finished_at_key "
            "ON archived_jobs (id, finished_at)"
        )
        op.execute(ADD_RANGE_CHECK)
        op.execute("ALTER TABLE archived_jobs VALIDATE CONSTRAINT archived_jobs_legacy_range")

    # 2. One transaction of catalog changes.
    op.execute(f"ALTER TABLE queued_jobs SET ({_autovacuum_settings()})")
    op.create_table(
        "pgjobs_workers",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "last_seen_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pgjobs_workers")),
    )

    op.execute("LOCK TABLE archived_jobs IN ACCESS EXCLUSIVE MODE")
    op.rename_table("archived_jobs", "archived_jobs_legacy")
    op.drop_constraint("pk_archived_jobs", "archived_jobs_legacy", type_="primary")
    op.execute(
        "ALTER TABLE archived_jobs_legacy ADD CONSTRAINT archived_jobs_legacy_pkey "
        "PRIMARY KEY USING INDEX archived_jobs_id_finished_at_key"
    )
    for name, _ in ARCHIVED_INDEXES:
        legacy_name = name.replace("ix_archived_jobs_", "archived_jobs_legacy_")
        op.execute(f"ALTER INDEX {name} RENAME TO {legacy_name}")
    # Same columns, defaults and CHECK constraints as the old table, minus its range check.
    op.execute(
        "CREATE TABLE archived_jobs (LIKE archived_jobs_legacy INCLUDING DEFAULTS "
        "INCLUDING CONSTRAINTS) PARTITION BY RANGE (finished_at)"
    )
    op.execute("ALTER TABLE archived_jobs DROP CONSTRAINT archived_jobs_legacy_range")
    op.execute(
        "ALTER TABLE archived_jobs ADD CONSTRAINT pk_archived_jobs PRIMARY KEY (id, finished_at)"
    )
    for name, definition in ARCHIVED_INDEXES:
        op.execute(f"CREATE INDEX {name} ON archived_jobs {definition}")
    op.execute(ATTACH_AND_CREATE_PARTITIONS)


def downgrade() -> None:
    # Writers of archived_jobs wait while the rows are copied; readers do not.
    op.execute("LOCK TABLE archived_jobs IN EXCLUSIVE MODE")
    op.execute(
        "CREATE TABLE archived_jobs_plain "
        "(LIKE archived_jobs INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
    )
    op.execute("INSERT INTO archived_jobs_plain SELECT * FROM archived_jobs")
    op.execute("DROP TABLE archived_jobs")  # and every partition
    op.rename_table("archived_jobs_plain", "archived_jobs")
    op.execute("ALTER TABLE archived_jobs ADD CONSTRAINT pk_archived_jobs PRIMARY KEY (id)")
    for name, definition in ARCHIVED_INDEXES:
        op.execute(f"CREATE INDEX {name} ON archived_jobs {definition}")

    op.drop_table("pgjobs_workers")
    op.execute(f"ALTER TABLE queued_jobs RESET ({', '.join(QUEUED_JOBS_AUTOVACUUM)})")
