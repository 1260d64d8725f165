"""The depths a worker's /stats shows (``pgjobs.worker.depths``), against a real database: the
counts of its queues only (a queue without jobs at zero), one reading per ``max_age`` however
often and however many at once ask, and an unreadable database said in ``error``, not raised."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import psycopg

from pgjobs import App
from pgjobs.db.dsn import Dsn
from pgjobs.worker import depths as depths_module
from pgjobs.worker.depths import Depths, QueueDepths
from tests.support.admin_factories import claim_one
from tests.support.urls import url_with


def test_depths_count_the_workers_queues_and_are_read_once_per_max_age(
    make_app, conn: psycopg.Connection, dsn: Dsn
) -> None:
    app: App = make_app(check_task_names=False)
    app.enqueue("t", {}, queue="a")
    app.enqueue("t", {}, queue="a")
    app.enqueue("t", {}, queue="a", run_in=600)
    claim_one(conn, app.enqueue("t", {}, queue="b"), queue="b")
    app.enqueue("t", {}, queue="not-mine")
    depths = QueueDepths(dsn, ["a", "b", "empty"], max_age=60.0)

    async def go() -> tuple[Depths, list[Depths]]:
        first = await depths.read()
        app.enqueue("t", {}, queue="a")  # not seen until the reading is max_age old
        return first, await asyncio.gather(*(depths.read() for _ in range(5)))

    first, again = asyncio.run(go())
    assert first.queues == {
        "a": {"ready": 2, "scheduled": 1, "running": 0},
        "b": {"ready": 0, "scheduled": 0, "running": 1},
        "empty": {"ready": 0, "scheduled": 0, "running": 0},
    }
    assert first.error is None
    assert all(reading is first for reading in again) and depths.readings == 1

    fresh = QueueDepths(dsn, ["a"], max_age=0.0)
    assert asyncio.run(fresh.read()).queues == {"a": {"ready": 3, "scheduled": 1, "running": 0}}


def test_an_unreadable_database_is_said_not_raised(dsn: Dsn) -> None:
    gone = replace(dsn, url=url_with(dsn.url, dbname="pgjobs_no_such_database"))
    reading = asyncio.run(QueueDepths(gone, ["a"]).read())
    assert reading.queues is None
    assert reading.error is not None and "pgjobs_no_such_database" in reading.error


def test_a_slow_reading_is_served_for_a_multiple_of_what_it_took(
    make_app, dsn: Dsn, monkeypatch
) -> None:
    # A deep backlog makes the count a scan of millions of rows: it is not made every second.
    # (A reading of at least 0.05 s is served for 50 s here, far longer than the test takes.)
    monkeypatch.setattr(depths_module, "SLOW_READS", 1000)
    app: App = make_app(check_task_names=False)
    app.enqueue("t", {}, queue="a")
    depths = QueueDepths(dsn, ["a"], max_age=0.0)
    slow = depths._rows

    async def rows() -> list[tuple[object, ...]]:
        await asyncio.sleep(0.05)
        return await slow()

    monkeypatch.setattr(depths, "_rows", rows)

    async def go() -> tuple[Depths, Depths]:
        first = await depths.read()
        return first, await depths.read()

    first, again = asyncio.run(go())
    assert first.took >= 0.05 and again is first and depths.readings == 1
