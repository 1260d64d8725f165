"""Every option of every job in one ``enqueue_many`` survives whatever else the call holds: a job
waiting ``after`` it or after an earlier job, many plain jobs (a COPY-sized call), a job with a
group; on the App's pool, sync and async, in the caller's transaction (psycopg and SQLAlchemy,
sync and async), and as the members of a batch. A job waiting ``after`` others keeps its own
options too, beside jobs with keys and groups (its own keys and group:
test_keyed_dependents.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import create_async_engine

from pgjobs import App, ConfigurationError, DependencyFailed, JobSpec, Ref
from pgjobs.db.dsn import Dsn
from pgjobs.enqueue import COPY_MIN_ROWS
from tests.support.factories import counts, work
from tests.support.helpers import scalar
from tests.support.job_options import DEPENDENT_OPTIONS, OPTIONS, TASK, Option, column

#: The task of the jobs beside the one with the option.
OTHER = "mixed.other"
#: A task with a payload version above 1.
VERSIONED = "mixed.versioned"

#: What a call holds beside the job with the option (listed first), given an earlier job's id.
BESIDE: dict[str, Callable[[int], list[JobSpec]]] = {
    "nothing": lambda earlier: [],
    "a job after it": lambda earlier: [JobSpec(OTHER, after=[Ref(0)])],
    "a job after an earlier one": lambda earlier: [JobSpec(OTHER, after=[earlier])],
    "a copy-sized call": lambda earlier: [JobSpec(OTHER, {"n": n}) for n in range(COPY_MIN_ROWS)],
    "a copy-sized call with a job after it": lambda earlier: [
        *(JobSpec(OTHER, {"n": n}) for n in range(COPY_MIN_ROWS)),
        JobSpec(OTHER, after=[Ref(0), earlier]),
    ],
    "a job with a group": lambda earlier: [JobSpec(OTHER, group="other")],
}

Enqueue = Callable[[App, Dsn, Sequence[JobSpec]], list[int]]


def _pool(app: App, dsn: Dsn, specs: Sequence[JobSpec]) -> list[int]:
    return app.enqueue_many(specs)


def _pool_async(app: App, dsn: Dsn, specs: Sequence[JobSpec]) -> list[int]:
    async def go() -> list[int]:
        async with app:
            return await app.enqueue_many_async(specs)

    return asyncio.run(go())


def _psycopg(app: App, dsn: Dsn, specs: Sequence[JobSpec]) -> list[int]:
    with psycopg.connect(dsn.url) as tx:
        tx.execute("SELECT 1")  # the caller's transaction is open before pgjobs' statements
        return app.enqueue_many(specs, connection=tx)


def _psycopg_async(app: App, dsn: Dsn, specs: Sequence[JobSpec]) -> list[int]:
    async def go() -> list[int]:
        async with await psycopg.AsyncConnection.connect(dsn.url) as tx:
            return await app.enqueue_many_async(specs, connection=tx)

    return asyncio.run(go())


def _sqlalchemy(app: App, dsn: Dsn, specs: Sequence[JobSpec]) -> list[int]:
    engine = sqlalchemy.create_engine(dsn.sqlalchemy_url, poolclass=sqlalchemy.NullPool)
    try:
        with engine.begin() as sa_conn:
            return app.enqueue_many(specs, connection=sa_conn)
    finally:
        engine.dispose()


def _sqlalchemy_async(app: App, dsn: Dsn, specs: Sequence[JobSpec]) -> list[int]:
    async def go() -> list[int]:
        engine = create_async_engine(dsn.sqlalchemy_url, poolclass=sqlalchemy.NullPool)
        try:
            async with engine.begin() as sa_conn:
                return await app.enqueue_many_async(specs, connection=sa_conn)
        finally:
            await engine.dispose()

    return asyncio.run(go())


PATHS: dict[str, Enqueue] = {
    "pool": _pool,
    "pool-async": _pool_async,
    "psycopg": _psycopg,
    "psycopg-async": _psycopg_async,
    "sqlalchemy": _sqlalchemy,
    "sqlalchemy-async": _sqlalchemy_async,
}


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    app = make_app()
    for name in (TASK, OTHER):
        app.task(name=name)(lambda **payload: None)
    app.task(name=VERSIONED, version=2, upgrade={1: lambda p: p})(lambda **payload: None)
    return app


def _sender(
    app: App, dsn: Dsn, option: Option, beside: str, enqueue: Enqueue
) -> Callable[[dict[str, Any]], int]:
    earlier = app.enqueue(OTHER, {"earlier": True})

    def send(payload: dict[str, Any]) -> int:
        specs = [JobSpec(TASK, payload, **option.spec), *BESIDE[beside](earlier)]
        ids = enqueue(app, dsn, specs)
        assert len(ids) == len(specs)
        return ids[0]

    return send


@pytest.mark.parametrize("beside", BESIDE)
@pytest.mark.parametrize("option", OPTIONS, ids=[o.name for o in OPTIONS])
def test_an_option_survives_whatever_else_the_call_holds(app, dsn, conn, option, beside):
    option.check(conn, _sender(app, dsn, option, beside, _pool))


@pytest.mark.parametrize("path", [p for p in PATHS if p != "pool"])
@pytest.mark.parametrize("option", OPTIONS, ids=[o.name for o in OPTIONS])
def test_an_option_survives_a_job_after_it_on_every_connection(app, dsn, conn, option, path):
    option.check(conn, _sender(app, dsn, option, "a job after it", PATHS[path]))


#: What a batch (``App.batch``) holds beside its member with the option: its members cannot
#: wait for other jobs.
BATCH_BESIDE = ["nothing", "a copy-sized call", "a job with a group"]


@pytest.mark.parametrize("beside", BATCH_BESIDE)
@pytest.mark.parametrize("option", OPTIONS, ids=[o.name for o in OPTIONS])
def test_an_option_survives_in_a_batch(app, dsn, conn, option, beside):
    def enqueue(app: App, dsn: Dsn, specs: Sequence[JobSpec]) -> list[int]:
        return app.enqueue_many(specs, batch=app.batch())

    option.check(conn, _sender(app, dsn, option, beside, enqueue))


@pytest.mark.parametrize("beside", BESIDE)
def test_the_payload_version_survives_whatever_else_the_call_holds(app, conn, beside):
    earlier = app.enqueue(OTHER)
    ids = app.enqueue_many([JobSpec(VERSIONED), *BESIDE[beside](earlier)])
    assert column(conn, ids[0], "payload_version") == 2


#: The jobs a dependent waits for, listed before it in the same call.
BEFORE = {
    "a plain job": JobSpec(OTHER),
    "a job with an idempotency key": JobSpec(OTHER, idempotency_key="before"),
    "a job with a group": JobSpec(OTHER, group="before"),
    "a job with a unique key": JobSpec(OTHER, unique_key="before"),
}


@pytest.mark.parametrize("before", BEFORE)
@pytest.mark.parametrize("option", DEPENDENT_OPTIONS)
def test_a_job_after_others_keeps_its_own_options(app, conn, option, before):
    spec, name, expected = DEPENDENT_OPTIONS[option]
    ids = app.enqueue_many(
        [BEFORE[before], JobSpec(OTHER), JobSpec(TASK, after=[Ref(0), Ref(1)], **spec)]
    )
    assert column(conn, ids[2], name) == expected
    assert column(conn, ids[2], "run_at = 'infinity'") is True  # it waits for both
    assert scalar(conn, "SELECT waiting_on FROM pgjobs_waiting WHERE job_id = %s", [ids[2]]) == 2


@pytest.mark.parametrize("before", BEFORE)
def test_a_job_after_others_keeps_its_payload_version(app, conn, before):
    ids = app.enqueue_many([BEFORE[before], JobSpec(VERSIONED, after=[Ref(0)])])
    assert column(conn, ids[1], "payload_version") == 2


@pytest.mark.parametrize("before", [b for b in BEFORE if b != "a plain job"])
def test_a_job_after_a_keyed_one_waits_for_it_and_is_released_by_it(app, conn, before):
    """The job listed before it went in by the keyed statements: it is watched, so that its end
    releases the job waiting for it, and the edge names it."""
    first, then = app.enqueue_many([BEFORE[before], JobSpec(TASK, after=[Ref(0)])])
    assert column(conn, first, "watched") is True
    edges = conn.execute("SELECT job_id, depends_on FROM pgjobs_dependencies").fetchall()
    assert edges == [(then, first)]
    work(app)
    archived = conn.execute("SELECT id, status FROM archived_jobs ORDER BY finished_at").fetchall()
    assert archived == [(first, "succeeded"), (then, "succeeded")]


def test_a_job_after_one_whose_key_is_held_waits_for_the_holder(app, conn):
    holder = app.enqueue(OTHER, idempotency_key="before")
    first, _ = app.enqueue_many(
        [JobSpec(OTHER, idempotency_key="before"), JobSpec(TASK, after=[Ref(0)])]
    )
    assert first == holder
    assert scalar(conn, "SELECT count(*) FROM queued_jobs WHERE task = %s", [OTHER]) == 1
    assert conn.execute("SELECT depends_on FROM pgjobs_dependencies").fetchall() == [(holder,)]
    assert column(conn, holder, "watched") is True


@pytest.mark.parametrize("option", ["idempotency_key", "unique_key"])
def test_a_keyed_job_beside_a_waiting_one_needs_read_committed(app, dsn, conn, option):
    """The keys' rule holds in a mixed call too: a REPEATABLE READ transaction of the caller's
    is refused in one line, writes nothing, and stays usable."""
    keyed: dict[str, Any] = {option: "k"}
    before = counts(conn)
    with psycopg.connect(dsn.url) as tx:
        tx.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with pytest.raises(ConfigurationError, match="need a READ COMMITTED transaction") as raised:
            app.enqueue_many(
                [JobSpec(TASK, **keyed), JobSpec(OTHER, after=[Ref(0)])], connection=tx
            )
        assert raised.value.field == option
        assert tx.execute("SELECT 1").fetchone() == (1,)
        tx.commit()
    assert counts(conn) == before


def test_refs_that_name_the_same_job_count_once(app, conn):
    """Two jobs of the call with one key are one job; a Ref to each, and that job's id, name it
    once: one edge, one dependency to wait for."""
    holder = app.enqueue(OTHER, idempotency_key="same")
    ids = app.enqueue_many(
        [
            JobSpec(OTHER, idempotency_key="same"),
            JobSpec(OTHER, idempotency_key="same"),
            JobSpec(TASK, after=[Ref(0), Ref(1), holder]),
        ]
    )
    assert ids[:2] == [holder, holder]
    assert conn.execute("SELECT job_id, depends_on FROM pgjobs_dependencies").fetchall() == [
        (ids[2], holder)
    ]
    assert scalar(conn, "SELECT waiting_on FROM pgjobs_waiting WHERE job_id = %s", [ids[2]]) == 1


def test_a_ref_to_a_key_whose_job_ended_waits_as_for_its_id(app, conn):
    """A key held by a job that already succeeded: the job after it is met at once; by one that
    died: refused in one line, nothing written."""
    done = app.enqueue(OTHER, idempotency_key="done")
    work(app)
    ids = app.enqueue_many([JobSpec(OTHER, idempotency_key="done"), JobSpec(TASK, after=[Ref(0)])])
    assert ids[0] == done
    assert column(conn, ids[1], "run_at <= now()") is True
    assert scalar(conn, "SELECT count(*) FROM pgjobs_waiting") == 0
    app.cancel(app.enqueue(OTHER, idempotency_key="gone"))
    before = counts(conn)
    with pytest.raises(DependencyFailed) as raised:
        app.enqueue_many([JobSpec(OTHER, idempotency_key="gone"), JobSpec(TASK, after=[Ref(0)])])
    assert "\n" not in str(raised.value) and str(raised.value).startswith("job #1: job ")
    assert raised.value.field == "jobs[1].after"
    assert counts(conn) == before
