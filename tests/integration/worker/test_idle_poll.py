"""An idle worker's poll: it asks whether its queues hold a ready job (``JOB_READY_IN_QUEUES``)
and claims only when they may, so that a poll that finds nothing costs the server a small read;
a job that no NOTIFY announced is still claimed at the next poll; one the worker itself put back
for later (a retry, a snooze) is claimed when it falls due."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Any

import psycopg
import pytest

from pgjobs import App, Snooze, Worker, WorkerConfig, db, queries
from pgjobs.db.dsn import Dsn
from pgjobs.worker.pacing import ClaimPacer
from tests.support.factories import insert_raw, work
from tests.support.helpers import assert_one_home


def ready(conn: psycopg.Connection[Any], *queues: str) -> bool:
    row = conn.execute(queries.JOB_READY_IN_QUEUES, {"queues": list(queues)}).fetchone()
    assert row is not None
    return bool(row[0])


def test_the_probe_sees_every_kind_of_ready_job_and_nothing_else(conn):
    assert not ready(conn, "a", "b")
    insert_raw(conn, "t", queue="a", run_at="infinity")  # waiting (a batch's callback)
    insert_raw(conn, "t", queue="a", run_at="2999-01-01")  # scheduled
    leased = {"lease_owner": "w", "lease_expires_at": "2999-01-01"}
    insert_raw(conn, "t", queue="a", attempts=1, **leased)  # running
    assert not ready(conn, "a")
    insert_raw(conn, "t", queue="b")  # ready, in another queue
    assert not ready(conn, "a") and ready(conn, "a", "b")
    conn.execute("TRUNCATE queued_jobs")
    insert_raw(conn, "t", queue="a", group_key="customer-1")  # a group's job
    assert ready(conn, "a")
    conn.execute("TRUNCATE queued_jobs")
    insert_raw(conn, "t", queue="a", limit_key="t")  # held back for its task's limit
    assert ready(conn, "a")


async def _poll(app: App, dsn: Dsn) -> tuple[int, list[int]]:
    """One poll of an idle worker's pacer: how many jobs it asked for, the ids it claimed."""
    pacer: ClaimPacer = Worker(app, WorkerConfig(concurrency=4, maintenance=False)).pacer
    conn = await db.connect_async(dsn, hot=True)
    try:
        pacer.open(conn, dsn, asyncio.Event())
        claimed = await pacer.trip(pacer.lanes[0], 4, poll=True)
        return claimed.asked, [job.id for job in claimed.jobs]
    finally:
        await pacer.close(keep=None)


def test_a_poll_that_finds_nothing_claims_nothing_and_one_that_does_claims(make_app, dsn, conn):
    app = make_app()
    app.task(name="t")(lambda: None)
    scheduled = insert_raw(conn, "t", run_at="2999-01-01")
    assert asyncio.run(_poll(app, dsn)) == (4, [])
    # Inserted without a NOTIFY (by hand, another program): the poll finds it all the same.
    job = insert_raw(conn, "t")
    assert asyncio.run(_poll(app, dsn)) == (4, [job])
    leased = conn.execute("SELECT id FROM queued_jobs WHERE lease_owner IS NOT NULL").fetchall()
    assert leased == [(job,)] and scheduled != job


class _Busy(Exception):
    """A failure that asks for its retry in 0.2 s (``retry_after``)."""

    retry_after = 0.2


@pytest.mark.parametrize("outcome", ["retry", "snooze"])
def test_a_job_this_worker_put_back_for_less_than_its_poll_is_claimed_when_due(
    make_app, conn, outcome
):
    # The worker wrote the job's run_at itself, so it claims again then; no NOTIFY says so, and
    # its poll is 50 s away. A watchdog stops the worker after 20 s (a bound, not a
    # measurement): without the claim at the time due, the job would still wait for the poll.
    app: App = make_app()
    runs: list[int] = []

    @app.task(name="t.later", max_attempts=2)
    def later() -> None:
        runs.append(1)
        if len(runs) == 1:
            if outcome == "snooze":
                raise Snooze(0.2)
            raise _Busy("not yet")
        os.kill(os.getpid(), signal.SIGTERM)  # ran again: the worker stops after this attempt

    job_id = app.enqueue("t.later", {})
    watchdog = threading.Timer(20, os.kill, [os.getpid(), signal.SIGTERM])
    watchdog.start()
    try:
        assert work(app, burst=False, poll_interval=50) == 0
    finally:
        watchdog.cancel()
    assert len(runs) == 2
    assert assert_one_home(conn, [job_id]) == {job_id: "archived_jobs"}
