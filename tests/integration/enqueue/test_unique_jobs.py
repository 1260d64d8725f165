"""Unique keys: keep, replace, debounce and throttle, one job by one and in batches, on pgjobs'
connections and in the caller's transaction, and under concurrent enqueues."""

from __future__ import annotations

import itertools
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy

from pgjobs import ConfigurationError, JobSpec
from pgjobs.enqueue import COPY_MIN_ROWS
from tests.support.factories import claim, db_now, row, work
from tests.support.helpers import scalar


def keyed(conn: psycopg.Connection[Any], task: str = "t.sync", key: str = "k") -> list[int]:
    """Ids of the not-started jobs of ``task`` holding ``key``."""
    return [
        r[0]
        for r in conn.execute(
            "SELECT id FROM queued_jobs WHERE task = %s AND unique_key = %s AND started_at IS NULL",
            [task, key],
        )
    ]


def test_keep_returns_the_holder_and_changes_nothing(make_app, conn):
    app = make_app(check_task_names=False)
    first = app.enqueue("t.sync", {"n": 1}, unique_key="k", priority=1)
    again = app.enqueue("t.sync", {"n": 2}, unique_key="k", on_conflict="keep", priority=9)
    assert again == first
    job = row(conn, "queued_jobs", first)
    assert job is not None
    assert (job["payload"], job["priority"], job["unique_key"]) == ({"n": 1}, 1, "k")
    assert keyed(conn) == [first]
    # Another task, or another key, is another job.
    assert app.enqueue("t.other", {"n": 3}, unique_key="k") != first
    assert app.enqueue("t.sync", {"n": 4}, unique_key="k2") != first
    assert scalar(conn, "SELECT count(*) FROM queued_jobs") == 3


def test_replace_gives_the_holder_the_new_payload_priority_and_run_time(make_app, conn):
    app = make_app(check_task_names=False)
    first = app.enqueue("t.sync", {"n": 1}, unique_key="k", run_in=3600, expires_in=600)
    expiry = row(conn, "queued_jobs", first)["expires_at"]  # type: ignore[index]
    before = db_now(conn)
    again = app.enqueue(
        "t.sync", {"n": 2}, unique_key="k", on_conflict="replace", priority=5, max_attempts=2
    )
    assert again == first
    job = row(conn, "queued_jobs", first)
    assert job is not None
    assert (job["payload"], job["priority"], job["max_attempts"]) == ({"n": 2}, 5, 2)
    assert before - timedelta(seconds=1) <= job["run_at"] <= db_now(conn)  # ready now
    assert job["expires_at"] == expiry  # not given: kept
    assert keyed(conn) == [first]


def test_debounce_moves_the_run_time_after_the_latest_enqueue(make_app, conn):
    app = make_app()

    app.task(name="t.debounced", debounce=30)(lambda **_: None)

    first = app.enqueue("t.debounced", {"n": 1}, unique_key="k", on_conflict="debounce")
    start = row(conn, "queued_jobs", first)["run_at"]  # type: ignore[index]
    assert start >= db_now(conn) + timedelta(seconds=25)  # the first enqueue waits too
    time.sleep(0.05)
    again = app.enqueue("t.debounced", {"n": 2}, unique_key="k", on_conflict="debounce")
    assert again == first
    job = row(conn, "queued_jobs", first)
    assert job is not None and job["payload"] == {"n": 2}
    assert job["run_at"] > start
    # The call's debounce wins over the task's.
    app.enqueue("t.debounced", {"n": 3}, unique_key="k", on_conflict="debounce", debounce=600)
    later = row(conn, "queued_jobs", first)["run_at"]  # type: ignore[index]
    assert later >= db_now(conn) + timedelta(seconds=590)
    assert keyed(conn, "t.debounced") == [first]


def test_a_running_job_does_not_hold_the_key(make_app, conn):
    app = make_app(check_task_names=False)
    first = app.enqueue("t.sync", {"n": 1}, unique_key="k")
    assert [job.id for job in claim(conn)] == [first]
    second = app.enqueue("t.sync", {"n": 2}, unique_key="k", on_conflict="replace")
    assert second != first
    assert row(conn, "queued_jobs", first)["payload"] == {"n": 1}  # type: ignore[index]
    assert keyed(conn) == [second]


def test_throttle_starts_the_next_job_a_window_after_the_previous_start(make_app, conn):
    app = make_app()

    app.task(name="t.throttled", throttle=60)(lambda **_: None)

    first = app.enqueue("t.throttled", {"n": 1}, unique_key="k")
    assert row(conn, "queued_jobs", first)["run_at"] <= db_now(conn)  # type: ignore[index]
    assert app.enqueue("t.throttled", {"n": 2}, unique_key="k") == first  # not started: kept
    # Started late (a backlog): the window counts from the start, not from run_at.
    conn.execute(
        "UPDATE queued_jobs SET run_at = run_at - interval '1 hour' WHERE id = %s", [first]
    )
    assert [job.id for job in claim(conn)] == [first]
    started = row(conn, "queued_jobs", first)["started_at"]  # type: ignore[index]
    second = app.enqueue("t.throttled", {"n": 3}, unique_key="k")
    assert second != first
    assert row(conn, "queued_jobs", second)["run_at"] == started + timedelta(seconds=60)  # type: ignore[index]
    assert app.enqueue("t.throttled", {"n": 4}, unique_key="k", on_conflict="replace") == second
    replaced = row(conn, "queued_jobs", second)
    assert replaced is not None and replaced["payload"] == {"n": 4}
    assert replaced["run_at"] == started + timedelta(seconds=60)  # replace keeps the window
    # Other keys are not throttled by this one; a job without a key is never throttled.
    other = app.enqueue("t.throttled", {"n": 5}, unique_key="k2")
    assert row(conn, "queued_jobs", other)["run_at"] <= db_now(conn)  # type: ignore[index]
    plain = app.enqueue("t.throttled", {"n": 6})
    assert row(conn, "queued_jobs", plain)["run_at"] <= db_now(conn)  # type: ignore[index]


def test_throttle_reads_the_start_of_a_finished_job(make_app, conn):
    app = make_app()

    app.task(name="t.throttled", throttle=120)(lambda **_: None)

    first = app.enqueue("t.throttled", {"n": 1}, unique_key="k")
    work(app)
    archived = row(conn, "archived_jobs", first)
    assert archived is not None and archived["started_at"] is not None
    second = app.enqueue("t.throttled", {"n": 2}, unique_key="k")
    assert row(conn, "queued_jobs", second)["run_at"] == archived["started_at"] + timedelta(  # type: ignore[index]
        seconds=120
    )


def test_a_batch_merges_jobs_of_one_key_and_returns_each_its_job(make_app, conn):
    app = make_app(check_task_names=False)
    held = app.enqueue("t.sync", {"n": 0}, unique_key="held")
    ids = app.enqueue_many(
        [
            JobSpec("t.sync", {"n": 1}, unique_key="a"),
            JobSpec("t.sync", {"n": 2}, unique_key="a", on_conflict="replace"),
            JobSpec("t.sync", {"n": 3}, unique_key="a"),  # keep after the replace: no change
            JobSpec("t.sync", {"n": 4}),
            JobSpec("t.sync", {"n": 5}, unique_key="held"),
            JobSpec("t.sync", {"n": 6}, unique_key="b", on_conflict="replace"),
        ]
    )
    assert ids[0] == ids[1] == ids[2]
    assert ids[4] == held
    assert len(set(ids)) == 4
    assert row(conn, "queued_jobs", ids[0])["payload"] == {"n": 2}  # type: ignore[index]
    assert row(conn, "queued_jobs", held)["payload"] == {"n": 0}  # type: ignore[index]
    assert row(conn, "queued_jobs", ids[3])["unique_key"] is None  # type: ignore[index]
    assert scalar(conn, "SELECT count(*) FROM queued_jobs") == 4


def test_a_large_batch_with_unique_keys_takes_the_insert_path(make_app, conn):
    app = make_app(check_task_names=False)
    specs = [JobSpec("t.sync", {"n": n}, unique_key=f"k{n % 10}") for n in range(COPY_MIN_ROWS)]
    ids = app.enqueue_many(specs)
    assert len(set(ids)) == 10
    assert scalar(conn, "SELECT count(*) FROM queued_jobs WHERE unique_key IS NOT NULL") == 10


def test_idempotency_key_and_unique_key_together(make_app, conn):
    app = make_app(check_task_names=False)
    first = app.enqueue("t.sync", {"n": 1}, unique_key="k", idempotency_key="i1")
    # The idempotency key wins first: the same job, whatever the mode.
    assert app.enqueue("t.sync", {"n": 2}, idempotency_key="i1") == first
    assert (
        app.enqueue("t.sync", {"n": 3}, unique_key="k", idempotency_key="i1", on_conflict="replace")
        == first
    )
    assert row(conn, "queued_jobs", first)["payload"] == {"n": 1}  # type: ignore[index]
    # A new idempotency key with a held unique key: the holder.
    assert app.enqueue("t.sync", {"n": 4}, unique_key="k", idempotency_key="i2") == first
    assert scalar(conn, "SELECT count(*) FROM queued_jobs") == 1
    # In one batch, a repeated idempotency key gets the first row's job, whatever its key.
    ids = app.enqueue_many(
        [
            JobSpec("t.sync", {"n": 5}, unique_key="a", idempotency_key="i3"),
            JobSpec(
                "t.sync", {"n": 6}, unique_key="b", idempotency_key="i3", on_conflict="replace"
            ),
        ]
    )
    assert ids[0] == ids[1] != first
    assert scalar(conn, "SELECT count(*) FROM queued_jobs") == 2


def test_in_the_callers_transaction(make_app, dsn, conn):
    app = make_app(check_task_names=False)
    with psycopg.connect(dsn.url) as tx:
        first = app.enqueue("t.sync", {"n": 1}, unique_key="k", connection=tx)
        again = app.enqueue(
            "t.sync", {"n": 2}, unique_key="k", on_conflict="replace", connection=tx
        )
        assert again == first
        assert keyed(conn) == []  # not committed yet
        tx.commit()
    assert keyed(conn) == [first]
    assert row(conn, "queued_jobs", first)["payload"] == {"n": 2}  # type: ignore[index]
    engine = sqlalchemy.create_engine(dsn.sqlalchemy_url, poolclass=sqlalchemy.NullPool)
    try:
        with engine.begin() as sa_conn:
            assert app.enqueue("t.sync", {"n": 3}, unique_key="k", connection=sa_conn) == first
            other = app.enqueue("t.sync", {"n": 4}, unique_key="k2", connection=sa_conn)
        with engine.connect() as sa_conn:
            sa_conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            with pytest.raises(ConfigurationError, match="unique keys need a READ COMMITTED"):
                app.enqueue("t.sync", {"n": 5}, unique_key="k3", connection=sa_conn)
    finally:
        engine.dispose()
    assert keyed(conn, key="k2") == [other]
    assert keyed(conn, key="k3") == []


def test_a_rolled_back_holder_leaves_the_key_free(make_app, dsn, conn):
    app = make_app(check_task_names=False)
    with psycopg.connect(dsn.url) as tx:
        app.enqueue("t.sync", {"n": 1}, unique_key="k", connection=tx)
        tx.rollback()
    job = app.enqueue("t.sync", {"n": 2}, unique_key="k")
    assert keyed(conn) == [job]


THREADS = 8
CALLS = 200


def hammer(make_app, mode: str, task: str) -> list[list[int]]:
    """``THREADS`` threads, each with its own app (its own connections), enqueue ``CALLS`` jobs
    of ``task`` with one unique key; the ids each got, in order. Any exception fails the test."""
    apps = [make_app(check_task_names=False) for _ in range(THREADS)]
    results: list[list[int]] = [[] for _ in range(THREADS)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(THREADS)

    def run(index: int) -> None:
        try:
            barrier.wait()
            for n in range(CALLS):
                results[index].append(
                    apps[index].enqueue(
                        task, {"thread": index, "n": n}, unique_key="k", on_conflict=mode
                    )
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    return results


@pytest.mark.parametrize("mode", ["keep", "replace", "debounce"])
def test_concurrent_enqueues_of_one_key_make_one_job(make_app, conn, mode):
    results = hammer(make_app, mode, "t.sync")
    ids = {job_id for got in results for job_id in got}
    assert len(ids) == 1, "two not-started jobs held one key"
    (job_id,) = ids
    assert keyed(conn) == [job_id]
    assert scalar(conn, "SELECT count(*) FROM queued_jobs") == 1
    payload = row(conn, "queued_jobs", job_id)["payload"]  # type: ignore[index]
    if mode == "keep":
        assert payload["n"] == 0  # the first enqueue of one of the threads
    else:
        assert payload["n"] == CALLS - 1  # the last committed enqueue is some thread's last


def test_concurrent_enqueues_of_a_throttled_key_start_one_job_per_window(make_app, dsn, conn):
    """Enqueuers hammer one throttled key while a starter marks its job started as soon as it
    is due (as a claim does): no two starts fall within one window."""
    window = 0.25
    apps = [make_app() for _ in range(THREADS)]
    for app in apps:
        app.task(name="t.throttled", throttle=window)(lambda **_: None)
    stop = threading.Event()
    starts: list[Any] = []
    errors: list[BaseException] = []

    def starter() -> None:
        with psycopg.connect(dsn.url, autocommit=True) as own:
            while not stop.is_set():
                for (started,) in own.execute(
                    # As a claim takes a job: a due one, locked SKIP LOCKED.
                    "UPDATE queued_jobs SET started_at = clock_timestamp() WHERE id IN ("
                    " SELECT id FROM queued_jobs WHERE task = 't.throttled'"
                    " AND started_at IS NULL AND run_at <= now() FOR UPDATE SKIP LOCKED)"
                    " RETURNING started_at"
                ):
                    starts.append(started)
                time.sleep(0.005)

    def enqueuer(index: int) -> None:
        try:
            for n in range(CALLS):
                apps[index].enqueue("t.throttled", {"thread": index, "n": n}, unique_key="k")
                time.sleep(0.002)
        except BaseException as exc:
            errors.append(exc)

    start_thread = threading.Thread(target=starter)
    start_thread.start()
    threads = [threading.Thread(target=enqueuer, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    start_thread.join()
    assert errors == []
    assert len(starts) >= 2, "the test started too few jobs to compare windows"
    starts.sort()
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= window, gaps
    assert len(keyed(conn, "t.throttled")) <= 1


@pytest.mark.parametrize("mode", ["keep", "replace", "debounce"])
def test_concurrent_enqueues_while_jobs_of_the_key_start(make_app, dsn, conn, mode):
    """A starter takes the key's job as soon as it is due, as a claim does, while the threads
    enqueue: a started job no longer holds the key, so new ones are made, never two waiting at
    once, and no enqueue fails (a replace meeting a job being started makes a new job)."""
    stop = threading.Event()
    started: list[int] = []

    def starter() -> None:
        with psycopg.connect(dsn.url, autocommit=True) as own:
            while not stop.is_set():
                for (job_id,) in own.execute(
                    "UPDATE queued_jobs SET started_at = clock_timestamp() WHERE id IN ("
                    " SELECT id FROM queued_jobs WHERE started_at IS NULL AND run_at <= now()"
                    " FOR UPDATE SKIP LOCKED) RETURNING id"
                ):
                    started.append(job_id)
                time.sleep(0.002)

    start_thread = threading.Thread(target=starter)
    start_thread.start()
    try:
        results = hammer(make_app, mode, "t.sync")
    finally:
        stop.set()
        start_thread.join()
    ids = {job_id for got in results for job_id in got}
    assert len(started) >= 2, "the starter took too few jobs for the test to mean anything"
    assert len(keyed(conn)) <= 1
    assert ids <= {r[0] for r in conn.execute("SELECT id FROM queued_jobs")}
    assert scalar(conn, "SELECT count(*) FROM queued_jobs") == len(ids)


def test_a_throttled_key_in_the_callers_transaction(make_app, dsn, conn):
    app = make_app()
    app.task(name="t.throttled", throttle=60)(lambda **_: None)
    with psycopg.connect(dsn.url) as tx:
        first = app.enqueue("t.throttled", {"n": 1}, unique_key="k", connection=tx)
        assert app.enqueue("t.throttled", {"n": 2}, unique_key="k", connection=tx) == first
        tx.commit()
    assert keyed(conn, "t.throttled") == [first]
    assert [job.id for job in claim(conn)] == [first]
    started = row(conn, "queued_jobs", first)["started_at"]  # type: ignore[index]
    with psycopg.connect(dsn.url) as tx:
        second = app.enqueue("t.throttled", {"n": 3}, unique_key="k", connection=tx)
        tx.commit()
    assert row(conn, "queued_jobs", second)["run_at"] == started + timedelta(seconds=60)  # type: ignore[index]
    assert scalar(conn, "SELECT job_id FROM pgjobs_throttles WHERE unique_key = 'k'") == second
