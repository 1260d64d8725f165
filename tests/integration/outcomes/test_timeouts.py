"""Per-job timeouts (``@app.task(timeout=...)``) against the real database: an async handler is
cancelled at its timeout, a sync one is given up (its thread abandoned, ``current_job().cancelled``
set), and the attempt fails with reason timeout: retried, then dead-lettered with ``timeout``.
Timeouts are a second and the waits generous: nothing here measures speed."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import pgjobs
from pgjobs import App, migrate
from pgjobs.errors import ConfigurationError
from pgjobs.models import DeadReason
from pgjobs.worker import Worker
from tests.support.helpers import assert_one_home, count, scalar, wait_until
from tests.support.stopping import OVER, block_until, run_worker, sleep_until_over

TIMEOUT_ERROR = "timeout: the handler ran longer than its 1s timeout"


def dead_row(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any] | None:
    found = conn.execute(
        "SELECT reason, last_error, error_type, attempts, failed_at - started_at AS ran "
        "FROM dead_letter WHERE id = %s",
        [job_id],
    ).fetchone()
    if found is None:
        return None
    return dict(zip(("reason", "last_error", "error_type", "attempts", "ran"), found, strict=True))


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_an_async_handler_past_its_timeout_is_cancelled_retried_then_dead_lettered(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    cancelled: list[int] = []

    @app.task(name="slow", timeout=1, lease=30, max_attempts=2, retry_base=0.05, retry_cap=0.1)
    async def slow() -> None:
        try:
            await sleep_until_over(60)
        except asyncio.CancelledError:
            cancelled.append(pgjobs.current_job().job.attempts)
            assert pgjobs.current_job().cancelled
            raise

    job_id = app.enqueue("slow", {})

    def scenario(worker: Worker) -> None:
        wait_until(lambda: dead_row(conn, job_id), timeout=30, what="the job in dead_letter")

    with caplog.at_level(logging.INFO, logger="pgjobs"):
        run_worker(app, scenario)

    dead = dead_row(conn, job_id)
    assert dead is not None
    assert (dead["reason"], dead["last_error"], dead["attempts"]) == (
        DeadReason.TIMEOUT,
        TIMEOUT_ERROR,
        2,
    )
    assert dead["error_type"] == "pgjobs.timeout"
    assert cancelled == [1, 2]  # each attempt's handler saw its cancellation
    messages = [r.getMessage() for r in caplog.records]
    assert any("timed out on attempt 1/2" in m and "retry in" in m for m in messages), messages
    assert any("timed out on attempt 2/2" in m and "dead_letter" in m for m in messages), messages
    assert errors_logged(caplog) == []
    assert assert_one_home(conn, [job_id]) == {job_id: "dead_letter"}


def test_the_first_timed_out_attempt_is_retried_with_the_reason_in_last_error(
    make_app: Callable[..., App], conn: psycopg.Connection[Any]
) -> None:
    app = make_app()

    @app.task(name="slow", timeout=1, lease=30, max_attempts=3, retry_base=3600, retry_cap=3600)
    async def slow() -> None:
        await sleep_until_over(60)

    job_id = app.enqueue("slow", {})

    def retried() -> Any:
        return conn.execute(
            "SELECT attempts, last_error, lease_owner FROM queued_jobs "
            "WHERE id = %s AND run_at > now()",
            [job_id],
        ).fetchone()

    def scenario(worker: Worker) -> None:
        wait_until(retried, timeout=30, what="the job retried after its timeout")

    run_worker(app, scenario)
    attempts, last_error, owner = retried()
    assert (attempts, last_error, owner) == (1, TIMEOUT_ERROR, None)
    assert count(conn, "dead_letter") == 0


def test_an_async_handler_that_swallows_its_cancellation_is_still_timed_out(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    returned = threading.Event()

    @app.task(name="stubborn", timeout=1, lease=30, max_attempts=1)
    async def stubborn() -> str:
        try:
            await sleep_until_over(60)
        except asyncio.CancelledError:
            await asyncio.sleep(1)  # ignores it and finishes as if nothing happened
        returned.set()
        return "late"

    job_id = app.enqueue("stubborn", {})

    def scenario(worker: Worker) -> None:
        wait_until(lambda: dead_row(conn, job_id), timeout=30, what="the job in dead_letter")
        wait_until(returned.is_set, timeout=30, what="the handler to return")
        wait_until(lambda: not worker.slots.busy, timeout=30, what="its slot to be given back")

    with caplog.at_level(logging.INFO, logger="pgjobs"):
        run_worker(app, scenario)
    dead = dead_row(conn, job_id)
    assert dead is not None and (dead["reason"], dead["last_error"]) == ("timeout", TIMEOUT_ERROR)
    # The late return changed nothing: no second home, no success recorded, nothing sent for it.
    assert assert_one_home(conn, [job_id]) == {job_id: "dead_letter"}
    assert errors_logged(caplog) == []
    assert not any("not applied" in r.getMessage() for r in caplog.records)


def test_a_sync_handler_past_its_timeout_fails_at_the_deadline_and_its_return_changes_nothing(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    release = threading.Event()
    seen: dict[str, Any] = {}

    @app.task(name="stuck", timeout=1, lease=60, max_attempts=1)
    def stuck() -> str:
        block_until(release, 60)  # deaf to everything until the test lets it go
        seen["cancelled"] = pgjobs.current_job().cancelled
        return "too late"

    @app.task(name="quick")
    def quick() -> str:
        return "done"

    stuck_id = app.enqueue("stuck", {})

    def scenario(worker: Worker) -> None:
        wait_until(lambda: dead_row(conn, stuck_id), timeout=30, what="the stuck job dead")
        # Its only slot was given back at the deadline: another job runs while the thread of
        # the stuck one still waits.
        quick_id = app.enqueue("quick", {})
        wait_until(
            lambda: scalar(conn, "SELECT count(*) FROM archived_jobs WHERE id = %s", [quick_id]),
            timeout=30,
            what="the quick job to run in the freed slot",
        )
        assert not release.is_set()
        seen["quick"] = quick_id
        release.set()
        wait_until(lambda: "cancelled" in seen, timeout=30, what="the stuck handler to return")
        wait_until(lambda: worker.slots.stray_threads() == 0, timeout=30, what="its thread to end")

    with caplog.at_level(logging.INFO, logger="pgjobs"):
        run_worker(app, scenario, concurrency=1)

    assert seen["cancelled"] is True  # the handler could have known
    dead = dead_row(conn, stuck_id)
    assert dead is not None and (dead["reason"], dead["last_error"]) == ("timeout", TIMEOUT_ERROR)
    assert assert_one_home(conn, [stuck_id, seen["quick"]]) == {
        stuck_id: "dead_letter",
        seen["quick"]: "archived_jobs",
    }
    assert errors_logged(caplog) == []
    assert not any("lease was lost" in r.getMessage() for r in caplog.records)


def test_a_cooperative_sync_handler_sees_cancelled_and_stops(
    make_app: Callable[..., App], conn: psycopg.Connection[Any]
) -> None:
    app = make_app()
    stopped: list[float] = []

    @app.task(name="polite", timeout=1, lease=60, max_attempts=1)
    def polite() -> None:
        began = time.monotonic()
        while time.monotonic() - began < 60 and not OVER.is_set():
            if pgjobs.current_job().cancelled:
                stopped.append(time.monotonic() - began)
                return
            time.sleep(0.02)

    job_id = app.enqueue("polite", {})

    def scenario(worker: Worker) -> None:
        wait_until(lambda: stopped, timeout=30, what="the handler to notice its timeout")
        wait_until(lambda: dead_row(conn, job_id), timeout=30, what="the job in dead_letter")
        wait_until(lambda: worker.slots.stray_threads() == 0, timeout=30, what="its thread to end")

    run_worker(app, scenario)
    assert 0 < stopped[0] < 30  # it stopped because of the flag, not at the end of its loop
    dead = dead_row(conn, job_id)
    assert dead is not None and dead["reason"] == "timeout"


def test_an_at_most_once_task_past_its_timeout_goes_to_dead_letter_at_once(
    make_app: Callable[..., App], conn: psycopg.Connection[Any]
) -> None:
    app = make_app()

    @app.task(name="once", timeout=1, lease=30, max_attempts=5, at_most_once=True)
    async def once() -> None:
        await sleep_until_over(60)

    job_id = app.enqueue("once", {})

    def scenario(worker: Worker) -> None:
        wait_until(lambda: dead_row(conn, job_id), timeout=30, what="the job in dead_letter")

    run_worker(app, scenario)
    dead = dead_row(conn, job_id)
    assert dead is not None and (dead["reason"], dead["attempts"]) == ("timeout", 1)


def test_a_handler_within_its_timeout_succeeds(
    make_app: Callable[..., App], conn: psycopg.Connection[Any]
) -> None:
    app = make_app()

    @app.task(name="fast", timeout=5, lease=30)
    def fast() -> str:
        return "ok"

    job_id = app.enqueue("fast", {})

    def scenario(worker: Worker) -> None:
        wait_until(
            lambda: scalar(conn, "SELECT count(*) FROM archived_jobs WHERE id = %s", [job_id]),
            timeout=30,
            what="the job archived",
        )
        # Its timer went with it: nothing fires later for a job that finished.
        wait_until(lambda: not worker.slots.timers, timeout=10, what="no timer left")

    run_worker(app, scenario)
    assert assert_one_home(conn, [job_id]) == {job_id: "archived_jobs"}


@pytest.mark.parametrize(
    ("timeout", "words"),
    [
        (0, "> 0"),
        (-1, "> 0"),
        (float("nan"), "> 0"),
        (True, "number of seconds"),
        ("30", "number of seconds"),
        (300, "shorter than the lease (300s)"),
        (400, "shorter than the lease (300s)"),
    ],
)
def test_a_bad_timeout_is_refused_naming_the_field(
    make_app: Callable[..., App], timeout: Any, words: str
) -> None:
    app = make_app()
    with pytest.raises(ConfigurationError, match="timeout") as caught:

        @app.task(name="t", timeout=timeout)
        def t() -> None: ...

    assert caught.value.field == "timeout"
    assert words in str(caught.value)
    assert "t" not in app.tasks


def test_migration_0008_widens_and_narrows_the_reason_check(create_database) -> None:
    fresh = create_database()
    migrate.upgrade(fresh, "0007")
    insert = (
        "INSERT INTO dead_letter (id, queue, task, payload, priority, run_at, attempts, "
        "max_attempts, reason, last_error, created_at) VALUES "
        "(1, 'q', 't', '{}', 0, now(), 1, 1, 'timeout', 'timeout: ...', now())"
    )
    with psycopg.connect(fresh.url, autocommit=True) as c:
        with pytest.raises(psycopg.errors.CheckViolation):
            c.execute(insert)
        migrate.upgrade(fresh)
        c.execute(insert)
        definition = scalar(
            c,
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conname = 'ck_dead_letter_reason' AND convalidated",
        )
        for reason in DeadReason:  # the check names every reason the enum knows
            assert f"'{reason}'" in definition
        leftover = "SELECT count(*) FROM pg_constraint WHERE conname LIKE '%%incoming'"
        assert scalar(c, leftover) == 0
        migrate.downgrade(fresh, "0007")
        assert scalar(c, "SELECT reason FROM dead_letter WHERE id = 1") == "exhausted"
        with pytest.raises(psycopg.errors.CheckViolation):
            c.execute(insert.replace("(1,", "(2,"))
        migrate.upgrade(fresh)
        assert migrate.current(fresh) == migrate.head()


def test_the_worker_metrics_count_timed_out_attempts_as_retried_then_dead(
    make_app: Callable[..., App], conn: psycopg.Connection[Any]
) -> None:
    app = make_app()

    @app.task(name="slow", timeout=1, lease=30, max_attempts=2, retry_base=0.05, retry_cap=0.1)
    async def slow() -> None:
        await sleep_until_over(60)

    job_id = app.enqueue("slow", {})
    text: list[str] = []

    def scenario(worker: Worker) -> None:
        wait_until(lambda: dead_row(conn, job_id), timeout=30, what="the job in dead_letter")
        assert worker.metrics is not None
        text.append(worker.metrics.render(busy=0, connected=True))

    run_worker(app, scenario, http=("127.0.0.1", 0))
    finished = [line for line in text[0].splitlines() if "jobs_finished_total{" in line]
    assert any('task="slow",outcome="retried"} 1' in line for line in finished), finished
    assert any('task="slow",outcome="dead"} 1' in line for line in finished), finished
    assert not any('outcome="released"} 1' in line for line in finished), finished
