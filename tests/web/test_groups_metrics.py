"""``pgjobs_groups_at_limit{queue}``: the groups of a queue whose running jobs reached the queue's
group_concurrency or a task's (the server's app); labelled by queue only, never by group; a queue
seen once reads 0 when none is at its limit any more."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg_pool
import pytest

from pgjobs import db, groups, queues
from pgjobs.db.dsn import Dsn
from pgjobs.web.metrics import QueueMetrics
from tests.support.factories import declared_task
from tests.web.test_metrics import scrape, value


@pytest.fixture
def pool(dsn: Dsn) -> Iterator[psycopg_pool.ConnectionPool[Any]]:
    pool = db.open_pool(dsn, 2)
    yield pool
    pool.close()


def running(
    conn: psycopg.Connection[Any], queue: str, group: str, jobs: int, task: str = "t"
) -> None:
    conn.execute(
        """INSERT INTO queued_jobs (queue, task, payload, group_key, lease_owner,
                                     lease_expires_at, attempts)
           SELECT %s, %s, '{}', %s, 'w1', '2999-01-01', 1 FROM generate_series(1, %s)""",
        [queue, task, group, jobs],
    )


def test_groups_at_limit_by_queue(conn, dsn, pool):
    queues.limit(dsn, "tenants", group_concurrency=2)
    running(conn, "tenants", "customer-1", 2)
    running(conn, "tenants", "customer-2", 1)
    running(conn, "tenants", "customer-3", 3)
    running(conn, "synced", "customer-1", 1, task="crm.sync")
    limits = groups.task_limits([declared_task("crm.sync", group_concurrency=1)])
    samples = scrape(QueueMetrics(ttl=0, group_limits=limits), pool)
    assert value(samples, "pgjobs_groups_at_limit", queue="tenants") == 2
    assert value(samples, "pgjobs_groups_at_limit", queue="synced") == 1
    assert not [key for key in samples if key[0] == "pgjobs_groups_at_limit" and len(key[1]) != 1]

    # Without the app, only the queue's own limit counts.
    samples = scrape(QueueMetrics(ttl=0), pool)
    assert value(samples, "pgjobs_groups_at_limit", queue="synced") == 0

    metrics = QueueMetrics(ttl=0, group_limits=limits)
    scrape(metrics, pool)
    conn.execute("DELETE FROM queued_jobs")
    samples = scrape(metrics, pool)
    assert value(samples, "pgjobs_groups_at_limit", queue="tenants") == 0
    assert value(samples, "pgjobs_groups_at_limit", queue="synced") == 0


def test_no_grouped_jobs_no_series(conn, pool):
    conn.execute("INSERT INTO queued_jobs (task) VALUES ('t')")
    samples = scrape(QueueMetrics(ttl=0), pool)
    assert not [key for key in samples if key[0] == "pgjobs_groups_at_limit"]
