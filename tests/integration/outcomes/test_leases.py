"""Expired leases: the rescuer makes the job claimable again, or dead on its last attempt."""

from __future__ import annotations

from pgjobs import App
from pgjobs.maintenance import ServiceConfig
from pgjobs.maintenance.leases import LeaseRescuer, Rescued
from tests.support.factories import claim, lease_expired, row, run_service, work
from tests.support.helpers import assert_one_home, wait_until


def _claim_as_dead_worker(conn, job_id: int, **options) -> None:
    """Claim ``job_id`` with a tiny lease, as a worker that then vanishes, and wait for the lease
    to run out."""
    [job] = claim(conn, owner="dead-worker", lease=0.05, **options)
    assert job.id == job_id
    wait_until(lease_expired(conn, job_id), what="the lease to expire")


def test_expired_lease_is_rescued_and_the_job_runs_again(make_app, dsn, conn):
    app: App = make_app()
    runs = []

    @app.task(name="t.resize", max_attempts=3)
    def resize(image: str) -> str:
        runs.append(image)
        return f"resized {image}"

    job_id = app.enqueue("t.resize", {"image": "a.png"})
    _claim_as_dead_worker(conn, job_id)
    assert claim(conn, owner="other") == [], "an expired lease is not claimable until rescued"

    assert run_service(dsn, LeaseRescuer()) == Rescued(requeued=1, dead=0)
    ready = row(conn, "queued_jobs", job_id)
    assert ready is not None
    assert ready["lease_owner"] is None and ready["lease_expires_at"] is None
    assert ready["attempts"] == 1, "the crashed run used up an attempt"
    assert ready["last_error"] == "lease of worker dead-worker expired on attempt 1 of 3"
    assert run_service(dsn, LeaseRescuer()) == Rescued(requeued=0, dead=0)

    assert work(app) == 0
    assert runs == ["a.png"]
    assert assert_one_home(conn, [job_id]) == {job_id: "archived_jobs"}
    archived = row(conn, "archived_jobs", job_id)
    assert archived is not None
    assert (archived["status"], archived["attempts"]) == ("succeeded", 2)
    assert archived["worker"] not in (None, "dead-worker")
    assert archived["result"] == "resized a.png"


def test_expired_lease_on_the_last_attempt_goes_to_dead_letter(make_app, dsn, conn):
    app: App = make_app(check_task_names=False)
    job_id = app.enqueue("t.resize", {"image": "b.png"}, max_attempts=2)
    _claim_as_dead_worker(conn, job_id)
    assert run_service(dsn, LeaseRescuer()) == Rescued(requeued=1, dead=0)
    _claim_as_dead_worker(conn, job_id)

    assert run_service(dsn, LeaseRescuer()) == Rescued(requeued=0, dead=1)
    assert assert_one_home(conn, [job_id]) == {job_id: "dead_letter"}
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None
    assert dead["reason"] == "lease_expired"
    assert dead["attempts"] == 2 and dead["max_attempts"] == 2
    assert dead["worker"] == "dead-worker"
    assert dead["last_error"].startswith("lease of worker dead-worker expired on attempt 2 of 2")
    assert dead["error_type"] is None and dead["traceback"] is None
    assert dead["payload"] == {"image": "b.png"}


def test_at_most_once_job_is_dead_lettered_instead_of_run_again(make_app, dsn, conn):
    app: App = make_app(check_task_names=False)
    job_id = app.enqueue("t.charge", {}, max_attempts=5)
    _claim_as_dead_worker(conn, job_id, at_most_once_tasks=["t.charge"])

    assert run_service(dsn, LeaseRescuer()) == Rescued(requeued=0, dead=1)
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None
    assert dead["reason"] == "lease_expired"
    assert "at-most-once" in dead["last_error"]
    assert_one_home(conn, [job_id])


def test_live_leases_are_left_alone(make_app, dsn, conn):
    app: App = make_app(check_task_names=False)
    job_id = app.enqueue("t.resize", {})
    [job] = claim(conn, owner="busy-worker", lease=300)

    assert run_service(dsn, LeaseRescuer()) == Rescued(requeued=0, dead=0)
    leased = row(conn, "queued_jobs", job_id)
    assert leased is not None
    assert leased["lease_owner"] == "busy-worker"
    assert leased["lease_expires_at"] == job.lease_expires_at


def test_rescuer_works_through_more_than_one_batch(make_app, dsn, conn):
    app: App = make_app(check_task_names=False)
    ids = [app.enqueue("t.resize", {"n": n}) for n in range(5)]
    claim(conn, owner="dead-worker", lease=0.05)
    for job_id in ids:
        wait_until(lease_expired(conn, job_id), what="the leases to expire")

    rescuer = LeaseRescuer(ServiceConfig(interval=15, batch_size=2))
    assert run_service(dsn, rescuer) == Rescued(requeued=5, dead=0)
    assert {job.id for job in claim(conn, owner="w2")} == set(ids)
