"""What an enqueue writes: each option lands in its column, on every insert path (one job, one
statement for a batch, COPY for a large batch), whether or not the jobs are ready now."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg.rows import dict_row

from pgjobs import App, JobSpec
from pgjobs.enqueue import COPY_MIN_ROWS
from pgjobs.submission import DEFAULT_MAX_ATTEMPTS

LATER = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)


def rows_by_id(conn, ids: list[int]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cursor:
        cursor.execute(
            "SELECT *, run_at - created_at AS delay, now() AS checked_at FROM queued_jobs"
            " WHERE id = ANY(%s)",
            [ids],
        )
        found = {row["id"]: row for row in cursor.fetchall()}
    return [found[job_id] for job_id in ids]


def make(make_app) -> App:
    app: App = make_app()

    @app.task(name="mail.send", queue="mail", max_attempts=7)
    def send() -> None: ...

    @app.task(name="plain")
    def plain() -> None: ...

    return app


def test_a_single_ready_job_takes_its_tasks_options_and_runs_now(make_app, conn):
    app = make(make_app)
    job = rows_by_id(conn, [app.enqueue("mail.send", {"to": "a@example.com"})])[0]
    assert (job["queue"], job["task"], job["payload"]) == (
        "mail",
        "mail.send",
        {"to": "a@example.com"},
    )
    assert (job["priority"], job["max_attempts"], job["attempts"]) == (0, 7, 0)
    assert job["run_at"] == job["created_at"] and job["expires_at"] is None
    plain = rows_by_id(conn, [app.enqueue("plain")])[0]
    assert (plain["queue"], plain["max_attempts"], plain["payload"]) == (
        "default",
        DEFAULT_MAX_ATTEMPTS,
        {},
    )


def test_a_single_job_with_every_option_set(make_app, conn):
    app = make(make_app)
    delayed = app.enqueue(
        "mail.send", {}, queue="urgent", priority=-3, run_in=90, max_attempts=2, expires_in=3600
    )
    at = app.enqueue("plain", {}, run_at=LATER, expires_at=LATER + timedelta(days=1))
    first, second = rows_by_id(conn, [delayed, at])
    assert (first["queue"], first["priority"], first["max_attempts"]) == ("urgent", -3, 2)
    assert first["delay"] == timedelta(seconds=90)
    assert timedelta(minutes=59) < first["expires_at"] - first["checked_at"] <= timedelta(hours=1)
    assert (second["run_at"], second["expires_at"]) == (LATER, LATER + timedelta(days=1))


@pytest.mark.parametrize("size", [4, COPY_MIN_ROWS + 4], ids=["insert", "copy"])
@pytest.mark.parametrize("mixed", [False, True], ids=["all-ready", "mixed"])
def test_a_batch_writes_each_jobs_own_options(make_app, conn, size, mixed):
    app = make(make_app)
    specs = [JobSpec("mail.send" if n % 2 else "plain", {"n": n}, priority=n) for n in range(size)]
    if mixed:
        specs[1] = JobSpec("plain", {"n": 1}, queue="late", run_at=LATER, max_attempts=3)
        specs[2] = JobSpec("plain", {"n": 2}, run_in=timedelta(minutes=5))
        specs[3] = JobSpec("mail.send", {"n": 3}, expires_at=LATER)
    ids = app.enqueue_many(specs)
    assert ids == sorted(ids) and len(set(ids)) == size
    jobs = rows_by_id(conn, ids)
    assert [job["payload"] for job in jobs] == [{"n": n} for n in range(size)]
    for n, job in enumerate(jobs[4:], start=4):
        expected = ("mail", 7) if n % 2 else ("default", DEFAULT_MAX_ATTEMPTS)
        assert (job["queue"], job["max_attempts"], job["priority"]) == (*expected, n)
        assert job["run_at"] == job["created_at"] and job["expires_at"] is None
    assert len({job["created_at"] for job in jobs}) == 1, "one transaction, one created_at"
    if mixed:
        assert (jobs[1]["queue"], jobs[1]["run_at"], jobs[1]["max_attempts"]) == ("late", LATER, 3)
        assert jobs[2]["delay"] == timedelta(minutes=5)
        assert (jobs[3]["queue"], jobs[3]["expires_at"], jobs[3]["delay"]) == (
            "mail",
            LATER,
            timedelta(0),
        )
