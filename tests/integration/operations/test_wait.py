"""Waiting for a job's end: ``app.wait`` and ``app.wait_async``, woken by the notification of
the trigger ``pgjobs_job_ended``, every waiter of an app sharing one LISTEN connection."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from pgjobs import (
    App,
    JobCancelled,
    JobExpired,
    JobFailed,
    JobNotFound,
    JobSpec,
    NonRetryableError,
    WaitTimeout,
    Worker,
    WorkerConfig,
    queries,
    results,
)
from pgjobs.errors import ConfigurationError
from tests.support.admin_factories import claim_one, fail_for_good, succeed
from tests.support.external import run_worker_while
from tests.support.helpers import scalar, wait_until

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")

#: The listening connection of the waiters, as pg_stat_activity shows it.
LISTENERS = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = %s"
)


def listeners(conn: psycopg.Connection[Any]) -> int:
    return int(scalar(conn, LISTENERS, [queries.RESULT_LISTEN]))


def _app(make_app: Any, **kwargs: Any) -> App:
    app: App = make_app(**kwargs)

    @app.task(name="t.add")
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="t.nothing")
    async def nothing() -> None:
        return None

    @app.task(name="t.decline", max_attempts=1)
    def decline(order: int) -> None:
        raise NonRetryableError(f"card declined for order {order}")

    return app


def waiting(app: App, job_id: int, timeout: float = 30) -> Future[Any]:
    """``app.wait(job_id)`` in a thread of its own, once it waits (its job is watched)."""
    pool = ThreadPoolExecutor(1)
    future = pool.submit(app.wait, job_id, timeout=timeout)
    pool.shutdown(wait=False)
    wait_until(lambda: app._waiters.pending or future.done(), what="the waiter to register")
    return future


def test_wait_returns_the_result_when_a_worker_ends_the_job(make_app):
    app = _app(make_app)
    ids = [app.enqueue("t.add", {"a": 1, "b": 2}), app.enqueue("t.nothing")]
    got: list[Any] = []
    run_worker_while(app, lambda _: got.extend(app.wait(job_id, timeout=30) for job_id in ids))
    assert got == [3, None]


def test_a_job_that_ended_before_the_call_answers_at_once(make_app, conn):
    app = _app(make_app, check_task_names=False)
    job_id = app.enqueue("t.add", {"a": 2, "b": 2})
    succeed(conn, claim_one(conn, job_id))  # archived with the result "ok", unwatched
    assert app.wait(job_id, timeout=0) == "ok"
    other = app.enqueue("t.add", {"a": 2, "b": 2})
    fail_for_good(conn, claim_one(conn, other), "ValueError: no")
    with pytest.raises(JobFailed) as failed:
        app.wait(other, timeout=0)
    assert (failed.value.job_id, failed.value.reason) == (other, "exhausted")
    assert failed.value.error_type == "builtins.ValueError"
    assert failed.value.last_error == "ValueError: no"


def test_a_dead_job_raises_job_failed_with_its_dead_letter(make_app):
    app = _app(make_app)
    job_id = app.enqueue("t.decline", {"order": 7})
    raised: list[BaseException] = []

    def scenario(_: Worker) -> None:
        with pytest.raises(JobFailed) as failed:
            app.wait(job_id, timeout=30)
        raised.append(failed.value)

    run_worker_while(app, scenario)
    (exc,) = raised
    assert isinstance(exc, JobFailed)
    assert exc.reason == "non_retryable"
    assert exc.error_type == "pgjobs.errors.NonRetryableError"
    assert "card declined for order 7" in (exc.last_error or "")
    assert "\n" not in str(exc) and f"job {job_id} failed (non_retryable)" in str(exc)


def test_a_cancelled_job_raises_job_cancelled_and_wakes_its_waiter(make_app, conn):
    app = _app(make_app)
    job_id = app.enqueue("t.add", {"a": 1, "b": 1}, run_in=3600)
    future = waiting(app, job_id)
    assert scalar(conn, "SELECT watched FROM queued_jobs WHERE id = %s", [job_id]) is True
    app.cancel(job_id)
    with pytest.raises(JobCancelled) as cancelled:
        future.result(timeout=30)
    assert not isinstance(cancelled.value, JobExpired)
    assert str(cancelled.value) == f"job {job_id} was cancelled"


def test_an_expired_job_raises_job_expired(make_app, conn):
    app = _app(make_app)
    job_id = app.enqueue("t.add", {"a": 1, "b": 1}, run_in=3600, expires_in=7200)
    future = waiting(app, job_id)
    conn.execute("UPDATE queued_jobs SET expires_at = now() WHERE id = %s", [job_id])
    conn.execute(queries.JOB_EXPIRE_MANY, {"limit": 10})
    with pytest.raises(JobExpired, match=f"job {job_id} was expired"):
        future.result(timeout=30)


def test_a_job_that_does_not_end_in_time_raises_wait_timeout(make_app, conn):
    app = _app(make_app)
    job_id = app.enqueue("t.add", {"a": 1, "b": 1}, run_in=3600)
    with pytest.raises(WaitTimeout, match=rf"^job {job_id} has not ended within 0\.2s$"):
        app.wait(job_id, timeout=0.2)
    assert app._waiters.pending == 0, "the waiter left"
    # The job goes on, watched: a later wait is woken by its end.
    assert scalar(conn, "SELECT watched FROM queued_jobs WHERE id = %s", [job_id]) is True


def test_an_unknown_id_and_bad_arguments_are_one_line_errors(make_app, conn):
    app = _app(make_app)
    with pytest.raises(JobNotFound, match=r"^no job 424242 in any pgjobs table"):
        app.wait(424242, timeout=1)
    for job_id, timeout in ((0, 1), ("7", 1), (True, 1), (1, -1), (1, float("nan")), (1, "x")):
        with pytest.raises(ConfigurationError) as bad:
            app.wait(job_id, timeout=timeout)  # type: ignore[arg-type]
        assert "\n" not in str(bad.value)
    with pytest.raises(JobNotFound):
        asyncio.run(app.wait_async(424242, timeout=1))
    assert scalar(conn, "SELECT count(*) FROM queued_jobs") == 0


def test_a_thousand_async_waiters_share_one_listen_connection(make_app, conn):
    app = _app(make_app)
    ids = app.enqueue_many(JobSpec("t.add", {"a": n, "b": 1}, run_in=3600) for n in range(1000))

    async def main() -> tuple[list[Any], int, int]:
        waiters = [asyncio.create_task(app.wait_async(job_id, timeout=120)) for job_id in ids]
        while app._waiters.pending < len(ids):
            done = [task for task in waiters if task.done()]
            assert not done, done[0].result()
            await asyncio.sleep(0.05)
        listening = listeners(conn)
        backends = scalar(
            conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        )
        conn.execute("UPDATE queued_jobs SET run_at = now()")  # due: the worker runs them
        worker = Worker(app, WorkerConfig(poll_interval=0.05, maintenance=False, grace=10))
        working = asyncio.create_task(worker.run_async())
        got = await asyncio.gather(*waiters)
        worker.stop()
        await asyncio.wait_for(working, 60)
        await app.aclose()
        return got, listening, backends

    got, listening, backends = asyncio.run(main())
    assert got == [n + 1 for n in range(1000)]
    assert listening == 1
    # The app's async pool (10) and sync pool (10), the listener and this test's connection.
    assert backends <= 10 + 10 + 1 + 1


def test_a_thousand_sync_waiters_share_one_listen_connection(make_app, conn):
    app = _app(make_app)
    ids = app.enqueue_many(JobSpec("t.add", {"a": n, "b": 2}, run_in=3600) for n in range(1000))
    with ThreadPoolExecutor(len(ids)) as pool:
        futures = [pool.submit(app.wait, job_id, timeout=120) for job_id in ids]
        wait_until(lambda: app._waiters.pending == len(ids), timeout=60, what="1,000 waiters")
        assert listeners(conn) == 1
        assert (
            scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
            <= 10 + 1 + 1
        )
        conn.execute("UPDATE queued_jobs SET run_at = now()")

        def scenario(_: Worker) -> None:
            for future in futures:
                future.result(timeout=120)

        run_worker_while(app, scenario, concurrency=16)
        assert [future.result() for future in futures] == [n + 2 for n in range(1000)]
    app.close()
    wait_until(lambda: listeners(conn) == 0, what="the listener closed with the app")


def test_a_lost_notification_is_covered_by_the_batched_recheck(make_app, conn, monkeypatch):
    monkeypatch.setattr(results, "RECHECK", 0.2)
    app = _app(make_app)
    job_id = app.enqueue("t.add", {"a": 1, "b": 1}, run_in=3600)
    future = waiting(app, job_id)
    # No notification: the row is no longer watched when it moves.
    conn.execute("UPDATE queued_jobs SET watched = false WHERE id = %s", [job_id])
    app.cancel(job_id)
    with pytest.raises(JobCancelled):
        future.result(timeout=30)


def test_the_listener_reconnects_and_rechecks_its_waiters(make_app, conn):
    app = _app(make_app)
    job_id = app.enqueue("t.add", {"a": 1, "b": 1}, run_in=3600)
    future = waiting(app, job_id)
    pid = scalar(
        conn,
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = %s",
        [queries.RESULT_LISTEN],
    )
    conn.execute("SELECT pg_terminate_backend(%s)", [pid])
    # Ended while the listener may be down: the re-check after the reconnect finds it.
    conn.execute("UPDATE queued_jobs SET watched = false WHERE id = %s", [job_id])
    app.cancel(job_id)
    with pytest.raises(JobCancelled):
        future.result(timeout=30)
    wait_until(lambda: app._waiters.listening and listeners(conn) == 1, what="a new listener")
    assert (
        scalar(
            conn,
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = %s",
            [queries.RESULT_LISTEN],
        )
        != pid
    )
    # The new connection is woken by notifications again.
    other = app.enqueue("t.add", {"a": 1, "b": 1}, run_in=3600)
    future = waiting(app, other)
    app.cancel(other)
    with pytest.raises(JobCancelled):
        future.result(timeout=30)


def test_without_listen_the_waiters_share_one_batched_recheck(make_app, conn, monkeypatch):
    monkeypatch.delenv("PGJOBS_LISTEN_DSN", raising=False)
    monkeypatch.setattr(results, "POLL", 0.1)
    app = _app(make_app, pooler="transaction")  # as behind PgBouncer, with no listen DSN
    assert app.listen_dsn is None
    ids = [app.enqueue("t.add", {"a": n, "b": 1}, run_in=3600) for n in range(3)]
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(app.wait, job_id, timeout=30) for job_id in ids]
        wait_until(lambda: app._waiters.pending == 3, what="3 waiters")
        for job_id in ids:
            app.cancel(job_id)
        for future in futures:
            with pytest.raises(JobCancelled):
                future.result(timeout=30)
    assert listeners(conn) == 0


def test_close_ends_the_waits_of_other_threads(make_app):
    app = _app(make_app)
    job_id = app.enqueue("t.add", {"a": 1, "b": 1}, run_in=3600)
    future = waiting(app, job_id)
    threading.Thread(target=app.close).start()
    with pytest.raises(Exception, match=f"closed while waiting for job {job_id}"):
        future.result(timeout=30)
    # The app waits again after a close, as it enqueues again.
    with pytest.raises(WaitTimeout):
        app.wait(job_id, timeout=0.1)
