"""A task's group rate across two `pgjobs work` processes: never more than its starts of one
group in any second, read from the archive's started_at (the database's clock), while jobs
without a group run at once."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgjobs import JobSpec
from tests.acceptance.workload import GROUP_RATE_JOBS
from tests.support.helpers import assert_one_home, scalar, stop, wait_archived, wait_until

WORKERS = 2
GROUPS = 3
PER_GROUP = 9

#: Per group, the most starts of its jobs in any window of one second that opens at a start
#: (the window that holds the most starts always opens at one).
MOST_IN_A_SECOND = """
SELECT a.group_key, max((
           SELECT count(*) FROM archived_jobs b
           WHERE b.group_key = a.group_key AND b.task = a.task
             AND b.started_at >= a.started_at
             AND b.started_at < a.started_at + interval '1 second'))
FROM archived_jobs a
WHERE a.task = 'accept.group_rated' AND a.group_key IS NOT NULL
GROUP BY a.group_key
ORDER BY a.group_key
"""


@pytest.mark.slow
def test_a_group_rate_holds_across_two_worker_processes(make_app, runs, start_worker):
    conn: psycopg.Connection[Any] = runs
    app = make_app()
    workers = [start_worker("--concurrency", "4") for _ in range(WORKERS)]
    wait_until(
        lambda: scalar(conn, "SELECT count(*) FROM pgjobs_workers") == WORKERS,
        timeout=60,
        what="two workers registered",
        procs=workers,
    )
    ids = app.enqueue_many(
        JobSpec("accept.group_rated", {"key": g * 100 + n}, group=f"customer-{g}")
        for g in range(GROUPS)
        for n in range(PER_GROUP)
    )
    ids += app.enqueue_many(
        JobSpec("accept.group_rated", {"key": 1000 + n}) for n in range(PER_GROUP)
    )
    wait_archived(conn, len(ids), timeout=120, procs=workers)

    most = dict(conn.execute(MOST_IN_A_SECOND).fetchall())
    # Reached in every group, never passed.
    assert most == {f"customer-{g}": GROUP_RATE_JOBS for g in range(GROUPS)}
    # Each group's jobs took at least (PER_GROUP / rate - 1) seconds: the window held them.
    spans = conn.execute(
        "SELECT group_key, extract(epoch FROM max(started_at) - min(started_at))"
        " FROM archived_jobs WHERE group_key IS NOT NULL GROUP BY group_key"
    ).fetchall()
    assert all(span >= PER_GROUP // GROUP_RATE_JOBS - 1 for _, span in spans), spans
    # Without a group: not limited, so more than the rate in some second.
    ungrouped = scalar(
        conn,
        "SELECT count(*) FROM archived_jobs WHERE group_key IS NULL"
        " AND started_at < (SELECT min(started_at) FROM archived_jobs WHERE group_key IS NULL)"
        " + interval '1 second'",
    )
    assert ungrouped > GROUP_RATE_JOBS
    assert_one_home(conn, ids)
    assert stop(workers, timeout=20) == [0] * WORKERS
