"""Search indexes: a job found by its unique key in any table, and by its group in the archive

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01

The dashboard's search finds a job by id, idempotency key, unique key, tag or group in each of
the three tables, through an index only. Before this revision a unique key had an index only on
``queued_jobs``'s jobs that have not started (``uq_queued_jobs_unique_key``, task first), and a
group none on ``archived_jobs``. This revision adds:

* ``ix_<table>_unique_key`` on each of the three tables: ``(unique_key) WHERE unique_key IS NOT
  NULL`` (a job without a unique key costs nothing);
* ``ix_archived_jobs_group_key``: ``(group_key, id) WHERE group_key IS NOT NULL`` (a group's
  newest archived jobs first, partition by partition).

Online safety: every index is built CONCURRENTLY outside any transaction, the archive's partition
by partition and then attached to an index of the partitioned table (which new partitions then
get by themselves); an index left INVALID by an interrupted run is dropped and built again.
Workers of the previous release keep working on the migrated schema. Downgrade drops them
CONCURRENTLY (the archive's with its partitioned index).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: (table, suffix, definition after ON table) of the indexes, named ix_<table>_<suffix>.
INDEXES = (
    ("queued_jobs", "unique_key", "(unique_key) WHERE unique_key IS NOT NULL"),
    ("dead_letter", "unique_key", "(unique_key) WHERE unique_key IS NOT NULL"),
    ("archived_jobs", "unique_key", "(unique_key) WHERE unique_key IS NOT NULL"),
    ("archived_jobs", "group_key", "(group_key, id) WHERE group_key IS NOT NULL"),
)


def _drop_if_invalid(name: str) -> None:
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


def _partitions() -> list[str]:
    return [
        row[0]
        for row in op.get_bind().execute(
            sa.text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = 'archived_jobs'::regclass ORDER BY c.relname"
            )
        )
    ]


def _build_archive_index(suffix: str, definition: str) -> None:
    parent = f"ix_archived_jobs_{suffix}"
    if op.get_context().as_sql:
        # Printed DDL (no database to list the partitions from): one plain build on the
        # partitioned table, which holds off the archive's writes while it runs.
        op.execute(f"CREATE INDEX IF NOT EXISTS {parent} ON archived_jobs {definition}")
        return
    op.execute(f"CREATE INDEX IF NOT EXISTS {parent} ON ONLY archived_jobs {definition}")
    for partition in _partitions():
        name = f"{partition}_{suffix}_idx"
        _drop_if_invalid(name)
        op.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {partition} {definition}")
        op.execute(
            f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_inherits
                   WHERE inhrelid = '{name}'::regclass AND inhparent = '{parent}'::regclass) THEN
        ALTER INDEX {parent} ATTACH PARTITION {name};
    END IF;
END $$
"""
        )


def upgrade() -> None:
    with op.get_context().autocommit_block():
        for table, suffix, definition in INDEXES:
            if table == "archived_jobs":
                _build_archive_index(suffix, definition)
                continue
            name = f"ix_{table}_{suffix}"
            _drop_if_invalid(name)
            op.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} {definition}")


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for table, suffix, _ in INDEXES:
            name = f"ix_{table}_{suffix}"
            if table == "archived_jobs":
                # A partitioned table's index cannot be dropped CONCURRENTLY; dropping it drops
                # its partitions' with it.
                op.execute(f"DROP INDEX IF EXISTS {name}")
            else:
                op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
