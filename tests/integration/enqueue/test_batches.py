"""Batches: members written with the batch in one transaction, each first end counted by the
trigger, and the callback enqueued once with the counts in its payload."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pydantic
import pytest
import sqlalchemy

from pgjobs import (
    App,
    BatchNotFound,
    ConfigurationError,
    InvalidPayload,
    JobSpec,
    NonRetryableError,
    Ref,
    UnknownDependency,
    UnknownTask,
)
from pgjobs.enqueue import COPY_MIN_ROWS
from pgjobs.maintenance.expirer import Expired, Expirer
from tests.support.factories import counts, run_service, work
from tests.support.helpers import scalar


def batch_row(conn: psycopg.Connection[Any], batch_id: int) -> dict[str, Any]:
    cursor = conn.execute("SELECT * FROM pgjobs_batches WHERE id = %s", (batch_id,))
    names = [c.name for c in cursor.description or ()]
    found = cursor.fetchone()
    assert found is not None
    return dict(zip(names, found, strict=True))


def batch_ids_of(conn: psycopg.Connection[Any], ids: list[int]) -> set[int | None]:
    rows = conn.execute(
        "SELECT batch_id FROM queued_jobs WHERE id = ANY(%(ids)s) "
        "UNION ALL SELECT batch_id FROM archived_jobs WHERE id = ANY(%(ids)s) "
        "UNION ALL SELECT batch_id FROM dead_letter WHERE id = ANY(%(ids)s)",
        {"ids": ids},
    ).fetchall()
    assert len(rows) == len(set(ids))
    return {r[0] for r in rows}


def callbacks(conn: psycopg.Connection[Any], task: str = "reports.summarise") -> list[Any]:
    return [
        r[0]
        for r in conn.execute(
            "SELECT payload FROM queued_jobs WHERE task = %(t)s "
            "UNION ALL SELECT payload FROM archived_jobs WHERE task = %(t)s "
            "UNION ALL SELECT payload FROM dead_letter WHERE task = %(t)s",
            {"t": task},
        ).fetchall()
    ]


@pytest.fixture
def app(make_app: Any) -> App:
    app: App = make_app()
    summaries: list[dict[str, Any]] = []
    app.summaries = summaries  # type: ignore[attr-defined]

    @app.task(name="reports.render")
    def render(page: int, fail: bool = False) -> None:
        if fail:
            raise NonRetryableError(f"page {page} is broken")

    @app.task(name="reports.summarise", queue="summaries", max_attempts=2)
    def summarise(report: int, batch: dict[str, int]) -> None:
        summaries.append({"report": report, "batch": batch})

    return app


def test_members_and_batch_are_written_together_when_the_block_ends(app, conn):
    with app.batch(on_complete=("reports.summarise", {"report": 7})) as batch:
        for page in range(3):
            batch.enqueue("reports.render", {"page": page})
        assert counts(conn)["queued_jobs"] == 0, "nothing is written before the block ends"
    assert len(batch.ids) == 3 and batch.ids == sorted(batch.ids)
    assert batch_ids_of(conn, batch.ids) == {batch.id}
    row = batch_row(conn, batch.id)
    assert (row["total"], row["pending"], row["callback_task"]) == (3, 3, "reports.summarise")
    # The callback's queue and max_attempts are its task's.
    assert (row["callback_queue"], row["callback_max_attempts"]) == ("summaries", 2)
    payloads = conn.execute(
        "SELECT payload FROM queued_jobs WHERE id = ANY(%s) ORDER BY id", (batch.ids,)
    ).fetchall()
    assert [p[0] for p in payloads] == [{"page": 0}, {"page": 1}, {"page": 2}]


def test_an_exception_in_the_block_writes_nothing(app, conn):
    summary = ("reports.summarise", {"report": 7})
    with pytest.raises(RuntimeError), app.batch(on_complete=summary) as batch:
        batch.enqueue("reports.render", {"page": 1})
        raise RuntimeError("boom")
    assert counts(conn)["queued_jobs"] == 0
    assert scalar(conn, "SELECT count(*) FROM pgjobs_batches") == 0
    with pytest.raises(ConfigurationError, match="not written"):
        batch.id  # noqa: B018


def test_a_bad_member_is_refused_at_once_and_nothing_is_written(app, conn):
    with pytest.raises(UnknownTask), app.batch() as batch:
        batch.enqueue("reports.render", {"page": 1})
        batch.enqueue("reports.nope", {})
    with pytest.raises(ConfigurationError, match="priority"), app.batch() as batch:
        batch.enqueue("reports.render", {"page": 1}, priority=10**6)
    with pytest.raises(ConfigurationError, match=r"options of App\.enqueue"), app.batch() as batch:
        batch.enqueue("reports.render", {"page": 1}, colour="red")
    assert counts(conn)["queued_jobs"] == 0
    assert scalar(conn, "SELECT count(*) FROM pgjobs_batches") == 0


def test_callback_runs_once_with_the_counts_of_every_kind_of_end(app, dsn, conn):
    with app.batch(on_complete=("reports.summarise", {"report": 7})) as batch:
        batch.enqueue("reports.render", {"page": 1})
        batch.enqueue("reports.render", {"page": 2, "fail": True})
        batch.enqueue("reports.render", {"page": 3}, run_in=3600)  # cancelled below
        batch.enqueue(
            "reports.render", {"page": 4}, expires_at=datetime.now(UTC) - timedelta(seconds=1)
        )
    cancelled = batch.ids[2]
    app.cancel(cancelled)
    assert run_service(dsn, Expirer()) == Expired(expired=1)
    assert batch_row(conn, batch.id)["pending"] == 2
    assert callbacks(conn) == []

    work(app)
    assert app.summaries == [
        {
            "report": 7,
            "batch": {"id": batch.id, "total": 4, "succeeded": 1, "dead": 1, "cancelled": 2},
        }
    ]
    status = app.batch_status(batch.id)
    assert (status.total, status.pending, status.succeeded, status.dead, status.cancelled) == (
        4,
        0,
        1,
        1,
        2,
    )
    assert status.complete and status.callback_task == "reports.summarise"
    assert status.callback_queue == "summaries"
    assert status.members == {"succeeded": 1, "dead": 1, "cancelled": 1, "expired": 1}
    assert status.callback_job_id is not None
    callback = app.job(status.callback_job_id)
    assert (callback.status, callback.queue, callback.max_attempts) == ("succeeded", "summaries", 2)
    assert len(callbacks(conn)) == 1


def test_batch_status_counts_members_by_where_they_are_now(app, conn):
    with app.batch(on_complete=("reports.summarise", {"report": 1})) as b:
        b.enqueue("reports.render", {"page": 1})
        b.enqueue("reports.render", {"page": 2}, run_in=3600)
    status = app.batch_status(b.id)
    assert status.members == {"ready": 1, "scheduled": 1}
    assert (status.pending, status.completed_at, status.callback_job_id) == (2, None, None)
    assert status.created_at is not None


def test_batch_status_of_an_unknown_or_bad_id_is_a_one_line_error(app):
    with pytest.raises(BatchNotFound, match="no batch 424242"):
        app.batch_status(424242)
    for bad in (0, -1, 2**63, "7", True):
        with pytest.raises(ConfigurationError, match="batch id"):
            app.batch_status(bad)


def test_a_redriven_dead_member_is_not_counted_twice(app, conn):
    with app.batch(on_complete=("reports.summarise", {"report": 7})) as batch:
        batch.enqueue("reports.render", {"page": 1, "fail": True})
        batch.enqueue("reports.render", {"page": 2}, queue="later")  # which no worker serves
    dead, later = batch.ids
    work(app)
    assert batch_row(conn, batch.id)["dead"] == 1
    # Redriven with a payload that succeeds now; its second end is not counted.
    conn.execute("UPDATE dead_letter SET payload = '{\"page\": 1}' WHERE id = %s", (dead,))
    assert app.redrive(dead) == 1
    work(app)
    row = batch_row(conn, batch.id)
    assert (row["pending"], row["succeeded"], row["dead"]) == (1, 0, 1)
    assert app.batch_status(batch.id).members == {"succeeded": 1, "ready": 1}
    conn.execute("UPDATE queued_jobs SET queue = 'default' WHERE id = %s", (later,))
    work(app)
    assert [s["batch"] for s in app.summaries] == [
        {"id": batch.id, "total": 2, "succeeded": 1, "dead": 1, "cancelled": 0}
    ]


def test_an_empty_batch_is_complete_at_once_and_its_callback_enqueued(app, conn):
    with app.batch(on_complete=("reports.summarise", {"report": 7})) as batch:
        pass
    assert batch.ids == []
    status = app.batch_status(batch.id)
    assert (status.total, status.pending, status.complete) == (0, 0, True)
    assert callbacks(conn) == [
        {
            "report": 7,
            "batch": {"id": batch.id, "total": 0, "succeeded": 0, "dead": 0, "cancelled": 0},
        }
    ]
    assert status.callback_job_id == scalar(conn, "SELECT id FROM queued_jobs")
    work(app)
    assert len(app.summaries) == 1


def test_a_batch_without_a_callback_is_tracked(app, conn):
    with app.batch() as batch:
        batch.enqueue("reports.render", {"page": 1})
    work(app)
    status = app.batch_status(batch.id)
    assert (status.succeeded, status.complete, status.callback_task) == (1, True, None)
    assert status.callback_job_id is None
    assert counts(conn) == {"queued_jobs": 0, "archived_jobs": 1, "dead_letter": 0}


@pytest.mark.parametrize("size", [1, 5, COPY_MIN_ROWS])
def test_enqueue_many_with_a_batch_takes_every_insert_path(app, conn, size):
    batch = app.batch(on_complete=("reports.summarise", {"report": 7}))
    ids = app.enqueue_many(
        (JobSpec("reports.render", {"page": n}) for n in range(size)), batch=batch
    )
    assert ids == batch.ids and len(ids) == size
    assert batch_ids_of(conn, ids) == {batch.id}
    assert batch_row(conn, batch.id)["total"] == size
    with pytest.raises(ConfigurationError, match="written already"):
        app.enqueue_many([JobSpec("reports.render", {"page": 1})], batch=batch)


def test_enqueue_many_in_a_with_block_writes_the_batch_once(app, conn):
    with app.batch(on_complete=("reports.summarise", {"report": 7})) as batch:
        ids = app.enqueue_many(
            [JobSpec("reports.render", {"page": n}) for n in range(3)], batch=batch
        )
    assert ids == batch.ids
    assert scalar(conn, "SELECT count(*) FROM pgjobs_batches") == 1
    assert counts(conn)["queued_jobs"] == 3 and batch_ids_of(conn, ids) == {batch.id}

    async def in_async_with() -> None:
        async with app.batch() as batch:
            await app.enqueue_many_async([JobSpec("reports.render", {"page": 9})], batch=batch)
        await app.aclose()

    asyncio.run(in_async_with())
    assert scalar(conn, "SELECT count(*) FROM pgjobs_batches") == 2
    assert counts(conn)["queued_jobs"] == 4


def test_members_may_wait_for_each_other_and_for_other_jobs(app, conn):
    earlier = app.enqueue("reports.render", {"page": 0})
    with app.batch(on_complete=("reports.summarise", {"report": 7})) as batch:
        batch.enqueue("reports.render", {"page": 1})
        # Ref(n) in a batch names its member n; a job id, any job.
        batch.enqueue("reports.render", {"page": 2}, after=[Ref(0), earlier])
        app.enqueue_many(
            [
                JobSpec("reports.render", {"page": 3}, unique_key="p3"),
                JobSpec("reports.render", {"page": 4}, after=[Ref(0)], group="g", tags=["t"]),
            ],
            batch=batch,
        )
    assert batch_ids_of(conn, batch.ids) == {batch.id}
    assert batch_row(conn, batch.id)["total"] == 4
    waiting = conn.execute("SELECT id FROM queued_jobs WHERE run_at = 'infinity'").fetchall()
    assert {w[0] for w in waiting} == {batch.ids[1], batch.ids[3]}
    edges = conn.execute(
        "SELECT job_id, depends_on FROM pgjobs_dependencies ORDER BY job_id, depends_on"
    ).fetchall()
    # The call's Ref(0) names the call's first job (page 3), as enqueue_many's does.
    assert edges == sorted(
        [(batch.ids[1], batch.ids[0]), (batch.ids[1], earlier), (batch.ids[3], batch.ids[2])]
    )
    work(app)
    assert app.batch_status(batch.id).succeeded == 4
    assert [s["batch"]["succeeded"] for s in app.summaries] == [4]


def test_a_member_waiting_for_a_member_that_fails_is_counted_dead(app, conn):
    with app.batch(on_complete=("reports.summarise", {"report": 7})) as batch:
        batch.enqueue("reports.render", {"page": 1, "fail": True})
        batch.enqueue("reports.render", {"page": 2}, after=[Ref(0)])
    work(app)
    status = app.batch_status(batch.id)
    assert (status.complete, status.succeeded, status.dead) == (True, 0, 2)
    reason = scalar(conn, "SELECT reason FROM dead_letter WHERE id = %s", (batch.ids[1],))
    assert reason == "dependency_failed"


@pytest.mark.parametrize("earlier", [0, 2], ids=["first call", "after two members"])
def test_a_member_waiting_for_an_unknown_job_writes_no_batch(app, conn, earlier):
    before = counts(conn)
    batch = app.batch(on_complete=("reports.summarise", {"report": 7}))
    for page in range(earlier):
        batch.enqueue("reports.render", {"page": page})
    specs = [JobSpec("reports.render", {"page": 1}), JobSpec("reports.render", after=[10**12])]
    with pytest.raises(UnknownDependency) as raised:
        app.enqueue_many(specs, batch=batch)
    position = earlier + 1
    assert str(raised.value).startswith(f"job #{position}: no job {10**12} to wait for")
    assert raised.value.field == f"jobs[{position}].after"
    assert counts(conn) == before
    assert scalar(conn, "SELECT count(*) FROM pgjobs_batches") == 0


def test_a_member_may_not_wait_for_a_later_member(app, conn):
    with pytest.raises(ConfigurationError, match="a job listed after it"), app.batch() as batch:
        batch.enqueue("reports.render", {"page": 1}, after=[Ref(1)])
        batch.enqueue("reports.render", {"page": 2})
    assert counts(conn)["queued_jobs"] == 0
    assert scalar(conn, "SELECT count(*) FROM pgjobs_batches") == 0


def test_the_plain_enqueue_writes_no_batch(app, conn):
    job_id = app.enqueue("reports.render", {"page": 1})
    ids = app.enqueue_many(JobSpec("reports.render", {"page": n}) for n in range(COPY_MIN_ROWS))
    assert batch_ids_of(conn, [job_id, *ids]) == {None}


def test_a_member_whose_unique_key_is_held_is_the_holder_and_no_member(app, conn):
    holder = app.enqueue("reports.render", {"page": 0}, unique_key="page-0")
    with app.batch(on_complete=("reports.summarise", {"report": 7})) as batch:
        batch.enqueue("reports.render", {"page": 0}, unique_key="page-0")
        batch.enqueue("reports.render", {"page": 1}, unique_key="page-1")
    assert batch.ids[0] == holder
    assert batch_ids_of(conn, [holder]) == {None}
    assert batch_ids_of(conn, batch.ids[1:]) == {batch.id}
    assert batch_row(conn, batch.id)["total"] == 1


def test_a_batch_whose_every_key_is_held_completes_at_once(app, conn):
    app.enqueue("reports.render", {"page": 0}, idempotency_key="p0")
    with app.batch(on_complete=("reports.summarise", {"report": 7})) as batch:
        batch.enqueue("reports.render", {"page": 0}, idempotency_key="p0")
    assert app.batch_status(batch.id).complete
    assert len(callbacks(conn)) == 1


def test_callback_options_come_from_a_jobspec(app, conn):
    spec = JobSpec("reports.summarise", {"report": 7}, queue="urgent", priority=9, max_attempts=4)
    with app.batch(on_complete=spec) as batch:
        batch.enqueue("reports.render", {"page": 1})
    row = batch_row(conn, batch.id)
    assert (row["callback_queue"], row["callback_priority"], row["callback_max_attempts"]) == (
        "urgent",
        9,
        4,
    )


def test_a_versioned_callback_stores_its_payload_version(make_app, conn):
    app: App = make_app()

    @app.task(name="reports.summarise", version=3, upgrade={1: dict, 2: dict})
    def summarise(batch: dict[str, int]) -> None: ...

    with app.batch(on_complete="reports.summarise") as batch:
        pass
    assert batch_row(conn, batch.id)["callback_payload_version"] == 3
    assert scalar(conn, "SELECT payload_version FROM queued_jobs") == 3


def test_bad_callbacks_are_one_line_errors(app, make_app, conn):
    plain: App = make_app()

    @plain.task(name="reports.plain")
    def no_batch_parameter(report: int) -> None: ...

    cases: list[tuple[Any, type[Exception], str]] = [
        ("reports.nope", UnknownTask, "on_complete: unknown task"),
        (42, ConfigurationError, "on_complete must be"),
        (("reports.summarise", {"report": 1}, 3), ConfigurationError, "on_complete must be"),
        (JobSpec("reports.summarise", run_in=5), ConfigurationError, "not run_in"),
        (("reports.summarise", {"batch": 1}), ConfigurationError, "'batch' key"),
        (("reports.summarise", {"report": "x"}), InvalidPayload, "on_complete"),
    ]
    for on_complete, error, words in cases:
        with pytest.raises(error, match=words):
            app.batch(on_complete=on_complete)
    with pytest.raises(InvalidPayload, match="batch"):
        plain.batch(on_complete=("reports.plain", {"report": 1}))
    assert scalar(conn, "SELECT count(*) FROM pgjobs_batches") == 0


class Counts(pydantic.BaseModel):
    id: int
    total: int
    succeeded: int
    dead: int
    cancelled: int


class Summary(pydantic.BaseModel):
    report: int
    batch: Counts


def test_a_pydantic_callback_declares_the_batch_as_a_field(make_app, conn):
    app: App = make_app()
    seen: list[Summary] = []

    @app.task(name="reports.summarise")
    def summarise(summary: Summary) -> None:
        seen.append(summary)

    @app.task(name="reports.render")
    def render(page: int) -> None: ...

    with app.batch(on_complete=("reports.summarise", {"report": 7})) as batch:
        batch.enqueue("reports.render", {"page": 1})
    work(app)
    assert [s.batch.succeeded for s in seen] == [1]


def test_the_callers_psycopg_transaction_commits_or_rolls_back_the_batch(app, dsn, conn):
    with psycopg.connect(dsn.url) as tx:
        with app.batch(on_complete=("reports.summarise", {"report": 7}), connection=tx) as b:
            b.enqueue("reports.render", {"page": 1})
        assert scalar(conn, "SELECT count(*) FROM pgjobs_batches") == 0
        tx.rollback()
    assert counts(conn)["queued_jobs"] == 0
    assert scalar(conn, "SELECT count(*) FROM pgjobs_batches") == 0
    with psycopg.connect(dsn.url) as tx:
        batch = app.batch(on_complete=("reports.summarise", {"report": 7}))
        specs = [JobSpec("reports.render", {"page": n}) for n in range(COPY_MIN_ROWS)]
        ids = app.enqueue_many(specs, batch=batch, connection=tx)
        tx.commit()
    assert batch_ids_of(conn, ids) == {batch.id}


def test_a_refused_batch_leaves_the_callers_transaction_as_it_was(app, dsn, conn):
    with psycopg.connect(dsn.url) as tx:
        tx.execute("CREATE TEMP TABLE mine (n int)")
        batch = app.batch(on_complete=("reports.summarise", {"report": 7}))
        specs = [JobSpec("reports.render", {"page": 1}), JobSpec("reports.render", after=[10**12])]
        with pytest.raises(UnknownDependency):
            app.enqueue_many(specs, batch=batch, connection=tx)
        tx.execute("INSERT INTO mine VALUES (1)")  # the caller's transaction goes on
        tx.commit()
    assert scalar(conn, "SELECT count(*) FROM pgjobs_batches") == 0
    assert counts(conn)["queued_jobs"] == 0


def test_a_sqlalchemy_connection_writes_the_batch_in_its_transaction(app, dsn, conn):
    engine = sqlalchemy.create_engine(dsn.sqlalchemy_url, poolclass=sqlalchemy.NullPool)
    try:
        with engine.connect() as sa_conn:
            with app.batch(connection=sa_conn) as batch:
                batch.enqueue("reports.render", {"page": 1})
                batch.enqueue("reports.render", {"page": 2}, unique_key="p2")
            sa_conn.commit()
    finally:
        engine.dispose()
    assert batch_ids_of(conn, batch.ids) == {batch.id}
    assert batch_row(conn, batch.id)["total"] == 2


def test_async_with_and_enqueue_many_async_write_the_batch(app, dsn, conn):
    async def enqueue() -> tuple[Any, Any, list[int]]:
        async with app.batch(on_complete=("reports.summarise", {"report": 7})) as first:
            first.enqueue("reports.render", {"page": 1})
            first.enqueue("reports.render", {"page": 2})
        second = app.batch()
        specs = [JobSpec("reports.render", {"page": n}) for n in range(COPY_MIN_ROWS)]
        ids = await app.enqueue_many_async(specs, batch=second)
        async with await psycopg.AsyncConnection.connect(dsn.url) as tx:
            third = app.batch()
            await app.enqueue_many_async(specs[:3], batch=third, connection=tx)
            await tx.rollback()
        await app.aclose()
        return first, second, ids

    first, second, ids = asyncio.run(enqueue())
    assert batch_ids_of(conn, first.ids) == {first.id}
    assert ids == second.ids and batch_ids_of(conn, ids) == {second.id}
    assert batch_row(conn, first.id)["total"] == 2
    assert batch_row(conn, second.id)["total"] == COPY_MIN_ROWS
    assert scalar(conn, "SELECT count(*) FROM pgjobs_batches") == 2
    assert counts(conn)["queued_jobs"] == 2 + COPY_MIN_ROWS
