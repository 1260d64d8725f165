"""Outcomes reported from outside a worker (external tasks): each settles the attempt that holds
the job's live lease, as the worker's own outcome would, and nothing else; started_at records
when each attempt began, wherever the job goes."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgjobs import App, admin
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError, JobNotFound, StaleOutcome
from pgjobs.models import DeadReason, JobStatus
from pgjobs.retry import RetryPolicy
from tests.support.admin_factories import claim_one
from tests.support.factories import claim, row
from tests.support.helpers import assert_one_home, scalar


def running(app: App, conn: psycopg.Connection[Any], **options: Any) -> int:
    """A job of task "ext" claimed by worker w1 to deliver it (attempt 1)."""
    job_id = app.enqueue("ext", {"n": 1}, **options)
    claim_one(conn, job_id, external_tasks=["ext"])
    return job_id


def test_a_success_archives_the_job_with_its_result_and_run_time(make_app, conn, dsn):
    app = make_app(check_task_names=False)
    job_id = running(app, conn)
    found = admin.report_outcome(dsn, job_id, attempt=1, status="succeeded", result={"ok": 1})
    assert (found.status, found.table, found.result) == (
        JobStatus.SUCCEEDED,
        "archived_jobs",
        {"ok": 1},
    )
    assert found.worker == "w1"
    assert found.started_at is not None and found.finished_at is not None
    assert found.finished_at >= found.started_at
    assert_one_home(conn, [job_id])


def test_a_retryable_failure_is_retried_then_exhausted_on_the_last_attempt(make_app, conn, dsn):
    app = make_app(check_task_names=False)
    job_id = running(app, conn, max_attempts=2)
    quick = RetryPolicy(base=0.001, cap=0.001)
    found = admin.report_outcome(
        dsn, job_id, attempt=1, status="failed", error="503 from the bank", retry=quick
    )
    assert found.status in (JobStatus.SCHEDULED, JobStatus.READY)
    assert found.last_error == "503 from the bank" and found.attempts == 1
    conn.execute("UPDATE queued_jobs SET run_at = now() WHERE id = %s", [job_id])
    (job,) = claim(conn, owner="w2", limit=1, external_tasks=["ext"])
    assert job.attempts == 2
    with pytest.raises(StaleOutcome, match="on attempt 2, not 1"):
        admin.report_outcome(dsn, job_id, attempt=1, status="succeeded")
    found = admin.report_outcome(dsn, job_id, attempt=2, status="failed", error="again")
    assert (found.status, found.reason) == (JobStatus.DEAD, DeadReason.EXHAUSTED)
    assert found.worker == "w2" and found.last_error == "again"


def test_a_failure_that_is_not_retryable_goes_to_dead_letter_at_once(make_app, conn, dsn):
    app = make_app(check_task_names=False)
    job_id = running(app, conn, max_attempts=5)
    found = admin.report_outcome(
        dsn, job_id, attempt=1, status="failed", retryable=False, error="card\nstolen"
    )
    assert (found.status, found.reason, found.last_error) == (
        JobStatus.DEAD,
        DeadReason.NON_RETRYABLE,
        "card stolen",
    )
    assert found.started_at is not None


def test_stale_reports_change_nothing(make_app, conn, dsn):
    app = make_app(check_task_names=False)
    queued = app.enqueue("ext", {}, queue="elsewhere")
    with pytest.raises(StaleOutcome, match=r"is ready: the outcome reported for attempt 1"):
        admin.report_outcome(dsn, queued, attempt=1, status="succeeded")
    job_id = running(app, conn)
    conn.execute(
        "UPDATE queued_jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
        [job_id],
    )
    before = row(conn, "queued_jobs", job_id)
    with pytest.raises(StaleOutcome, match="lease ended"):
        admin.report_outcome(dsn, job_id, attempt=1, status="succeeded")
    assert row(conn, "queued_jobs", job_id) == before
    done = running(app, conn)
    admin.report_outcome(dsn, done, attempt=1, status="succeeded")
    with pytest.raises(StaleOutcome, match=r"is succeeded \(in archived_jobs\)"):
        admin.report_outcome(dsn, done, attempt=1, status="failed")
    assert scalar(conn, "SELECT status FROM archived_jobs WHERE id = %s", [done]) == "succeeded"
    with pytest.raises(JobNotFound):
        admin.report_outcome(dsn, 10**12, attempt=1, status="succeeded")


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"attempt": 0, "status": "succeeded"}, "attempt"),
        ({"attempt": True, "status": "succeeded"}, "attempt"),
        ({"attempt": 1, "status": "done"}, "status"),
        ({"attempt": 1, "status": "failed", "retryable": "yes"}, "retryable"),
        ({"attempt": 1, "status": "failed", "error": 42}, "error"),
    ],
)
def test_a_bad_report_names_its_field_and_changes_nothing(make_app, conn, dsn, options, field):
    app = make_app(check_task_names=False)
    job_id = running(app, conn)
    before = row(conn, "queued_jobs", job_id)
    with pytest.raises(ConfigurationError) as caught:
        admin.report_outcome(dsn, job_id, **options)
    assert caught.value.field == field
    assert row(conn, "queued_jobs", job_id) == before


def test_the_app_applies_its_tasks_retry_policy(make_app, conn):
    app: App = make_app()

    app.external_task("ext", retry_base=3600, retry_cap=3600)

    job_id = running(app, conn)
    found = app.report_outcome(job_id, attempt=1, status="failed", error="later")
    assert found.status is JobStatus.SCHEDULED and found.started_at is not None
    delay = (found.run_at - found.started_at).total_seconds()
    assert 1800 <= delay <= 3601


def test_a_report_on_the_callers_connection_commits_with_its_transaction(make_app, conn, dsn: Dsn):
    app = make_app(check_task_names=False)
    job_id = running(app, conn)
    with psycopg.connect(dsn.url) as own:
        own.execute("SELECT 1")  # the caller's transaction is open
        found = admin.report_outcome(own, job_id, attempt=1, status="succeeded")
        assert found.status is JobStatus.SUCCEEDED
        own.rollback()
    assert row(conn, "queued_jobs", job_id) is not None
    assert_one_home(conn, [job_id])


def test_started_at_follows_the_job_to_dead_letter_and_back(make_app, conn, dsn):
    app = make_app(check_task_names=False)
    job_id = running(app, conn, max_attempts=1)
    started = scalar(conn, "SELECT started_at FROM queued_jobs WHERE id = %s", [job_id])
    assert started is not None
    admin.report_outcome(dsn, job_id, attempt=1, status="failed", error="x")
    assert scalar(conn, "SELECT started_at FROM dead_letter WHERE id = %s", [job_id]) == started
    assert admin.redrive(dsn, admin.DeadFilter(ids=(job_id,))) == 1
    assert admin.job(dsn, job_id).started_at is None, "a redriven job has not started again"
