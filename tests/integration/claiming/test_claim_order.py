"""The claim: priority then run_at order, scheduled jobs wait for their time, queue filtering."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pgjobs import App, JobSpec
from tests.support.factories import claim, db_now, row, work
from tests.support.helpers import wait_until

PAST = datetime(2020, 1, 1, tzinfo=UTC)


def _claim_one_by_one(conn, queues=("default",)) -> list[int]:
    order: list[int] = []
    while batch := claim(conn, queues=queues, limit=1):
        order.extend(job.id for job in batch)
    return order


def test_higher_priority_first_then_older_run_at(make_app, conn):
    app: App = make_app(check_task_names=False)
    ids = app.enqueue_many(
        [
            JobSpec("t", {"n": 0}, priority=0, run_at=PAST + timedelta(minutes=1)),
            JobSpec("t", {"n": 1}, priority=5, run_at=PAST + timedelta(minutes=2)),
            JobSpec("t", {"n": 2}, priority=-3, run_at=PAST),
            JobSpec("t", {"n": 3}, priority=5, run_at=PAST + timedelta(minutes=1)),
            JobSpec("t", {"n": 4}, priority=0, run_at=PAST),
            JobSpec("t", {"n": 5}, priority=10, run_at=PAST + timedelta(minutes=3)),
        ]
    )
    assert _claim_one_by_one(conn) == [ids[5], ids[3], ids[1], ids[4], ids[0], ids[2]]


def test_equal_priority_and_run_at_claims_in_enqueue_order(make_app, conn):
    app: App = make_app(check_task_names=False)
    ids = app.enqueue_many([JobSpec("t", {"n": n}, run_at=PAST) for n in range(5)])
    assert _claim_one_by_one(conn) == ids


def test_order_holds_across_the_queues_of_one_claim(make_app, conn):
    app: App = make_app(check_task_names=False)
    # Enqueued (and scheduled) in the reverse of the claim order, so only priority decides.
    low = app.enqueue("t", {}, queue="a", priority=1, run_at=PAST)
    mid = app.enqueue("t", {}, queue="a", priority=5, run_at=PAST + timedelta(minutes=1))
    high = app.enqueue("t", {}, queue="b", priority=9, run_at=PAST + timedelta(minutes=2))
    assert _claim_one_by_one(conn, queues=["a", "b"]) == [high, mid, low]


def test_a_batch_claims_the_best_jobs(make_app, conn):
    app: App = make_app(check_task_names=False)
    ids = app.enqueue_many([JobSpec("t", {"n": n}, priority=n, run_at=PAST) for n in range(6)])
    claimed = {job.id for job in claim(conn, limit=3)}
    assert claimed == set(ids[3:])


def test_claim_only_takes_the_requested_queues(make_app, conn):
    app: App = make_app(check_task_names=False)
    emails = app.enqueue("t", {}, queue="emails")
    reports = app.enqueue("t", {}, queue="reports")
    default = app.enqueue("t", {})

    assert claim(conn, queues=["nothing-here"]) == []
    assert [job.id for job in claim(conn, queues=["emails"])] == [emails]
    assert claim(conn, queues=["emails"]) == []
    assert {job.id for job in claim(conn, queues=["reports", "default"])} == {reports, default}


def test_scheduled_job_is_not_claimed_before_its_time(make_app, conn):
    app: App = make_app(check_task_names=False)
    later = app.enqueue("t", {"when": "later"}, run_in=3600)
    at = app.enqueue("t", {"when": "at"}, run_at=datetime.now(UTC) + timedelta(hours=1))
    soon = app.enqueue("t", {"when": "soon"}, run_in=timedelta(seconds=0.3))

    scheduled = row(conn, "queued_jobs", later)
    assert scheduled is not None
    assert scheduled["run_at"] > db_now(conn) + timedelta(minutes=59)
    assert claim(conn) == []

    soon_row = row(conn, "queued_jobs", soon)
    assert soon_row is not None
    wait_until(lambda: db_now(conn) > soon_row["run_at"], what="the scheduled time")
    assert [job.id for job in claim(conn)] == [soon]
    assert claim(conn) == []
    assert {row(conn, "queued_jobs", i)["attempts"] for i in (later, at)} == {0}  # type: ignore[index]


def test_worker_runs_jobs_in_priority_order(make_app, conn):
    app: App = make_app()
    order: list[int] = []

    @app.task(name="t.record")
    def record(n: int) -> None:
        order.append(n)

    app.enqueue_many(
        [JobSpec("t.record", {"n": n}, priority=p, run_at=PAST) for n, p in enumerate([1, 3, 2])]
    )
    assert work(app, concurrency=1) == 0
    assert order == [1, 2, 0]


def test_worker_only_works_its_queues(make_app, conn):
    app: App = make_app()

    @app.task(name="t.noop", queue="mine")
    def noop() -> None:
        pass

    mine = app.enqueue("t.noop", {})
    theirs = app.enqueue("t.noop", {}, queue="theirs")
    assert work(app, queues=["mine"]) == 0
    assert row(conn, "archived_jobs", mine) is not None
    untouched = row(conn, "queued_jobs", theirs)
    assert untouched is not None and untouched["attempts"] == 0
