"""A burst worker with nothing to claim says once what it still waits for (jobs scheduled for
later, jobs of a paused queue) and exits when its queues are empty, archiving expired jobs first
instead of leaving them behind."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from pgjobs import App, queues
from pgjobs.db.dsn import Dsn
from tests.support.factories import work
from tests.support.helpers import assert_one_home, count


@pytest.fixture(autouse=True)
def no_queue_settings(dsn: Dsn) -> Iterator[None]:
    def clear() -> None:
        with psycopg.connect(dsn.url, autocommit=True) as conn:
            conn.execute("TRUNCATE pgjobs_queues")

    clear()
    yield
    clear()


def burst_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("burst:")]


def test_waits_for_a_scheduled_job_says_so_once_then_runs_it_and_exits(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    ran: list[int] = []

    @app.task(name="t")
    def t(n: int) -> None:
        ran.append(n)

    ids = [app.enqueue("t", {"n": 1}), app.enqueue("t", {"n": 2}, run_in=2)]
    with caplog.at_level(logging.INFO, logger="pgjobs.worker"):
        assert work(app) == 0
    assert ran == [1, 2]
    lines = burst_lines(caplog)
    waiting = [line for line in lines if line.startswith("burst: waiting for")]
    assert len(waiting) == 1, lines  # said once, not at every poll
    assert "1 scheduled job(s), the next due at " in waiting[0] and " UTC" in waiting[0]
    assert lines[-1] == "burst: no job left in default"
    assert set(assert_one_home(conn, ids).values()) == {"archived_jobs"}


def test_says_which_jobs_wait_for_their_dependencies_apart_from_scheduled_ones(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    ran: list[int] = []

    @app.task(name="t")
    def t(n: int) -> None:
        ran.append(n)

    first = app.enqueue("t", {"n": 1}, run_in=2)
    ids = [first, app.enqueue("t", {"n": 2}, after=[first])]
    with caplog.at_level(logging.INFO, logger="pgjobs.worker"):
        assert work(app) == 0
    assert ran == [1, 2]
    waiting = [line for line in burst_lines(caplog) if line.startswith("burst: waiting for")]
    assert "1 scheduled job(s), the next due at " in waiting[0], waiting
    assert "1 job(s) waiting for their dependencies" in waiting[0], waiting
    assert set(assert_one_home(conn, ids).values()) == {"archived_jobs"}


def test_archives_expired_jobs_before_it_exits(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()

    @app.task(name="t")
    def t() -> None:
        raise AssertionError("an expired job must not run")

    # Due after it expires: it can never run; the burst worker must not leave it queued.
    job = app.enqueue("t", {}, run_in=3, expires_in=1)
    with caplog.at_level(logging.INFO, logger="pgjobs.worker"):
        assert work(app) == 0
    assert assert_one_home(conn, [job]) == {job: "archived_jobs"}
    assert conn.execute("SELECT status FROM archived_jobs").fetchone() == ("expired",)
    assert "burst: archived 1 expired job(s), unrun" in burst_lines(caplog)


def test_waits_for_a_paused_queue_and_finishes_after_the_resume(
    make_app: Callable[..., App],
    conn: psycopg.Connection[Any],
    dsn: Dsn,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_app()

    @app.task(name="t")
    def t() -> None: ...

    job = app.enqueue("t", {})
    queues.pause(dsn, "default")
    resumer = threading.Timer(2.0, queues.resume, args=(dsn, "default"))
    resumer.start()
    try:
        with caplog.at_level(logging.INFO, logger="pgjobs.worker"):
            assert work(app) == 0
    finally:
        resumer.cancel()
    waiting = [line for line in burst_lines(caplog) if line.startswith("burst: waiting for")]
    assert waiting == [
        "burst: waiting for 1 job(s) of paused queues (`pgjobs queue resume`) in default"
    ]
    assert count(conn, "archived_jobs") == 1
    assert assert_one_home(conn, [job]) == {job: "archived_jobs"}
