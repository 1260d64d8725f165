"""A payload shape change deployed with jobs in flight, with real `pgjobs work` processes: the
release before it (version 1) and the release that changes it (version 2, upgrading 1 -> 2), as
two apps of this module. Old producer -> new worker: upgraded and run. New producer -> old
worker: given back (not dead-lettered), and run by a new worker. Both releases working the same
queue at once, as during a rolling deploy: every job runs once, none is lost or dead."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

import pgjobs
from pgjobs import App, JobSpec
from tests.support.helpers import Proc, assert_one_home, count, scalar, stop, wait_until

TASK = "billing.charge"


def declare_v1(app: App) -> None:
    """The release before the change: charge(order, amount) in euros."""

    @app.task(name=TASK)
    def charge(order: int, amount: float) -> str:
        return f"v1 {order} {amount:.2f}"


def to_cents(payload: dict[str, Any]) -> dict[str, Any]:
    return {"order": payload["order"], "cents": round(payload["amount"] * 100)}


def declare_v2(app: App) -> None:
    """The release that changes the payload: charge(order, cents), version 2."""

    @app.task(name=TASK, version=2, upgrade={1: to_cents})
    def charge(order: int, cents: int) -> str:
        return f"v2 {order} {cents}"


# The workers' apps (`pgjobs work --app tests.acceptance.test_versions_deploy:release_N`); their
# database comes from $PGJOBS_DATABASE_URL.
release_1 = pgjobs.App()
declare_v1(release_1)
release_2 = pgjobs.App()
declare_v2(release_2)


def worker(spawn: Callable[..., Proc], release: str, *extra: str) -> Proc:
    app = f"tests.acceptance.test_versions_deploy:{release}"
    return spawn("work", "--app", app, "--poll-interval", "0.2", "--concurrency", "4", *extra)


def results(conn: psycopg.Connection[Any]) -> dict[int, str]:
    rows = conn.execute(
        "SELECT id, result #>> '{}' FROM archived_jobs WHERE status = 'succeeded'"
    ).fetchall()
    return dict(rows)


def test_old_producer_new_worker_then_new_producer_old_worker(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    old_producer, new_producer = make_app(), make_app()
    declare_v1(old_producer)
    declare_v2(new_producer)

    # Jobs enqueued by the old release, still queued when the new one is deployed.
    old_jobs = old_producer.enqueue_many(
        [JobSpec(TASK, {"order": n, "amount": n + 0.25}) for n in range(20)]
    )
    new_worker = worker(spawn, "release_2", "--burst")
    assert new_worker.wait_exit(60) == 0, new_worker.describe()
    done = results(conn)
    assert {done[job] for job in old_jobs} == {f"v2 {n} {n * 100 + 25}" for n in range(20)}

    # Jobs of the new release reach a worker of the old one (not redeployed yet).
    new_jobs = new_producer.enqueue_many(
        [JobSpec(TASK, {"order": 100 + n, "cents": n}) for n in range(5)]
    )
    old_worker = worker(spawn, "release_1")
    wait_until(
        lambda: all(f"job {job} ({TASK})" in old_worker.err() for job in new_jobs),
        timeout=60,
        what="the old worker giving back every new job",
        procs=[old_worker],
    )
    assert stop([old_worker], timeout=30) == [0]
    log = old_worker.err()
    assert "released for another worker" in log and "payload is version 2" in log
    assert count(conn, "dead_letter") == 0
    assert scalar(
        conn, "SELECT count(*) FROM queued_jobs WHERE attempts = 0 AND lease_owner IS NULL"
    ) == len(new_jobs)  # given back with their attempt refunded

    new_worker = worker(spawn, "release_2", "--burst")
    assert new_worker.wait_exit(60) == 0, new_worker.describe()
    done = results(conn)
    assert {done[job] for job in new_jobs} == {f"v2 {100 + n} {n}" for n in range(5)}
    assert_one_home(conn, [*old_jobs, *new_jobs])
    assert (
        scalar(conn, "SELECT max(attempts) FROM archived_jobs WHERE id = ANY(%s)", [new_jobs]) == 1
    )


def test_both_releases_working_at_once_run_every_job_once(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], spawn: Callable[..., Proc]
) -> None:
    old_producer, new_producer = make_app(), make_app()
    declare_v1(old_producer)
    declare_v2(new_producer)
    old_worker, new_worker = worker(spawn, "release_1"), worker(spawn, "release_2")
    # Both registered (their signal handlers are in place by then): the jobs can take less time
    # than a worker's start-up, and a SIGTERM before its handlers ends it with the signal.
    wait_until(
        lambda: count(conn, "pgjobs_workers") == 2,
        timeout=60,
        what="both workers registered",
        procs=[old_worker, new_worker],
    )

    v1_jobs: dict[int, int] = {}  # job id -> order
    v2_jobs: dict[int, int] = {}
    for batch in range(10):  # both releases enqueue while both work
        orders = [batch * 10 + n for n in range(5)]
        v1_jobs.update(
            zip(
                old_producer.enqueue_many(
                    [JobSpec(TASK, {"order": o, "amount": 1.5}) for o in orders]
                ),
                orders,
                strict=True,
            )
        )
        v2_jobs.update(
            zip(
                new_producer.enqueue_many(
                    [JobSpec(TASK, {"order": o, "cents": 7}) for o in orders]
                ),
                orders,
                strict=True,
            )
        )
    ids = [*v1_jobs, *v2_jobs]

    wait_until(
        lambda: count(conn, "archived_jobs") == len(ids),
        timeout=120,
        what=lambda: f"{len(ids)} jobs archived (now {count(conn, 'archived_jobs')})",
        procs=[old_worker, new_worker],
    )
    assert stop([old_worker, new_worker], timeout=30) == [0, 0]
    assert set(assert_one_home(conn, ids).values()) == {"archived_jobs"}
    done = results(conn)
    # A version 2 job ran on the new release only; a version 1 job on either (upgraded on the new).
    assert {job: done[job] for job in v2_jobs} == {job: f"v2 {o} 7" for job, o in v2_jobs.items()}
    for job, order in v1_jobs.items():
        assert done[job] in (f"v1 {order} 1.50", f"v2 {order} 150"), done[job]
    assert count(conn, "dead_letter") == 0
