"""Concurrent administration: two `pgjobs migrate` at once take turns (the second finds the
schema at head), and `pgjobs prune` waiting for a long reader of the archive never holds the
workers' archive inserts queued behind its lock request for more than a moment."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgjobs import migrate, queries, retention
from pgjobs.maintenance.partitions import ArchivePartitions
from tests.integration.maintenance.test_retention import archive, partitions
from tests.support.factories import run_service
from tests.support.helpers import pgjobs_env, pgjobs_process, wait_until


def other_sessions(conn: psycopg.Connection[Any], *mine: psycopg.Connection[Any]) -> int:
    """Sessions of this database other than ``mine`` and ``conn``'s."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> ALL(%s)",
        [[c.info.backend_pid for c in (conn, *mine)]],
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_two_migrations_at_once_take_turns(create_database):
    fresh = create_database()
    env = pgjobs_env(fresh.url)
    with psycopg.connect(fresh.url, autocommit=True) as holder:
        # Hold the migration lock so that both runs are surely queued on it at once.
        holder.execute(queries.MIGRATION_TRY_LOCK, {"key": queries.MIGRATION_LOCK_KEY})
        with pgjobs_process(env, "migrate") as first, pgjobs_process(env, "migrate") as second:
            with psycopg.connect(fresh.url, autocommit=True) as watcher:
                wait_until(
                    lambda: other_sessions(watcher, holder) == 2,
                    timeout=60,
                    what="both migrations connected (and held back by the migration lock)",
                    procs=[first, second],
                )
            holder.execute(queries.MIGRATION_UNLOCK, {"key": queries.MIGRATION_LOCK_KEY})
            codes = [first.wait_exit(120), second.wait_exit(120)]
            outs = sorted([first.out(), second.out()])
            errs = first.err() + second.err()
    assert codes == [0, 0], errs
    assert errs == ""
    assert outs[0].startswith(f"pgjobs schema already at head {migrate.head()} in ")
    assert outs[1].startswith(f"pgjobs schema created at {migrate.head()} in ")
    assert migrate.current(fresh) == migrate.head()


@pytest.fixture
def fresh(create_database):
    dsn = create_database()
    migrate.upgrade(dsn)
    return dsn


def test_prune_waiting_for_a_long_reader_does_not_stall_archive_inserts(fresh):
    now = datetime.now(UTC)
    with psycopg.connect(fresh.url, autocommit=True) as conn:
        archive(conn, 1, now - timedelta(days=40))
        run_service(fresh, ArchivePartitions())
        old = [
            name for name in partitions(conn) if name.endswith(f"{now - timedelta(days=40):%Y%m%d}")
        ]
    assert len(old) == 1

    reader = psycopg.connect(fresh.url)  # a long report over the archive: holds ACCESS SHARE
    reader.execute("SELECT count(*) FROM archived_jobs")
    outcome: list[Any] = []
    pruning = threading.Thread(
        target=lambda: outcome.append(retention.prune(fresh, timedelta(days=30), lock_timeout=300))
    )
    pruning.start()
    try:
        with (
            psycopg.connect(fresh.url, autocommit=True) as worker,
            psycopg.connect(fresh.url, autocommit=True) as watcher,
        ):
            # A worker's archive insert that would give up after 1 s behind a lock: it must
            # never meet prune's request holding the queue that long.
            worker.execute("SET lock_timeout = '1s'")
            for job_id in range(100, 105):
                wait_until(
                    lambda: prune_is_queued(watcher),
                    timeout=60,
                    interval=0.01,
                    what="prune waits for the lock on archived_jobs",
                )
                archive(worker, job_id, datetime.now(UTC))
            assert outcome == [], "prune cannot finish while the reader holds its lock"
    finally:
        reader.close()
        pruning.join(timeout=120)
    assert not pruning.is_alive()
    report = outcome[0]
    assert [p.partition.name for p in report.pruned] == old
    with psycopg.connect(fresh.url, autocommit=True) as conn:
        ids = {row[0] for row in conn.execute("SELECT id FROM archived_jobs").fetchall()}
    assert ids == {100, 101, 102, 103, 104}


def prune_is_queued(conn: psycopg.Connection[Any]) -> bool:
    """A lock request on archived_jobs (prune's ACCESS EXCLUSIVE) waits in the queue."""
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE NOT granted "
        "AND relation = 'archived_jobs'::regclass AND mode = 'AccessExclusiveLock'"
    ).fetchone()
    return row is not None and row[0] > 0
