"""expires_at: an expired job is archived as expired by the Expirer, never claimed or run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pgjobs import App
from pgjobs.maintenance import ServiceConfig
from pgjobs.maintenance.expirer import Expired, Expirer
from tests.support.factories import claim, counts, db_now, row, run_service, work
from tests.support.helpers import assert_one_home, wait_until


def test_expired_job_is_never_claimed_and_is_archived_as_expired(make_app, dsn, conn):
    app: App = make_app()
    runs = []

    @app.task(name="t.notify")
    def notify(n: int) -> None:
        runs.append(n)

    expired = app.enqueue("t.notify", {"n": 1}, expires_at=datetime.now(UTC) - timedelta(seconds=1))
    fresh = app.enqueue("t.notify", {"n": 2}, expires_in=3600)
    forever = app.enqueue("t.notify", {"n": 3})

    assert {job.id for job in claim(conn, limit=10, owner="peek")} == {fresh, forever}
    # Give the two claimed jobs back so that a real worker can run them below.
    conn.execute("UPDATE queued_jobs SET lease_owner = NULL, lease_expires_at = NULL")

    assert run_service(dsn, Expirer()) == Expired(expired=1)
    archived = row(conn, "archived_jobs", expired)
    assert archived is not None
    assert archived["status"] == "expired"
    assert archived["attempts"] == 0
    assert archived["worker"] is None and archived["result"] is None
    assert archived["payload"] == {"n": 1}
    assert archived["expires_at"] is not None
    assert run_service(dsn, Expirer()) == Expired(expired=0)

    assert work(app) == 0
    assert sorted(runs) == [2, 3], "the expired job must never run"
    assert set(assert_one_home(conn, [expired, fresh, forever]).values()) == {"archived_jobs"}
    statuses = dict(conn.execute("SELECT id, status FROM archived_jobs").fetchall())
    assert statuses == {expired: "expired", fresh: "succeeded", forever: "succeeded"}


def test_job_expiring_while_queued_stops_being_claimable(make_app, dsn, conn):
    app: App = make_app(check_task_names=False)
    job_id = app.enqueue("t.notify", {}, expires_in=0.2)
    queued = row(conn, "queued_jobs", job_id)
    assert queued is not None
    wait_until(lambda: db_now(conn) > queued["expires_at"], what="the job to expire")

    assert claim(conn) == []
    assert run_service(dsn, Expirer()) == Expired(expired=1)
    assert assert_one_home(conn, [job_id]) == {job_id: "archived_jobs"}


def test_expirer_leaves_a_running_job_to_its_worker(make_app, dsn, conn):
    app: App = make_app(check_task_names=False)
    job_id = app.enqueue("t.notify", {}, expires_in=0.2)
    claim(conn, owner="busy", lease=300)
    queued = row(conn, "queued_jobs", job_id)
    assert queued is not None
    wait_until(lambda: db_now(conn) > queued["expires_at"], what="the job to expire")

    assert run_service(dsn, Expirer()) == Expired(expired=0)
    assert row(conn, "queued_jobs", job_id)["lease_owner"] == "busy"  # type: ignore[index]


def test_expirer_works_through_more_than_one_batch(make_app, dsn, conn):
    app: App = make_app(check_task_names=False)
    past = datetime.now(UTC) - timedelta(minutes=1)
    for n in range(5):
        app.enqueue("t.notify", {"n": n}, expires_at=past)
    app.enqueue("t.notify", {"n": 99})

    assert run_service(dsn, Expirer(ServiceConfig(interval=30, batch_size=2))) == Expired(expired=5)
    assert counts(conn) == {"queued_jobs": 1, "archived_jobs": 5, "dead_letter": 0}
