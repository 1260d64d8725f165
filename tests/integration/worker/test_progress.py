"""A handler's progress: ``current_job().progress(done, total, message)`` from sync and async
handlers, written on the job's row at most once a second (the last value always, at the latest
with the outcome), and kept in archived_jobs or dead_letter."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import pgjobs
from pgjobs import App, NonRetryableError
from pgjobs.errors import ConfigurationError
from tests.support.external import run_worker_while
from tests.support.helpers import scalar, wait_until
from tests.support.stopping import block_until, run_worker, sleep_until_over

#: Counts the writes that change a queued job's progress (one row per write).
COUNTER = """
CREATE TABLE test_progress_writes (id bigint);
CREATE FUNCTION test_progress_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_progress_writes VALUES (NEW.id);
    RETURN NEW;
END $$;
CREATE TRIGGER test_progress_written BEFORE UPDATE ON queued_jobs FOR EACH ROW
WHEN (NEW.progress IS DISTINCT FROM OLD.progress) EXECUTE FUNCTION test_progress_written();
"""

DROP_COUNTER = """
DROP TRIGGER IF EXISTS test_progress_written ON queued_jobs;
DROP FUNCTION IF EXISTS test_progress_written();
DROP TABLE IF EXISTS test_progress_writes;
"""


@pytest.fixture
def writes(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Count progress writes in ``test_progress_writes`` for the test's length."""
    conn.execute(DROP_COUNTER)
    conn.execute(COUNTER)
    try:
        yield
    finally:
        conn.execute(DROP_COUNTER)


def progress_of(conn: psycopg.Connection[Any], table: str, job_id: int) -> Any:
    return scalar(conn, f"SELECT progress FROM {table} WHERE id = %s", [job_id])


def test_a_sync_handlers_progress_is_throttled_and_its_last_value_archived(make_app, conn, writes):
    app: App = make_app()
    reported, release = threading.Event(), threading.Event()
    spent: list[float] = []

    @app.task(name="t.steps")
    def steps(n: int) -> str:
        began = time.monotonic()
        for i in range(n):
            pgjobs.current_job().progress(i + 1, n, f"step {i + 1}")
        spent.append(time.monotonic() - began)
        reported.set()
        block_until(release, 30)
        return "done"

    job_id = app.enqueue("t.steps", {"n": 2000})

    def scenario(_: Any) -> None:
        assert reported.wait(30)
        # Written within a second of the last call, while the handler still runs.
        wait_until(
            lambda: (progress_of(conn, "queued_jobs", job_id) or {}).get("done") == 2000,
            what="the last progress on the running job's row",
        )
        release.set()
        assert app.wait(job_id, timeout=30) == "done"

    run_worker(app, scenario)  # clears OVER first, which block_until also stops on
    progress = progress_of(conn, "archived_jobs", job_id)
    assert {k: progress[k] for k in ("done", "total", "message")} == {
        "done": 2000,
        "total": 2000,
        "message": "step 2000",
    }
    assert progress["at"].endswith("+00:00")
    written = scalar(conn, "SELECT count(*) FROM test_progress_writes WHERE id = %s", [job_id])
    # 2,000 calls: the first at once, then at most one a second.
    assert 1 <= written <= 2 + int(spent[0])


def test_an_async_handlers_progress_stays_with_its_dead_letter(make_app, conn, writes):
    app: App = make_app()

    @app.task(name="t.fails", max_attempts=1)
    async def fails() -> None:
        context = pgjobs.current_job()
        context.progress(1, 10)
        while (progress_of(conn, "queued_jobs", job_id) or {}).get("done") != 1:
            await asyncio.sleep(0.02)  # written at once
        context.progress(3, 10, "third")  # within the second: written with the outcome
        raise NonRetryableError("gave up")

    job_id = app.enqueue("t.fails")

    def scenario(_: Any) -> None:
        with pytest.raises(pgjobs.JobFailed):
            app.wait(job_id, timeout=30)

    run_worker_while(app, scenario)
    progress = progress_of(conn, "dead_letter", job_id)
    assert (progress["done"], progress["total"], progress["message"]) == (3, 10, "third")


def test_a_job_without_progress_has_none(make_app, conn):
    app: App = make_app()

    @app.task(name="t.quiet")
    def quiet() -> int:
        return 1

    job_id = app.enqueue("t.quiet")
    run_worker_while(app, lambda _: app.wait(job_id, timeout=30))
    assert progress_of(conn, "archived_jobs", job_id) is None


class _Sly(str):
    """Text whose len() and `in` lie about what it holds."""

    def __contains__(self, _: object) -> bool:
        return False

    def __len__(self) -> int:
        return 0


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((-1,), "done must be a number >= 0"),
        ((float("nan"),), "done must be a number >= 0"),
        ((True,), "done must be a number >= 0"),
        (("3",), "done must be a number >= 0"),
        ((1, 0), "total must be None or a number > 0"),
        ((1, float("inf")), "total must be None or a number > 0"),
        ((1, None, 5), "message must be a string"),
        ((1, None, "x" * 1001), "at most 1,000 characters"),
        ((1, None, "a\x00b"), "without NUL"),
        ((1, None, "half \ud800 a pair"), "lone surrogate"),
        ((1, None, _Sly("a\x00b")), "without NUL"),
        ((1, None, _Sly("x" * 1001)), "at most 1,000 characters"),
        ((10**400,), "done must be a number >= 0"),
    ],
)
def test_bad_progress_is_a_one_line_error_in_the_handler(make_app, conn, args, words):
    app: App = make_app()
    raised: list[BaseException] = []

    @app.task(name="t.bad")
    def bad() -> None:
        try:
            pgjobs.current_job().progress(*args)
        except ConfigurationError as exc:
            raised.append(exc)

    job_id = app.enqueue("t.bad")
    run_worker_while(app, lambda _: app.wait(job_id, timeout=30))
    (exc,) = raised
    assert words in str(exc) and "\n" not in str(exc)
    assert progress_of(conn, "archived_jobs", job_id) is None, "nothing written"


def test_progress_outside_a_worker_is_kept_in_memory_only() -> None:
    from pgjobs.context import JobContext, progress_json

    assert '"done": 1.5' in progress_json(1.5, None, "half")

    def nothing(*_: Any) -> None:
        return None

    context = JobContext(None, nothing)  # type: ignore[arg-type]
    context.progress(1)
    assert context.progress_pending


def test_a_timed_out_job_keeps_its_last_progress(make_app, conn):
    app: App = make_app()

    @app.task(name="t.slow", max_attempts=1, timeout=0.8)
    async def slow() -> None:
        context = pgjobs.current_job()
        context.progress(1, 3)
        while (progress_of(conn, "queued_jobs", job_id) or {}).get("done") != 1:
            await asyncio.sleep(0.02)  # written at once
        context.progress(2, 3, "stuck")  # within the second: written with the timeout
        await sleep_until_over(30)

    job_id = app.enqueue("t.slow")

    def scenario(_: Any) -> None:
        with pytest.raises(pgjobs.JobFailed, match=r"\(timeout\)"):
            app.wait(job_id, timeout=30)

    run_worker(app, scenario)
    progress = progress_of(conn, "dead_letter", job_id)
    assert (progress["done"], progress["message"]) == (2, "stuck")
