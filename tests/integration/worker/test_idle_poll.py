"""An idle worker's poll: it asks whether its queues hold a ready job (``JOB_READY_IN_QUEUES``)
and claims only when they may, so that a poll that finds nothing costs the server a small read;
a job that no NOTIFY announced is still claimed at the next poll."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from pgjobs import App, Worker, WorkerConfig, db, queries
from pgjobs.db.dsn import Dsn
from pgjobs.worker.pacing import ClaimPacer
from tests.support.factories import insert_raw


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
