"""Read-ahead in a running worker: with a backlog and quick handlers it claims beyond its free
slots (bigger round trips), never more than its handlers start within READ_AHEAD_WAIT seconds;
a stop gives the jobs claimed ahead back to the queue with their attempt refunded, and every job
still runs exactly once. A job on its last attempt, or of an at-most-once task, is never claimed
ahead: a worker that dies with it waiting would send it to dead_letter unrun."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import psycopg
import pytest

from pgjobs import App, JobSpec, queries
from pgjobs.completer import ClaimParams
from tests.support.external import run_worker_while
from tests.support.helpers import assert_one_home, count, scalar, wait_until


def test_a_stop_gives_back_the_jobs_claimed_ahead_and_every_job_runs_once(
    make_app: Any, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    app: App = make_app()
    runs: dict[int, int] = {}
    lock = threading.Lock()
    most_leased = [0]

    @app.task(name="t.quick")
    async def quick(n: int) -> None:
        with lock:
            runs[n] = runs.get(n, 0) + 1
        await asyncio.sleep(0.001)

    ids = app.enqueue_many([JobSpec("t.quick", {"n": n}) for n in range(3000)])

    def scenario(_: Any) -> None:
        def enough() -> bool:
            leased = scalar(conn, "SELECT count(*) FROM queued_jobs WHERE lease_owner IS NOT NULL")
            most_leased[0] = max(most_leased[0], leased)
            return count(conn, "archived_jobs") >= 500 and most_leased[0] > 4

        wait_until(enough, timeout=60, what="jobs claimed ahead of the four slots")

    with caplog.at_level(logging.INFO, logger="pgjobs.worker"):
        _, code = run_worker_while(app, scenario, concurrency=4, read_ahead=200)
    assert code == 0
    # While the backlog lasted, more jobs were leased than the worker has slots.
    assert most_leased[0] > 4
    gave_back = [r.message for r in caplog.records if "claimed ahead, not started" in r.message]
    assert gave_back, "the stop found jobs claimed ahead"
    # What is left is ready, unleased, and never used an attempt; what ran, ran once.
    left = conn.execute(
        "SELECT count(*), coalesce(max(attempts), 0), count(lease_owner) FROM queued_jobs"
    ).fetchone()
    assert left is not None and left[0] > 0 and left[1:] == (0, 0)
    finished = count(conn, "archived_jobs")
    assert len(runs) == finished and set(runs.values()) == {1}
    assert_one_home(conn, ids)


def test_without_read_ahead_a_worker_leases_no_more_than_its_slots(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app()
    most_leased = [0]

    @app.task(name="t.quick")
    async def quick(n: int) -> None:
        leased = scalar(conn, "SELECT count(*) FROM queued_jobs WHERE lease_owner IS NOT NULL")
        most_leased[0] = max(most_leased[0], leased)

    app.enqueue_many([JobSpec("t.quick", {"n": n}) for n in range(300)])

    def scenario(_: Any) -> None:
        wait_until(lambda: count(conn, "archived_jobs") == 300, timeout=60, what="all jobs")

    _, code = run_worker_while(app, scenario, concurrency=4, read_ahead=0)
    assert code == 0 and 0 < most_leased[0] <= 4


def test_a_job_on_its_last_attempt_or_at_most_once_is_never_claimed_ahead(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app(check_task_names=False)
    ids = app.enqueue_many(
        [
            JobSpec("t.work", {"n": 0}),
            JobSpec("t.work", {"n": 1}),
            JobSpec("t.work", {"n": 2}, max_attempts=1),  # its first attempt is its last
            JobSpec("t.once", {"n": 3}),
            JobSpec("t.work", {"n": 4}),
        ]
    )
    params = ClaimParams("w", ["default"], at_most_once_tasks=["t.once"])
    # Two jobs for free slots, up to three more ahead: the last two above are passed over.
    rows = conn.execute(queries.JOB_CLAIM, params.bind(5, slots=2)).fetchall()
    assert sorted(row[0] for row in rows if row[0] is not None) == [ids[0], ids[1], ids[4]]
    # For a free slot, they are claimed as any job.
    rows = conn.execute(queries.JOB_CLAIM, params.bind(2, slots=2)).fetchall()
    assert sorted(row[0] for row in rows if row[0] is not None) == [ids[2], ids[3]]
