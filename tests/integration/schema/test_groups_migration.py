"""Migration 0014 on a database that holds grouped jobs: the groups of ``pgjobs_group_states``
get their row of every queue, so that a claim takes their jobs at once after the upgrade (a
group without that row would wait for the maintenance's restore), and the downgrade gives the
previous schema back."""

from __future__ import annotations

import psycopg

from pgjobs import migrate
from tests.support.factories import claim_limited, declared_task

ONE = declared_task("g.one", group_concurrency=1)


def test_upgrade_from_0013_keeps_every_groups_jobs_claimable_under_its_limit(create_database):
    dsn = create_database()
    migrate.upgrade(dsn, "0013")
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        for queue, group in (("east", "a"), ("west", "a"), ("west", "b")):
            conn.execute(
                "INSERT INTO queued_jobs (queue, task, group_key)"
                " SELECT %s, 'g.one', %s FROM generate_series(1, 2)",
                [queue, group],
            )
            conn.execute(
                "INSERT INTO pgjobs_group_states (queue, group_key) VALUES (%s, %s)",
                [queue, group],
            )
        migrate.upgrade(dsn)
        rows = conn.execute("SELECT group_key FROM pgjobs_groups ORDER BY 1").fetchall()
        assert [r[0] for r in rows] == ["a", "b"]
        jobs, _ = claim_limited(conn, [ONE], queues=["east", "west"])
        assert sorted(j.group_key or "" for j in jobs) == ["a", "b"]
        migrate.downgrade(dsn, "0013")
        assert conn.execute("SELECT to_regclass('pgjobs_groups')").fetchone() == (None,)
        # The previous schema's indexes are back.
        indexes = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE indexname LIKE 'ix_queued_jobs_group_%'"
            " ORDER BY 1"
        ).fetchall()
        assert [r[0] for r in indexes] == [
            "ix_queued_jobs_group_leased",
            "ix_queued_jobs_group_order",
            "ix_queued_jobs_group_ready",
        ]
