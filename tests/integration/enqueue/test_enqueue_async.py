"""Async enqueue: the same validation and statements as the sync path, on the app's async pool
or in the caller's transaction (psycopg AsyncConnection, SQLAlchemy AsyncConnection)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from pgjobs import App, JobSpec
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError, InvalidPayload
from tests.support.helpers import count, scalar


def test_enqueue_async_writes_what_enqueue_writes(make_app, conn):
    app: App = make_app(check_task_names=False)

    async def main() -> tuple[int, int, list[int], list[int]]:
        async with app:
            plain = await app.enqueue_async("t", {"n": 1})
            timed = await app.enqueue_async(
                "t", {"n": 2}, queue="q", priority=5, run_in=3600, max_attempts=2, expires_in=7200
            )
            keyed = await app.enqueue_many_async(
                [JobSpec("t", {"n": 3}, idempotency_key="k"), JobSpec("t", {}, idempotency_key="k")]
            )
            bulk = await app.enqueue_many_async(JobSpec("t", {"i": i}) for i in range(200))
        return plain, timed, keyed, bulk

    plain, timed, keyed, bulk = asyncio.run(main())
    assert scalar(conn, "SELECT payload FROM queued_jobs WHERE id = %s", [plain]) == {"n": 1}
    assert keyed[0] == keyed[1], "the second job with the key is the first one"
    assert len(set(bulk)) == 200 and bulk == sorted(bulk)
    assert count(conn, "queued_jobs") == 2 + 1 + 200
    row = conn.execute(
        "SELECT queue, priority, max_attempts, run_at > now() + interval '59 minutes', "
        "expires_at > run_at FROM queued_jobs WHERE id = %s",
        [timed],
    ).fetchone()
    assert row == ("q", 5, 2, True, True)
    assert scalar(conn, "SELECT payload FROM queued_jobs WHERE id = %s", [bulk[7]]) == {"i": 7}


def test_refusals_are_the_sync_paths_and_change_nothing(make_app, conn):
    app: App = make_app()

    @app.task(name="t")
    def t(n: int) -> None: ...

    async def main() -> None:
        async with app:
            with pytest.raises(ConfigurationError) as caught:
                await app.enqueue_async("t", {"n": 1}, priority=10**6)
            assert caught.value.field == "priority"
            with pytest.raises(InvalidPayload):
                await app.enqueue_async("t", {"n": float("nan")})
            with pytest.raises(ConfigurationError) as caught:
                await app.enqueue_many_async([JobSpec("t", {"n": 1}), JobSpec("t", {}, queue="")])
            assert caught.value.field == "jobs[1].queue"

    asyncio.run(main())
    assert count(conn, "queued_jobs") == 0


def test_in_the_callers_psycopg_async_transaction(make_app, conn, dsn: Dsn):
    app: App = make_app(check_task_names=False)

    async def main() -> list[int]:
        async with await psycopg.AsyncConnection.connect(dsn.url) as own:
            await app.enqueue_async("t", {"gone": 1}, connection=own)
            await app.enqueue_many_async(
                [JobSpec("t", {"gone": i}) for i in range(100)], connection=own
            )
            await own.rollback()
            kept = [await app.enqueue_async("t", {"kept": 1}, connection=own, idempotency_key="a")]
            kept += await app.enqueue_many_async(
                [JobSpec("t", {"kept": i}) for i in range(100)], connection=own
            )
            await own.commit()
            await own.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
            with pytest.raises(ConfigurationError, match="READ COMMITTED"):
                await app.enqueue_async("t", {}, connection=own, idempotency_key="b")
            await own.rollback()
        return kept

    kept = asyncio.run(main())
    assert sorted(r[0] for r in conn.execute("SELECT id FROM queued_jobs")) == sorted(kept)
    assert count(conn, "queued_jobs") == 101


def test_in_the_callers_sqlalchemy_async_transaction(make_app, conn, dsn: Dsn):
    app: App = make_app(check_task_names=False)

    async def main() -> int:
        engine = create_async_engine(dsn.sqlalchemy_url)
        try:
            async with engine.connect() as own:
                await app.enqueue_async("t", {"gone": 1}, connection=own)
                await own.rollback()
            async with engine.begin() as own:
                job_id = await app.enqueue_async("t", {"kept": 1}, connection=own)
                await app.enqueue_many_async(
                    [JobSpec("t", {"kept": 2}, idempotency_key="x")], connection=own
                )
            return job_id
        finally:
            await engine.dispose()

    job_id = asyncio.run(main())
    payloads = conn.execute("SELECT id, payload FROM queued_jobs ORDER BY id").fetchall()
    assert [p for _, p in payloads] == [{"kept": 1}, {"kept": 2}]
    assert payloads[0][0] == job_id


def test_a_connection_of_the_other_kind_is_refused_by_name(make_app, dsn: Dsn):
    app: App = make_app(check_task_names=False)
    with (
        psycopg.connect(dsn.url) as sync_conn,
        pytest.raises(ConfigurationError, match="use enqueue for a sync one"),
    ):
        asyncio.run(app.enqueue_async("t", {}, connection=sync_conn))

    async def with_async_connection() -> None:
        async with await psycopg.AsyncConnection.connect(dsn.url) as own:
            with pytest.raises(ConfigurationError, match="use enqueue_async"):
                app.enqueue("t", {}, connection=own)

    asyncio.run(with_async_connection())


def test_each_event_loop_gets_a_pool_of_its_own(make_app, conn):
    app: App = make_app(check_task_names=False)

    async def enqueue_twice() -> list[Any]:
        ids = [await app.enqueue_async("t", {}), await app.enqueue_async("t", {})]
        return ids

    first = asyncio.run(enqueue_twice())  # that loop ends without aclose(): its pool is dropped
    second = asyncio.run(enqueue_twice())
    asyncio.run(app.aclose())
    assert len(set(first + second)) == 4 and count(conn, "queued_jobs") == 4
