"""A batch's callback across four `pgjobs work` processes: enqueued and run exactly once, with
the right counts, when a thousand quick members end at the same instants on different workers,
and when a worker is killed with -9 in the middle of a batch (its members run again once their
short lease runs out)."""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest

from pgjobs import App, JobSpec
from tests.acceptance.batch_app import CALLBACK_DDL, FAIL_EVERY
from tests.acceptance.conftest import lease_owner_pattern
from tests.acceptance.workload import SHORT_LEASE
from tests.support.helpers import Proc, scalar, stop, wait_until

APP = "tests.acceptance.batch_app:app"
#: The callback on its task's queue (the test's app declares no task).
CALLBACK = JobSpec("batch.summarise", queue="summaries")
WORKERS = 4


@pytest.fixture
def callback_runs(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute(CALLBACK_DDL)
    return conn


def start_workers(conn: psycopg.Connection[Any], spawn: Any, *extra: str) -> list[Proc]:
    workers = [
        spawn("work", "--app", APP, "--poll-interval", "0.2", "--concurrency", "8", *extra)
        for _ in range(WORKERS)
    ]
    wait_until(
        lambda: scalar(conn, "SELECT count(*) FROM pgjobs_workers") == WORKERS,
        timeout=60,
        what="four workers registered",
        procs=workers,
    )
    return workers


def assert_called_back_once(
    conn: psycopg.Connection[Any], app: App, batch_id: int, members: int, workers: list[Proc]
) -> None:
    """Once every member has ended and the queue is empty, the callback ran exactly once, with
    the counts of the members' first ends, and exactly one callback job exists."""
    wait_until(
        lambda: (
            scalar(
                conn,
                "SELECT completed_at IS NOT NULL FROM pgjobs_batches WHERE id = %s",
                [batch_id],
            )
            and scalar(conn, "SELECT count(*) FROM queued_jobs") == 0
        ),
        timeout=180,
        what=lambda: f"the batch to end: {app.batch_status(batch_id)}",
        procs=workers,
    )
    dead = len(range(0, members, FAIL_EVERY))
    runs = conn.execute(
        "SELECT batch_id, total, succeeded, dead, cancelled FROM callback_runs"
    ).fetchall()
    assert runs == [(batch_id, members, members - dead, dead, 0)]
    callbacks = scalar(
        conn,
        "SELECT (SELECT count(*) FROM archived_jobs WHERE task = 'batch.summarise')"
        " + (SELECT count(*) FROM dead_letter WHERE task = 'batch.summarise')",
    )
    assert callbacks == 1
    status = app.batch_status(batch_id)
    assert (status.total, status.pending, status.succeeded, status.dead) == (
        members,
        0,
        members - dead,
        dead,
    )
    assert status.members == {"succeeded": members - dead, "dead": dead}


@pytest.mark.slow
def test_the_callback_runs_once_when_a_thousand_members_end_on_four_workers(
    make_app, callback_runs, spawn
):
    conn = callback_runs
    app: App = make_app()
    workers = start_workers(conn, spawn)
    members = 1000
    with app.batch(on_complete=CALLBACK) as batch:
        for key in range(members):
            batch.enqueue("batch.member", {"key": key})
    assert_called_back_once(conn, app, batch.id, members, workers)
    # The members' ends were spread over the workers, which counted them concurrently.
    assert scalar(conn, "SELECT count(DISTINCT worker) FROM archived_jobs") >= 2
    assert stop(workers, timeout=20) == [0] * WORKERS


@pytest.mark.slow
def test_the_callback_runs_once_when_a_worker_is_killed_mid_batch(make_app, callback_runs, spawn):
    conn = callback_runs
    app: App = make_app()
    workers = start_workers(conn, spawn, "--rescue-interval", "0.5")
    victim, survivors = workers[0], workers[1:]
    members = 200
    with app.batch(on_complete=CALLBACK) as batch:
        for key in range(members):
            batch.enqueue("batch.slow_member", {"key": key, "seconds": 0.3})
    pattern = lease_owner_pattern(victim.pid)
    wait_until(
        lambda: scalar(
            conn, "SELECT count(*) FROM queued_jobs WHERE lease_owner LIKE %s", [pattern]
        ),
        timeout=30,
        what="the victim to hold members",
        procs=workers,
    )
    victim.signal(signal.SIGKILL)
    assert victim.wait_exit(10) == -signal.SIGKILL
    held = scalar(conn, "SELECT count(*) FROM queued_jobs WHERE lease_owner LIKE %s", [pattern])
    assert held > 0, "the victim held no member when it was killed"
    assert_called_back_once(conn, app, batch.id, members, survivors)
    # The members the victim held ran again after their lease ran out.
    rerun = scalar(conn, "SELECT count(*) FROM archived_jobs WHERE attempts > 1")
    assert rerun >= 1, f"lease {SHORT_LEASE}s"
    assert stop(survivors, timeout=20) == [0] * (WORKERS - 1)
