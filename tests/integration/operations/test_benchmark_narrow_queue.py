"""The raw reference of the tenants benchmark (``benchmarks.tenants``' narrow queue) does on a
real PostgreSQL what its row says: one statement inserts a batch and wakes the worker, and the
worker's loop archives what it claimed and stops when a trip finds nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import psycopg

from benchmarks import QUEUE, raw, tenants
from pgjobs.db.dsn import Dsn


def test_one_statement_inserts_the_batch_and_notifies_once(
    create_database: Callable[[], Dsn],
) -> None:
    url = create_database().url
    with (
        psycopg.connect(url, autocommit=True) as conn,
        psycopg.connect(url, autocommit=True) as listener,
    ):
        raw.narrow_create(conn)
        listener.execute(f"LISTEN {tenants.NARROW_CHANNEL}")
        conn.execute(tenants.NARROW_PRODUCE, {"queue": QUEUE, "payloads": ["{}"] * 20})
        assert conn.execute("SELECT count(*) FROM narrow.queued_jobs").fetchone() == (20,)
        heard = list(listener.notifies(timeout=2.0, stop_after=2))
        assert [n.channel for n in heard] == [tenants.NARROW_CHANNEL]


def test_the_worker_archives_every_job_it_is_woken_for(
    create_database: Callable[[], Dsn],
) -> None:
    url = create_database().url
    with psycopg.connect(url, autocommit=True) as conn:
        raw.narrow_create(conn)

    async def produce_and_work() -> None:
        worker = asyncio.create_task(tenants.narrow_work(url))
        await asyncio.sleep(0.5)  # listening
        producer = await psycopg.AsyncConnection.connect(url, autocommit=True)
        for _ in range(3):
            await producer.execute(
                tenants.NARROW_PRODUCE, {"queue": QUEUE, "payloads": ["{}"] * 150}
            )
        await producer.close()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as check:
            for _ in range(100):
                cursor = await check.execute("SELECT count(*) FROM narrow.archived_jobs")
                if await cursor.fetchone() == (450,):
                    break
                await asyncio.sleep(0.1)
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker

    asyncio.run(produce_and_work())
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM narrow.archived_jobs").fetchone() == (450,)
        assert conn.execute("SELECT count(*) FROM narrow.queued_jobs").fetchone() == (0,)
