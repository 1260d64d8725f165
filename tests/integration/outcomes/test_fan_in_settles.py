"""Settles of a fan-in's siblings at the same instant: each trip locks the rows the ends change
(the dependents' waiting rows, then the batches' rows) in one order, so two trips that end
siblings of the same fan-ins in opposite orders wait for each other instead of deadlocking; and
a graph's released jobs wake a worker as a new job does, whatever its poll interval."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pgjobs import App, JobSpec, Ref, Worker, WorkerConfig, queries
from pgjobs.completer import ClaimParams
from pgjobs.completer.arrays import int_array
from pgjobs.completer.params import SettleParams
from pgjobs.db.dsn import Dsn
from tests.support.helpers import assert_one_home, scalar, wait_until

QUEUE = "fan"


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    app = make_app()

    @app.task(name="step", queue=QUEUE)
    async def step(**payload: Any) -> None:
        return None

    return app


def deadlocks(conn: psycopg.Connection[Any]) -> int:
    """Deadlocks PostgreSQL has detected in the test database so far."""
    return int(
        scalar(conn, "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    )


def lease(conn: psycopg.Connection[Any], ids: list[int], owner: str) -> None:
    """Lease ``ids`` to ``owner`` for their first attempt, as a claim does, one after another:
    their rows' new versions lie in that order in the table, so that a settle that reads them in
    the table's order also meets them in the order given."""
    for job in ids:
        conn.execute(
            "UPDATE queued_jobs SET attempts = 1, lease_owner = %s, started_at = now(), "
            "lease_expires_at = now() + interval '5 minutes' WHERE id = %s",
            (owner, job),
        )


def _settle_many(conn: psycopg.Connection[Any], owner: str, ids: list[int]) -> None:
    params = SettleParams(
        owner, ok_ids=ids, ok_attempts=[1] * len(ids), ok_results=[None] * len(ids)
    )
    applied = conn.execute(queries.JOB_SETTLE_MANY, params.bind()).fetchall()
    assert len(applied) == len(ids)


def _succeed_and_claim(conn: psycopg.Connection[Any], owner: str, ids: list[int]) -> None:
    params = ClaimParams(owner, [QUEUE]).bind(0, limited=False, slots=0)
    params |= {"ok_ids": int_array(ids), "ok_attempts": int_array([1] * len(ids))}
    params["ok_results"] = None
    rows = conn.execute(queries.JOB_SUCCEED_AND_CLAIM, params).fetchall()
    assert len(rows[-1][3]["archived"]) == len(ids)


SETTLES = {"settle_many": _settle_many, "succeed_and_claim": _succeed_and_claim}


def _blocked(conn: psycopg.Connection[Any], pid: int) -> bool:
    """Backend ``pid`` waits for a lock."""
    return bool(
        scalar(
            conn,
            "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = %s",
            (pid,),
        )
    )


@pytest.mark.parametrize("statement", sorted(SETTLES))
def test_two_trips_ending_siblings_of_two_fan_ins_in_opposite_orders_do_not_deadlock(
    app: App, conn: psycopg.Connection[Any], dsn: Dsn, statement: str
) -> None:
    """The interleaving a run of 1 -> 100 -> 1 graphs deadlocked on: trip 1 ends a sibling of
    join 1, a batch member, then a sibling of join 2; trip 2 ends a sibling of join 2, a member
    of another batch, then a sibling of join 1. A third session holds both batches' rows until
    both trips are under way, so that each trip, locking row after row in the order its jobs
    came, would hold one join's row and wait for the other's."""
    settle = SETTLES[statement]
    b1, b4 = app.enqueue_many([JobSpec("step", {}), JobSpec("step", {})])
    batches: list[tuple[int, int]] = []
    for _ in range(2):
        with app.batch(on_complete=("step", {})) as batch:
            batch.enqueue("step", {})
        batches.append((batch.id, batch.ids[0]))
    (r1, x), (r2, y) = batches
    b3, b2 = app.enqueue_many([JobSpec("step", {}), JobSpec("step", {})])
    join1 = app.enqueue("step", {}, after=[b1, b2])
    join2 = app.enqueue("step", {}, after=[b3, b4])
    lease(conn, [b1, x, b3], "trip-1")
    lease(conn, [b4, y, b2], "trip-2")
    before = deadlocks(conn)
    errors: list[BaseException] = []

    def trip(owner: str, ids: list[int], session: psycopg.Connection[Any]) -> None:
        try:
            settle(session, owner, ids)
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    with (
        psycopg.connect(dsn.url) as holder,
        psycopg.connect(dsn.url, autocommit=True) as one,
        psycopg.connect(dsn.url, autocommit=True) as two,
    ):
        holder.execute("SELECT 1 FROM pgjobs_batches WHERE id = ANY(%s) FOR UPDATE", ([r1, r2],))
        first = threading.Thread(target=trip, args=("trip-1", [b1, x, b3], one))
        first.start()
        wait_until(lambda: errors or _blocked(conn, one.info.backend_pid), what="trip 1 to wait")
        assert errors == []
        second = threading.Thread(target=trip, args=("trip-2", [b4, y, b2], two))
        second.start()
        wait_until(lambda: _blocked(conn, two.info.backend_pid), what="trip 2 to wait for a lock")
        holder.rollback()
        first.join(60)
        second.join(60)
    assert errors == []
    assert deadlocks(conn) == before
    # Both joins released, once; both batches complete with their callbacks enqueued.
    assert scalar(conn, "SELECT count(*) FROM pgjobs_waiting") == 0
    released = scalar(
        conn,
        "SELECT count(*) FROM queued_jobs WHERE id = ANY(%s) AND run_at < 'infinity'",
        ([join1, join2],),
    )
    assert released == 2
    done = conn.execute(
        "SELECT pending, callback_job_id FROM pgjobs_batches WHERE id = ANY(%s) ORDER BY id",
        ([r1, r2],),
    ).fetchall()
    assert [pending for pending, _ in done] == [0, 0]
    callbacks = [job for _, job in done if job is not None]
    assert len(callbacks) == 2
    assert_one_home(conn, [b1, b2, b3, b4, x, y, join1, join2, *callbacks])


def _graphs(graphs: int, width: int) -> list[JobSpec]:
    """``graphs`` fan-out/fan-in graphs: a root, ``width`` jobs after it, a join after them."""
    specs: list[JobSpec] = []
    for _ in range(graphs):
        root = len(specs)
        specs.append(JobSpec("step", {}))
        specs += [JobSpec("step", {}, after=[Ref(root)]) for _ in range(width)]
        specs.append(JobSpec("step", {}, after=[Ref(root + 1 + n) for n in range(width)]))
    return specs


def _workers(app: App, count: int, poll: float) -> tuple[list[Worker], list[threading.Thread]]:
    config = WorkerConfig(
        concurrency=32, poll_interval=poll, stuck_after=poll * 2, maintenance=False
    )
    workers = [Worker(app, config) for _ in range(count)]
    threads = [threading.Thread(target=worker.run) for worker in workers]
    for thread in threads:
        thread.start()
    return workers, threads


def _listening(conn: psycopg.Connection[Any], listeners: int) -> bool:
    """``listeners`` sessions LISTEN (the workers are ready for a NOTIFY)."""
    return bool(
        scalar(
            conn,
            "SELECT count(*) >= %s FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LISTEN%%'",
            (listeners,),
        )
    )


def _ended(conn: psycopg.Connection[Any], ids: list[int]) -> bool:
    return bool(
        scalar(conn, "SELECT count(*) = %s FROM archived_jobs WHERE id = ANY(%s)", (len(ids), ids))
    )


def test_workers_run_many_fan_in_graphs_without_a_deadlock(
    app: App, conn: psycopg.Connection[Any]
) -> None:
    """Four workers on 50 graphs of 1 -> 100 -> 1 at once: the joins' siblings end in trips
    that mix the graphs in every order."""
    workers, threads = _workers(app, 4, 1.0)
    try:
        wait_until(lambda: _listening(conn, 4), what="the workers to listen")
        before = deadlocks(conn)
        ids = app.enqueue_many(_graphs(50, 100))
        wait_until(lambda: _ended(conn, ids), timeout=120, what="every graph to end")
    finally:
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(60)
    assert deadlocks(conn) == before
    assert scalar(conn, "SELECT count(*) FROM dead_letter") == 0
    assert_one_home(conn, ids)


def test_released_jobs_wake_a_worker_that_polls_once_a_minute(
    app: App, conn: psycopg.Connection[Any]
) -> None:
    """A chain through a fan-out and a fan-in: every job after the root is released by the end
    of the job before it, and only the release's NOTIFY can wake the worker before its poll."""
    workers, threads = _workers(app, 1, 60.0)
    try:
        wait_until(lambda: _listening(conn, 1), what="the worker to listen")
        ids = app.enqueue_many([*_graphs(1, 5), JobSpec("step", {}, after=[Ref(6)])])
        # Far below the poll interval: three releases in a row, each one woken or not at all.
        wait_until(lambda: _ended(conn, ids), timeout=30, what="the graph to end")
    finally:
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(60)
    assert_one_home(conn, ids)
