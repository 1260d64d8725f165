"""Jobs enqueued ``after`` others: they wait at run_at 'infinity' until every dependency has
succeeded, and go to dead_letter unrun (reason dependency_failed) when one does not; a graph
goes in by one ``enqueue_many``, all or nothing; bad dependencies are one-line errors and write
nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import create_async_engine

from pgjobs import (
    App,
    ConfigurationError,
    DependencyFailed,
    JobSpec,
    JobStatus,
    NonRetryableError,
    Ref,
    UnknownDependency,
    dependencies,
)
from pgjobs.maintenance.expirer import Expirer
from pgjobs.submission import MAX_DEPENDENCIES
from pgjobs.testing import drain, eager
from tests.support.factories import counts, row, run_service
from tests.support.helpers import assert_one_home, scalar


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    app = make_app()

    @app.task(name="ok", queue="deps")
    def ok(**payload: Any) -> Any:
        return payload

    @app.task(name="boom", queue="deps", max_attempts=1)
    def boom(**payload: Any) -> None:
        raise RuntimeError("boom")

    @app.task(name="refuse", queue="deps")
    def refuse(**payload: Any) -> None:
        raise NonRetryableError("no")

    return app


def waiting(conn: psycopg.Connection[Any], job_id: int) -> int | None:
    found = conn.execute(
        "SELECT waiting_on FROM pgjobs_waiting WHERE job_id = %s", [job_id]
    ).fetchone()
    return None if found is None else int(found[0])


def watched(conn: psycopg.Connection[Any], job_id: int) -> bool | None:
    """Whether queued job ``job_id`` is watched (None: not queued). Rows are read column by column:
    a waiting job's run_at, 'infinity', is no Python datetime."""
    found = conn.execute("SELECT watched FROM queued_jobs WHERE id = %s", [job_id]).fetchone()
    return None if found is None else bool(found[0])


def dead(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    """Job ``job_id``'s dead letter: reason, last_error and attempts."""
    found = conn.execute(
        "SELECT reason, last_error, attempts FROM dead_letter WHERE id = %s", [job_id]
    ).fetchone()
    assert found is not None, f"job {job_id} is not in dead_letter"
    return dict(zip(("reason", "last_error", "attempts"), found, strict=True))


def edges(conn: psycopg.Connection[Any]) -> set[tuple[int, int]]:
    return {(a, b) for a, b in conn.execute("SELECT job_id, depends_on FROM pgjobs_dependencies")}


def nothing_written(conn: psycopg.Connection[Any], before: dict[str, int]) -> None:
    assert counts(conn) == before
    assert scalar(conn, "SELECT count(*) FROM pgjobs_waiting") == 0
    assert scalar(conn, "SELECT count(*) FROM pgjobs_dependencies") == 0


def test_a_job_waits_until_its_dependency_succeeds_then_runs(app, conn):
    first = app.enqueue("ok", {"n": 1})
    second = app.enqueue("ok", {"n": 2}, after=[first])
    assert watched(conn, second) and waiting(conn, second) == 1
    assert scalar(conn, "SELECT run_at = 'infinity' FROM queued_jobs WHERE id = %s", [second])
    assert watched(conn, first)
    assert app.job(second).status is JobStatus.WAITING
    assert edges(conn) == {(second, first)}
    result = drain(app)
    assert result.succeeded == [first, second]
    assert waiting(conn, second) is None
    assert_one_home(conn, [first, second])


def test_a_chain_of_ten_runs_in_order(app, conn):
    ids = [app.enqueue("ok", {"n": 0})]
    for n in range(1, 10):
        ids.append(app.enqueue("ok", {"n": n}, after=[ids[-1]]))
    assert [app.job(i).status for i in ids[1:]] == [JobStatus.WAITING] * 9
    assert drain(app).succeeded == ids
    assert scalar(conn, "SELECT count(*) FROM pgjobs_waiting") == 0


def test_a_dependency_that_already_succeeded_is_met_at_once(app, conn):
    first = app.enqueue("ok")
    drain(app)
    second = app.enqueue("ok", after=[first], run_in=3600)
    assert waiting(conn, second) is None
    assert app.job(second).status is JobStatus.SCHEDULED  # its own run_in holds, nothing else
    assert edges(conn) == {(second, first)}
    third = app.enqueue("ok", after=[first])
    assert app.job(third).status is JobStatus.READY
    assert drain(app).succeeded == [third]


def test_a_released_job_keeps_the_run_at_it_asked_for(app, conn):
    first = app.enqueue("ok")
    second = app.enqueue("ok", after=[first], run_in=3600)
    drain(app)
    assert app.job(second).status is JobStatus.SCHEDULED
    assert scalar(
        conn,
        "SELECT run_at > now() + interval '50 minutes' FROM queued_jobs WHERE id = %s",
        [second],
    )


def test_repeated_ids_count_once(app, conn):
    first = app.enqueue("ok")
    second = app.enqueue("ok", after=[first, first, first])
    assert waiting(conn, second) == 1 and edges(conn) == {(second, first)}
    assert drain(app).succeeded == [first, second]


@pytest.mark.parametrize(
    ("after", "message"),
    [
        ([0], "a job id is a whole number"),
        ([-3], "a job id is a whole number"),
        ([True], "a job id is a whole number"),
        (["7"], "a job id is a whole number"),
        ([2**63], "a job id is a whole number"),
        (7, "after must be a list of job ids"),
        ("7", "after must be a list of job ids"),
        (list(range(1, MAX_DEPENDENCIES + 2)), "the limit is 1,000"),
        ([Ref(0)], "enqueue takes job ids"),
    ],
)
def test_bad_after_is_refused_in_one_line_and_writes_nothing(app, conn, after, message):
    before = counts(conn)
    with pytest.raises(ConfigurationError, match=message) as raised:
        app.enqueue("ok", after=after)
    assert "\n" not in str(raised.value) and raised.value.field == "after"
    nothing_written(conn, before)


def test_an_unknown_dependency_is_refused_naming_it_and_writes_nothing(app, conn):
    first = app.enqueue("ok")
    before = counts(conn)
    with pytest.raises(UnknownDependency, match="no job 987654 to wait for") as raised:
        app.enqueue("ok", after=[first, 987654])
    assert "\n" not in str(raised.value)
    nothing_written(conn, before)
    assert not watched(conn, first), "the lock's mark was rolled back"


@pytest.mark.parametrize(
    ("end", "outcome"), [("dead", "dead"), ("cancel", "cancelled"), ("expire", "expired")]
)
def test_a_dependency_that_already_failed_is_refused(app, conn, dsn, end, outcome):
    if end == "dead":
        first = app.enqueue("boom")
        drain(app)
    elif end == "cancel":
        first = app.enqueue("ok")
        app.cancel(first)
    else:
        first = app.enqueue("ok", expires_in=0)
        run_service(dsn, Expirer())
    before = counts(conn)
    with pytest.raises(DependencyFailed, match=f"job {first} already ended {outcome}"):
        app.enqueue("ok", after=[first])
    nothing_written(conn, before)


def test_enqueue_many_expresses_a_graph_with_refs(app, conn):
    ids = app.enqueue_many(
        [
            JobSpec("ok", {"step": "fetch a"}),
            JobSpec("ok", {"step": "fetch b"}),
            JobSpec("ok", {"step": "merge"}, after=[Ref(0), Ref(1)]),
            JobSpec("ok", {"step": "report"}, after=[Ref(2)]),
        ]
    )
    a, b, merge, report = ids
    assert ids == sorted(ids)
    assert edges(conn) == {(merge, a), (merge, b), (report, merge)}
    assert waiting(conn, merge) == 2 and waiting(conn, report) == 1
    watched = dict(conn.execute("SELECT id, watched FROM queued_jobs").fetchall())
    assert watched == {a: True, b: True, merge: True, report: True}
    assert drain(app).succeeded == ids


def test_enqueue_many_mixes_refs_with_ids_of_earlier_jobs(app, conn):
    earlier = app.enqueue("ok")
    done = app.enqueue("ok")
    drain(app, queues=["deps"], max_jobs=1)  # runs `earlier` only
    ids = app.enqueue_many([JobSpec("ok"), JobSpec("ok", after=[Ref(0), earlier, done])])
    assert waiting(conn, ids[1]) == 2  # Ref(0) and `done`, not `earlier`, which succeeded
    assert drain(app).succeeded == [done, ids[0], ids[1]]


@pytest.mark.parametrize(
    ("after", "message"),
    [
        ([Ref(1)], "job #1: a job may not depend on itself"),
        ([Ref(2)], "job #1: after holds Ref\\(position=2\\), a job listed after it"),
    ],
)
def test_enqueue_many_refuses_a_ref_to_itself_or_a_later_job(app, conn, after, message):
    before = counts(conn)
    specs = [JobSpec("ok"), JobSpec("ok", after=after), JobSpec("ok")]
    with pytest.raises(ConfigurationError, match=message) as raised:
        app.enqueue_many(specs)
    assert raised.value.field == "jobs[1].after"
    nothing_written(conn, before)


def test_enqueue_many_is_all_or_nothing_when_one_dependency_is_unknown(app, conn):
    first = app.enqueue("ok")
    before = counts(conn)
    with pytest.raises(UnknownDependency, match="job #2: no job 55555"):
        app.enqueue_many(
            [JobSpec("ok"), JobSpec("ok", after=[Ref(0), first]), JobSpec("ok", after=[55555])]
        )
    nothing_written(conn, before)


def test_in_the_callers_psycopg_transaction(app, conn, dsn):
    first = app.enqueue("ok")
    with psycopg.connect(dsn.url) as tx:
        second = app.enqueue("ok", after=[first], connection=tx)
        assert row(conn, "queued_jobs", second) is None
        tx.rollback()
    assert counts(conn)["queued_jobs"] == 1 and waiting(conn, second) is None
    with psycopg.connect(dsn.url) as tx:
        second = app.enqueue("ok", after=[first], connection=tx)
        ids = app.enqueue_many([JobSpec("ok"), JobSpec("ok", after=[Ref(0)])], connection=tx)
        tx.commit()
    assert waiting(conn, second) == 1 and waiting(conn, ids[1]) == 1
    ran = drain(app).succeeded
    assert sorted(ran) == [first, second, *ids] and ran.index(ids[0]) < ran.index(ids[1])


def test_a_refused_call_leaves_the_callers_transaction_usable(app, conn, dsn):
    first = app.enqueue("ok")
    with psycopg.connect(dsn.url) as tx:
        tx.execute("CREATE TEMP TABLE orders (id int)")
        tx.execute("INSERT INTO orders VALUES (1)")
        with pytest.raises(UnknownDependency):
            app.enqueue("ok", after=[first, 424242], connection=tx)
        assert tx.execute("SELECT count(*) FROM orders").fetchone() == (1,)
        tx.commit()
    assert not watched(conn, first)


def test_in_a_sqlalchemy_transaction(app, conn, dsn):
    first = app.enqueue("ok")
    engine = sqlalchemy.create_engine(dsn.sqlalchemy_url, poolclass=sqlalchemy.NullPool)
    try:
        with engine.connect() as sa_conn:
            second = app.enqueue("ok", after=[first], connection=sa_conn)
            sa_conn.rollback()
        assert waiting(conn, second) is None
        with engine.begin() as sa_conn:
            second = app.enqueue("ok", after=[first], connection=sa_conn)
    finally:
        engine.dispose()
    assert waiting(conn, second) == 1


def test_async_enqueue_with_after_on_the_pool_and_on_async_connections(app, conn, dsn):
    async def scenario() -> list[int]:
        first = await app.enqueue_async("ok")
        second = await app.enqueue_async("ok", after=[first])
        async with await psycopg.AsyncConnection.connect(dsn.url) as tx:
            third = await app.enqueue_async("ok", after=[second], connection=tx)
            await tx.commit()
        engine = create_async_engine(dsn.sqlalchemy_url, poolclass=sqlalchemy.NullPool)
        try:
            async with engine.begin() as sa_conn:
                (fourth,) = await app.enqueue_many_async(
                    [JobSpec("ok", after=[third])], connection=sa_conn
                )
        finally:
            await engine.dispose()
        await app.aclose()
        return [first, second, third, fourth]

    ids = asyncio.run(scenario())
    assert [waiting(conn, i) for i in ids] == [None, 1, 1, 1]
    assert drain(app).succeeded == ids


@pytest.mark.parametrize("task", ["boom", "refuse"])
def test_the_dependents_of_a_job_that_dies_die_unrun_transitively(app, conn, task):
    first = app.enqueue(task)
    second = app.enqueue("ok", after=[first])
    third = app.enqueue("ok", after=[second])
    other = app.enqueue("ok")
    result = drain(app)
    assert result.succeeded == [other]
    assert [d.id for d in result.dead] == [first]
    for job_id in (second, third):
        ended = dead(conn, job_id)
        assert ended["reason"] == "dependency_failed"
        assert ended["attempts"] == 0
    assert dead(conn, second)["last_error"] == f"dependency {first} ended dead"
    # The job that failed is named all the way down.
    assert dead(conn, third)["last_error"] == f"dependency {first} ended dead"
    assert scalar(conn, "SELECT count(*) FROM pgjobs_waiting") == 0
    assert_one_home(conn, [first, second, third, other])


def test_cancelling_a_dependency_kills_its_dependents(app, conn):
    first = app.enqueue("ok")
    second = app.enqueue("ok", after=[first])
    app.cancel(first)
    assert app.job(second).status is JobStatus.DEAD
    assert dead(conn, second)["last_error"] == f"dependency {first} ended cancelled"


def test_cancelling_a_waiting_job_kills_its_dependents_and_frees_its_row(app, conn):
    first = app.enqueue("ok")
    second = app.enqueue("ok", after=[first])
    third = app.enqueue("ok", after=[second])
    app.cancel(second)
    assert waiting(conn, second) is None
    assert dead(conn, third)["reason"] == "dependency_failed"
    assert drain(app).succeeded == [first]


def test_an_expired_dependency_kills_its_dependents(app, conn, dsn):
    first = app.enqueue("ok", expires_in=0)
    second = app.enqueue("ok", after=[first])
    run_service(dsn, Expirer())
    assert app.job(first).status is JobStatus.EXPIRED
    assert dead(conn, second)["last_error"] == f"dependency {first} ended expired"


def test_redriving_the_failed_dependency_does_not_revive_the_dependent(app, conn):
    first = app.enqueue("refuse")
    second = app.enqueue("ok", after=[first])
    drain(app)
    assert app.redrive(first) == 1
    assert watched(conn, first) is False
    # The redriven job succeeds this time (its task changed by hand).
    conn.execute("UPDATE queued_jobs SET task = 'ok' WHERE id = %s", [first])
    assert drain(app).succeeded == [first]
    assert app.job(second).status is JobStatus.DEAD


def test_redriving_and_replaying_a_dependency_failed_job_runs_it(app, conn):
    first = app.enqueue("boom")
    second = app.enqueue("ok", after=[first])
    third = app.enqueue("ok", after=[first])
    drain(app)
    assert app.redrive(second) == 1
    assert watched(conn, second) is False
    assert app.job(second).status is JobStatus.READY and waiting(conn, second) is None
    copy = app.replay(third)
    assert watched(conn, copy) is False
    assert app.job(copy).status is JobStatus.READY
    assert sorted(drain(app).succeeded) == [second, copy]


def test_show_lists_dependencies_dependents_and_what_is_still_awaited(app, conn, dsn):
    first = app.enqueue("ok")
    second = app.enqueue("ok")
    third = app.enqueue("ok", after=[first, second])
    drain(app, max_jobs=1)
    shown = dependencies.of(dsn, third)
    assert shown.after == (
        dependencies.Edge(first, JobStatus.SUCCEEDED),
        dependencies.Edge(second, JobStatus.READY),
    )
    assert shown.dependents == () and shown.waiting_on == 1
    assert dependencies.of(dsn, first).dependents == (dependencies.Edge(third, JobStatus.WAITING),)
    assert dependencies.of(dsn, first).waiting_on is None


def test_eager_runs_jobs_with_after_as_they_are_enqueued() -> None:
    """Eager mode runs each job at enqueue, so its dependencies have run already; their fake
    ids (below 0) are not checked as job ids."""
    app = App("postgresql://nobody@127.0.0.1:1/nowhere")
    order: list[int] = []

    @app.task(name="step")
    def step(n: int) -> None:
        order.append(n)

    with eager(app):
        first = app.enqueue("step", {"n": 1})
        second = app.enqueue("step", {"n": 2}, after=[first])
        app.enqueue_many(
            [JobSpec("step", {"n": 3}), JobSpec("step", {"n": 4}, after=[Ref(0), second])]
        )
    assert order == [1, 2, 3, 4]
