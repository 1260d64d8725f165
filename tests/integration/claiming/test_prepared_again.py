"""The libpq path's statements are prepared once per connection, and the server may drop them
without pgjobs' knowing: psycopg sends ``DEALLOCATE ALL`` after every rollback it runs (a
refused call in a transaction, a pool rolling back a connection given back in one) and after a
DDL statement, once it prepared statements of its own; ``DISCARD ALL`` and ``DEALLOCATE ALL``
do the same. Whatever dropped them, the next statement of every kind works: a statement the
server no longer has is prepared again and sent once more (its Bind failed, so nothing ran).

The class: each kind of refusal or rollback on the App's pools (sync and async) and on a worker's
claim connection, then every statement of the libpq path that runs on that kind of connection
(the runners must name each ``_Statement`` of ``pgjobs.db.libpq``), and psycopg's own prepared
statements after them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import psycopg_pool
import pytest

from pgjobs import App, JobSpec, db
from pgjobs.completer import ClaimParams
from pgjobs.completer.outcomes import Outcomes
from pgjobs.completer.params import SettleParams
from pgjobs.completer.trip import settle_and_claim, settle_apart
from pgjobs.db import libpq
from pgjobs.db.dsn import Dsn
from pgjobs.enqueue import COPY_MIN_ROWS
from pgjobs.errors import (
    DependencyFailed,
    JobNotFound,
    JobStateConflict,
    NotExternal,
    QueryFailed,
    UnknownDependency,
)
from pgjobs.models import Job
from tests.support.factories import claim, insert_dead_raw
from tests.support.helpers import assert_one_home, count, homes, scalar

CLAIM = ClaimParams("worker-a", ["default"], lease=300.0)
READY: dict[str, libpq.Param] = {
    "queue": "default", "task": "t", "payload": "{}", "priority": 0, "max_attempts": 3,
}  # fmt: skip
NEVER = 10**12  # an id no job has
#: A result jsonb refuses (SQLSTATE 22P05).
UNSTORABLE = '"\\u0000"'

SyncConn = psycopg.Connection[Any]
AsyncConn = psycopg.AsyncConnection[Any]
AsyncPool = psycopg_pool.AsyncConnectionPool[Any]


def _insert_ready(conn: SyncConn) -> None:
    assert libpq.insert_ready(conn, READY) > 0


async def _succeed_and_claim(conn: AsyncConn) -> None:
    await settle_and_claim(conn, None, None, CLAIM, 1)


async def _succeed_and_claim_limited(conn: AsyncConn) -> None:
    await settle_and_claim(conn, None, None, CLAIM, 1, limited=True)


#: Each statement of the libpq path, by its name on the server: how to run it on a connection
#: of the kind it runs on, the app's sync pool or the async claim connections.
SYNC_RUNNERS: dict[bytes, Callable[[SyncConn], None]] = {
    b"pgjobs_insert_ready": _insert_ready,
}
ASYNC_RUNNERS: dict[bytes, Callable[[AsyncConn], Awaitable[None]]] = {
    b"pgjobs_succeed_and_claim": _succeed_and_claim,
    b"pgjobs_succeed_and_claim_limited": _succeed_and_claim_limited,
}


def test_the_runners_name_every_statement_of_the_libpq_path() -> None:
    statements = {v.name for v in vars(libpq).values() if isinstance(v, libpq._Statement)}
    assert statements == {*SYNC_RUNNERS, *ASYNC_RUNNERS}


#: The statements prepared in the connection's session.
PREPARED = "SELECT array_agg(name) FROM pg_prepared_statements WHERE name LIKE 'pgjobs%'"


# --- the App's sync pool ----------------------------------------------------------------------


def _after_unknown(app: App, conn: SyncConn) -> None:
    with pytest.raises(UnknownDependency):
        app.enqueue("t", {}, after=[NEVER])


def _after_dead(app: App, conn: SyncConn) -> None:
    dead = insert_dead_raw(conn)
    with pytest.raises(DependencyFailed):
        app.enqueue("t", {}, after=[dead])


def _running(app: App, conn: SyncConn, owner: str = "fake-worker") -> Job:
    """A job of its own queue, claimed by ``owner`` (run by a Python handler)."""
    app.enqueue("t.python", {}, queue="running")
    (job,) = claim(conn, owner=owner, queues=["running"])
    return job


def _outcome_not_external(app: App, conn: SyncConn) -> None:
    job = _running(app, conn)
    with pytest.raises(NotExternal):
        app.report_outcome(job.id, attempt=job.attempts, status="succeeded")


def _cancel_running(app: App, conn: SyncConn) -> None:
    job = _running(app, conn)
    with pytest.raises(JobStateConflict):
        app.cancel(job.id)


def _redrive_not_dead(app: App, conn: SyncConn) -> None:
    with pytest.raises(JobNotFound):
        app.redrive(app.enqueue("t", {}), NEVER)


def _batch_refused(app: App, conn: SyncConn) -> None:
    """A large enqueue_many (by COPY, in a transaction) of which the database refuses one row."""
    specs = [JobSpec("t", {"n": n}) for n in range(COPY_MIN_ROWS)]
    specs.append(JobSpec("t", {"refused": True}))
    with pytest.raises(QueryFailed, match="integrity constraint"):
        app.enqueue_many(specs)


def _one_refused(app: App, conn: SyncConn) -> None:
    """The fast path itself refused (its statement, in no transaction)."""
    with pytest.raises(QueryFailed, match="integrity constraint"):
        app.enqueue("t", {"refused": True})


def _rolled_back(app: App, conn: SyncConn) -> None:
    """Any transaction rolled back on a pooled connection (psycopg's ``Transaction``)."""
    with app._pools.connection() as pooled, pytest.raises(ZeroDivisionError), pooled.transaction():
        pooled.execute("SELECT count(*) FROM queued_jobs", prepare=True)
        raise ZeroDivisionError


def _given_back_in_a_transaction(app: App, conn: SyncConn) -> None:
    """A connection given back to the pool inside a transaction: the pool rolls it back."""
    pool = app._pools.sync()
    pooled = pool.getconn()
    pooled.execute("BEGIN")
    pooled.execute("SELECT count(*) FROM queued_jobs", prepare=True)
    pool.putconn(pooled)


SYNC_REFUSALS = {
    "after an unknown job": _after_unknown,
    "after a dead job": _after_dead,
    "an outcome for a job not external": _outcome_not_external,
    "a cancel of a running job": _cancel_running,
    "a redrive of jobs not dead": _redrive_not_dead,
    "a batch with a row the database refuses": _batch_refused,
    "a fast-path insert the database refuses": _one_refused,
    "a transaction rolled back": _rolled_back,
    "a connection given back in a transaction": _given_back_in_a_transaction,
}


@pytest.mark.usefixtures("refusing")
@pytest.mark.parametrize("refusal", list(SYNC_REFUSALS))
def test_after_a_refusal_on_the_apps_pool_every_statement_works(
    refusal: str, make_app: Callable[..., App], conn: SyncConn
) -> None:
    app = make_app(pool_size=1, check_task_names=False)  # one connection: the refusal's
    app.enqueue_many([JobSpec("t", {}), JobSpec("t", {})])  # psycopg prepares statements of its own
    runners = SYNC_RUNNERS
    with app._pools.connection() as pooled:
        for run in runners.values():
            run(pooled)
        ((prepared,),) = pooled.execute(PREPARED).fetchall()
        assert {name.encode() for name in prepared} == set(runners)
    SYNC_REFUSALS[refusal](app, conn)

    with app._pools.connection() as pooled:
        for run in runners.values():
            run(pooled)
    ids = [app.enqueue("t", {}), *app.enqueue_many([JobSpec("t", {}), JobSpec("t", {})])]
    where = homes(conn)
    assert {where[job_id] for job_id in ids} == {"queued_jobs"}


# --- the App's async pool and a worker's claim connection --------------------------------------


async def _after_unknown_async(app: App, pool: AsyncPool, conn: SyncConn) -> None:
    with pytest.raises(UnknownDependency):
        await app.enqueue_async("t", {}, after=[NEVER])


async def _after_dead_async(app: App, pool: AsyncPool, conn: SyncConn) -> None:
    dead = insert_dead_raw(conn)
    with pytest.raises(DependencyFailed):
        await app.enqueue_async("t", {}, after=[dead])


async def _batch_refused_async(app: App, pool: AsyncPool, conn: SyncConn) -> None:
    specs = [JobSpec("t", {"n": n}) for n in range(COPY_MIN_ROWS)]
    specs.append(JobSpec("t", {"refused": True}))
    with pytest.raises(QueryFailed, match="integrity constraint"):
        await app.enqueue_many_async(specs)


async def _rolled_back_in_pool(app: App, pool: AsyncPool, conn: SyncConn) -> None:
    async with pool.connection() as aconn:
        await _rolled_back_async(app, aconn, conn)


async def _rolled_back_async(app: App, aconn: AsyncConn, conn: SyncConn) -> None:
    with pytest.raises(ZeroDivisionError):
        async with aconn.transaction():
            await aconn.execute("SELECT count(*) FROM queued_jobs", prepare=True)
            raise ZeroDivisionError


async def _refused_outcome_trip(app: App, aconn: AsyncConn, conn: SyncConn) -> None:
    """A worker's trip (outcomes, in one transaction) the database refuses: a result jsonb
    cannot hold."""
    job = _running(app, conn, CLAIM.owner)
    settle = _retry_of_nothing()
    settle.ok_ids.append(job.id)
    settle.ok_attempts.append(job.attempts)
    settle.ok_results.append(UNSTORABLE)
    with pytest.raises(QueryFailed, match="SQLSTATE 22"):
        await settle_and_claim(aconn, settle, None, CLAIM, 1)


async def _ddl(app: App, aconn: AsyncConn, conn: SyncConn) -> None:
    """DDL on the connection (a maintenance service's partitions): psycopg deallocates all."""
    await aconn.execute("CREATE TEMP TABLE gone (n int)")
    await aconn.execute("DROP TABLE gone")


async def _deallocate_all(app: App, aconn: AsyncConn, conn: SyncConn) -> None:
    await aconn.execute("DEALLOCATE ALL")


async def _discard_all(app: App, aconn: AsyncConn, conn: SyncConn) -> None:
    """What a session pooler's reset query runs."""
    await aconn.execute("DISCARD ALL")


#: On the App's async pool: what a call of the App refuses there, and any rollback.
POOL_REFUSALS: dict[str, Callable[[App, AsyncPool, SyncConn], Awaitable[None]]] = {
    "after an unknown job": _after_unknown_async,
    "after a dead job": _after_dead_async,
    "a batch with a row the database refuses": _batch_refused_async,
    "a transaction rolled back": _rolled_back_in_pool,
}

#: On a worker's claim connection (``hot``).
TRIP_REFUSALS: dict[str, Callable[[App, AsyncConn, SyncConn], Awaitable[None]]] = {
    "a refused outcome trip": _refused_outcome_trip,
    "a transaction rolled back": _rolled_back_async,
    "DDL": _ddl,
    "DEALLOCATE ALL": _deallocate_all,
    "DISCARD ALL": _discard_all,
}


def _retry_of_nothing() -> SettleParams:
    """Outcomes that are not successes only (the pipelined trip): a retry of no job."""
    return SettleParams(
        CLAIM.owner, retry_ids=[NEVER], retry_attempts=[1], retry_delays=[1.0], retry_errors=["x"]
    )


async def _prime(aconn: AsyncConn) -> None:
    """What a working connection has prepared: psycopg's statements (a pipelined trip) and the
    libpq path's."""
    await settle_and_claim(aconn, _retry_of_nothing(), None, CLAIM, 1)
    runners = ASYNC_RUNNERS
    for run in runners.values():
        await run(aconn)
    ((prepared,),) = await (await aconn.execute(PREPARED)).fetchall()
    assert {name.encode() for name in prepared} == set(runners)


async def _every_statement(aconn: AsyncConn) -> None:
    for run in ASYNC_RUNNERS.values():
        await run(aconn)
    async with aconn.transaction():  # psycopg's own prepared statements
        await aconn.execute("SELECT count(*) FROM queued_jobs", prepare=True)


@pytest.mark.usefixtures("refusing")
@pytest.mark.parametrize("refusal", list(POOL_REFUSALS))
def test_after_a_refusal_on_the_apps_async_pool_every_statement_works(
    refusal: str, make_app: Callable[..., App], conn: SyncConn
) -> None:
    app = make_app(pool_size=1, check_task_names=False)

    async def scenario() -> list[int]:
        await app.enqueue_many_async([JobSpec("t", {}), JobSpec("t", {})])
        pool, _ = await app._pools.running_loop()
        async with pool.connection() as aconn:
            await _prime(aconn)
        await POOL_REFUSALS[refusal](app, pool, conn)
        async with pool.connection() as aconn:  # the same one
            await _every_statement(aconn)
        ids = [await app.enqueue_async("t", {})]
        ids += await app.enqueue_many_async([JobSpec("t", {}), JobSpec("t", {})])
        await app.aclose()
        return ids

    ids = asyncio.run(scenario())
    where = homes(conn)
    assert {where[job_id] for job_id in ids} == {"queued_jobs"}


@pytest.mark.parametrize("refusal", list(TRIP_REFUSALS))
def test_after_a_refusal_on_a_claim_connection_every_statement_works(
    refusal: str, dsn: Dsn, make_app: Callable[..., App], conn: SyncConn
) -> None:
    app = make_app(check_task_names=False)

    async def scenario() -> None:
        aconn = await db.connect_async(dsn, hot=True)
        try:
            await _prime(aconn)
            await TRIP_REFUSALS[refusal](app, aconn, conn)
            await _every_statement(aconn)
        finally:
            await aconn.close()

    asyncio.run(scenario())


def test_the_outcomes_of_a_refused_trip_are_applied_apart(
    dsn: Dsn, make_app: Callable[..., App], conn: SyncConn
) -> None:
    """After a trip the database refused (its transaction rolled back), its outcomes are applied
    apart on the same connection, the successes by the libpq path: each is applied, and only the
    refused outcome's job goes to dead_letter."""
    app = make_app(check_task_names=False)
    ids = app.enqueue_many(JobSpec("t", {"n": n}) for n in range(3))
    jobs = claim(conn, owner=CLAIM.owner)
    assert sorted(job.id for job in jobs) == sorted(ids)
    succeeded, refused, retried = jobs
    batch = SettleParams(CLAIM.owner)
    # Applied apart in halves: the success alone first, then the other two.
    for job, result in [(succeeded, None), (refused, UNSTORABLE)]:
        batch.ok_ids.append(job.id)
        batch.ok_attempts.append(job.attempts)
        batch.ok_results.append(result)
    batch.retry_ids.append(retried.id)
    batch.retry_attempts.append(retried.attempts)
    batch.retry_delays.append(60.0)
    batch.retry_errors.append("again")

    async def scenario() -> None:
        aconn = await db.connect_async(dsn, hot=True)
        try:
            await _prime(aconn)
            with pytest.raises(QueryFailed, match="SQLSTATE 22"):
                await settle_and_claim(aconn, batch, None, CLAIM, 0)
            await settle_apart(aconn, batch, CLAIM, Outcomes(CLAIM.owner))
        finally:
            await aconn.close()

    asyncio.run(scenario())
    homes = assert_one_home(conn, ids)
    assert [homes[job.id] for job in jobs] == ["archived_jobs", "dead_letter", "queued_jobs"]
    assert scalar(conn, "SELECT last_error FROM queued_jobs WHERE id = %s", [retried.id]) == "again"


def test_a_claim_prepares_again_what_the_server_dropped(dsn: Dsn, make_app) -> None:
    make_app(check_task_names=False).enqueue_many(JobSpec("t", {"n": n}) for n in range(3))

    async def scenario() -> list[int]:
        aconn = await db.connect_async(dsn, hot=True)
        try:
            claimed = []
            for _ in range(3):
                done = await settle_and_claim(aconn, None, None, CLAIM, 1)
                claimed.append(len(done.claimed))
                await aconn.execute("DEALLOCATE ALL")
            return claimed
        finally:
            await aconn.close()

    assert asyncio.run(scenario()) == [1, 1, 1]


def test_an_enqueue_prepares_again_what_the_server_dropped(dsn: Dsn) -> None:
    with db.connect(dsn) as conn:
        for _ in range(3):
            assert libpq.insert_ready(conn, READY) > 0
            conn.execute("DISCARD ALL")


def test_in_a_transaction_a_dropped_statement_is_not_sent_again(dsn: Dsn, conn: SyncConn) -> None:
    """The Bind that found the statement missing aborted the transaction around it: sending it
    again there could only fail, and the caller must see the refusal. The next execution, after
    the rollback, prepares it again."""
    with db.connect(dsn) as mine:
        libpq.insert_ready(mine, READY)
        mine.pgconn.exec_(b"DEALLOCATE ALL")
        mine.pgconn.exec_(b"BEGIN")
        with pytest.raises(QueryFailed, match="does not exist"):
            libpq.insert_ready(mine, READY)
        assert mine.pgconn.transaction_status == psycopg.pq.TransactionStatus.INERROR
        mine.pgconn.exec_(b"ROLLBACK")
        assert libpq.insert_ready(mine, READY) > 0
    assert count(conn, "queued_jobs") == 2
