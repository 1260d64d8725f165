"""POST /api/v1/jobs/{id}/outcome: an external worker settles the attempt it was given; the
attempt number fences the report."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg

from pgjobs import App
from pgjobs.text import MAX_ERROR_LENGTH
from pgjobs.worker import Worker
from tests.support.admin_factories import claim_one
from tests.support.factories import row
from tests.support.helpers import assert_one_home, wait_until
from tests.support.stopping import block_until, run_worker
from tests.web.conftest import AUTH, TestClient, assert_error


def _running(client: TestClient, conn: psycopg.Connection[Any], **options: Any) -> int:
    job_id = int(client.post("/api/v1/jobs", json={"task": "ext", **options}).json()["id"])
    claim_one(
        conn,
        job_id,
        owner="external-worker",
        queue=options.get("queue", "default"),
        external_tasks=["ext"],
    )
    return job_id


def test_success_archives_the_job_with_its_result(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    job_id = _running(client, conn)
    report = {"attempt": 1, "status": "succeeded", "result": {"rows": 12}}
    response = client.post(f"/api/v1/jobs/{job_id}/outcome", json=report)
    assert response.status_code == 200, response.text
    job = response.json()
    assert (job["status"], job["table"], job["result"]) == (
        "succeeded",
        "archived_jobs",
        {"rows": 12},
    )
    # A second report of the same attempt changes nothing.
    again = client.post(f"/api/v1/jobs/{job_id}/outcome", json=report)
    assert_error(again, 409, "stale_outcome")
    assert_one_home(conn, [job_id])


def test_failures_retry_or_bury(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    retried = _running(client, conn)
    failed = {"attempt": 1, "status": "failed", "error": "downstream said 500"}
    job = client.post(f"/api/v1/jobs/{retried}/outcome", json=failed).json()
    assert (job["table"], job["status"], job["last_error"]) == (
        "queued_jobs",
        "scheduled",
        "downstream said 500",
    )

    buried = _running(client, conn, queue="other")
    report = {"attempt": 1, "status": "failed", "retryable": False, "error": "bad input"}
    job = client.post(f"/api/v1/jobs/{buried}/outcome", json=report).json()
    assert (job["status"], job["reason"]) == ("dead", "non_retryable")
    assert_one_home(conn, [retried, buried])


def test_stale_unknown_and_invalid_reports(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    job_id = _running(client, conn)
    wrong_attempt = client.post(
        f"/api/v1/jobs/{job_id}/outcome", json={"attempt": 2, "status": "succeeded"}
    )
    assert_error(wrong_attempt, 409, "stale_outcome")
    conn.execute(
        "UPDATE queued_jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
        [job_id],
    )
    expired = client.post(
        f"/api/v1/jobs/{job_id}/outcome", json={"attempt": 1, "status": "succeeded"}
    )
    assert_error(expired, 409, "stale_outcome")
    assert client.get(f"/api/v1/jobs/{job_id}").json()["table"] == "queued_jobs"

    assert_error(
        client.post("/api/v1/jobs/9999999/outcome", json={"attempt": 1, "status": "succeeded"}),
        404,
        "job_not_found",
    )
    for body, field in (
        ({"attempt": 1, "status": "done"}, "status"),
        ({"attempt": 0, "status": "failed"}, "attempt"),
        ({"attempt": "1", "status": "failed"}, "attempt"),
        ({"status": "failed"}, "attempt"),
        ({"attempt": 1, "status": "failed", "retryable": "no"}, "retryable"),
        ({"attempt": 1, "status": "failed", "error": 42}, "error"),
    ):
        assert_error(
            client.post(f"/api/v1/jobs/{job_id}/outcome", json=body), 422, "validation_error", field
        )


def test_results_and_errors_are_stored_as_pgjobs_stores_a_handlers(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    """What JSON or PostgreSQL cannot hold is made storable, as for a handler's return value and
    exception: the report is recorded, never a 500."""
    reports = [
        ('{"attempt": 1, "status": "succeeded", "result": {"x": NaN}}', "{'x': nan}"),
        ('{"attempt": 1, "status": "succeeded", "result": "nul \\u0000"}', "nul \ufffd"),
        ('{"attempt": 1, "status": "failed", "retryable": false, "error": "a\\u0000b"}', None),
        ('{"attempt": 1, "status": "succeeded", "result": "half \\ud800"}', "half \ufffd"),
        ('{"attempt": 1, "status": "failed", "retryable": false, "error": "half \\ud800"}', None),
        (
            '{"attempt": 1, "status": "failed", "retryable": false, "error": "'
            + "x" * 10**5
            + '"}',
            None,
        ),
    ]
    ids = []
    for raw, stored in reports:
        job_id = _running(client, conn)
        ids.append(job_id)
        response = client.post(
            f"/api/v1/jobs/{job_id}/outcome",
            content=raw,
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 200, (raw, response.text)
        job = response.json()
        if stored is not None:
            assert job["result"] == stored
        else:
            assert job["status"] == "dead" and "\x00" not in job["last_error"]
            assert len(job["last_error"]) <= MAX_ERROR_LENGTH
    assert_one_home(conn, ids)


def test_the_apps_retry_policy_applies(make_web: Any, conn: psycopg.Connection[Any]) -> None:
    app = App()

    app.external_task("ext", retry_base=1000, retry_cap=1000)

    with TestClient(make_web(app=app), headers=AUTH) as client:
        job_id = _running(client, conn)
        report = {"attempt": 1, "status": "failed", "error": "try later"}
        assert client.post(f"/api/v1/jobs/{job_id}/outcome", json=report).status_code == 200
    waits = conn.execute(
        "SELECT extract(epoch FROM run_at - now()) FROM queued_jobs WHERE id = %s", [job_id]
    ).fetchone()
    assert waits is not None and waits[0] > 400  # equal jitter: at least half of 1000 s


def test_a_python_handlers_running_job_cannot_be_reported(
    make_app: Callable[..., App], make_web: Any, conn: psycopg.Connection[Any]
) -> None:
    """A real worker runs a Python handler that waits; reports of its attempt, forged with the
    right attempt number, to a server with the app and to one without, settle nothing, and the
    handler's own outcome is recorded when it ends."""
    app = make_app()
    started, release = threading.Event(), threading.Event()

    @app.task(name="py", lease=60)
    def py() -> dict[str, str]:
        started.set()
        block_until(release, 60)
        return {"by": "handler"}

    job_id = app.enqueue("py", {})
    forged = {"attempt": 1, "status": "succeeded", "result": {"by": "forger"}}

    def scenario(worker: Worker) -> None:
        wait_until(started.is_set, timeout=30, what="the handler to start")
        before = row(conn, "queued_jobs", job_id)
        assert before is not None and before["lease_owner"] == worker.id
        for web in (make_web(), make_web(app=app)):
            with TestClient(web, headers=AUTH) as client:
                answer = client.post(f"/api/v1/jobs/{job_id}/outcome", json=forged)
            assert_error(answer, 409, "not_external")
            assert row(conn, "queued_jobs", job_id) == before
        release.set()
        wait_until(
            lambda: row(conn, "archived_jobs", job_id) is not None,
            timeout=30,
            what="the handler's outcome",
        )

    run_worker(app, scenario)
    done = row(conn, "archived_jobs", job_id)
    assert done is not None
    assert (done["status"], done["result"]) == ("succeeded", {"by": "handler"})
    assert_one_home(conn, [job_id])


def test_a_task_the_serving_app_runs_in_python_cannot_be_reported(
    make_web: Any, conn: psycopg.Connection[Any]
) -> None:
    """Even an attempt claimed for delivery (by a worker whose app declares the task external)
    is refused by a server whose app declares the task as a Python one."""
    app = App()

    @app.task(name="ext")
    def ext() -> None: ...

    with TestClient(make_web(app=app), headers=AUTH) as client:
        job_id = _running(client, conn)
        report = {"attempt": 1, "status": "succeeded"}
        answer = client.post(f"/api/v1/jobs/{job_id}/outcome", json=report)
        assert "not an external task" in assert_error(answer, 409, "not_external")
        assert client.get(f"/api/v1/jobs/{job_id}").json()["status"] == "running"
