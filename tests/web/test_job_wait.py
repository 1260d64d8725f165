"""``GET /api/v1/jobs/{id}?wait=N``: a long poll answered when the job ends, or after N seconds
with the job as it is then (200 both ways); and the job's snoozes and progress in its JSON."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from fastapi import FastAPI

from pgjobs import admin
from tests.support.admin_factories import claim_one, fail_for_good, succeed
from tests.support.helpers import wait_until
from tests.web.conftest import TestClient, assert_error


def _enqueue(client: TestClient, **options: Any) -> int:
    response = client.post("/api/v1/jobs", json={"task": "t.job", "payload": {}, **options})
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def test_wait_answers_when_the_job_ends(
    web: FastAPI, client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    job_id = _enqueue(client, delay=3600)
    waiters = web.state.pgjobs.waiting_app()._waiters
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(client.get, f"/api/v1/jobs/{job_id}?wait=30")
        wait_until(lambda: waiters.pending == 1 or answer.done(), what="the request to wait")
        assert not answer.done()
        admin.cancel(conn, job_id)
        response = answer.result(timeout=30)
    assert response.status_code == 200, response.text
    assert (response.json()["status"], response.json()["table"]) == ("cancelled", "archived_jobs")


def test_wait_runs_out_with_the_job_as_it_is(client: TestClient) -> None:
    job_id = _enqueue(client, delay=3600)
    response = client.get(f"/api/v1/jobs/{job_id}", params={"wait": 0.2})
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "scheduled"


def test_wait_on_a_job_that_ended_answers_at_once_whatever_its_end(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    ok = _enqueue(client)
    succeed(conn, claim_one(conn, ok))
    dead = _enqueue(client)
    fail_for_good(conn, claim_one(conn, dead), "ValueError: no")
    body = client.get(f"/api/v1/jobs/{ok}?wait=60").json()
    assert (body["status"], body["result"]) == ("succeeded", "ok")
    body = client.get(f"/api/v1/jobs/{dead}?wait=60").json()
    assert (body["status"], body["last_error"]) == ("dead", "ValueError: no")


def test_a_wait_out_of_bounds_or_an_unknown_job_is_refused(client: TestClient) -> None:
    job_id = _enqueue(client)
    for bad in ("61", "-1", "soon", "nan"):
        response = client.get(f"/api/v1/jobs/{job_id}", params={"wait": bad})
        assert_error(response, 422, "validation_error", "wait")
    assert_error(client.get("/api/v1/jobs/424242?wait=1"), 404, "job_not_found")


def test_the_job_json_has_its_snoozes_and_progress(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    job_id = _enqueue(client)
    body = client.get(f"/api/v1/jobs/{job_id}").json()
    assert (body["snoozes"], body["progress"]) == (0, None)
    progress = '{"done": 4, "total": 8, "message": "half", "at": "2031-01-01T00:00:00+00:00"}'
    conn.execute(
        "UPDATE queued_jobs SET snoozes = 2, progress = %s WHERE id = %s", [progress, job_id]
    )
    body = client.get(f"/api/v1/jobs/{job_id}").json()
    assert body["snoozes"] == 2
    assert body["progress"] == {
        "done": 4,
        "total": 8,
        "message": "half",
        "at": "2031-01-01T00:00:00+00:00",
    }
    listed = client.get("/api/v1/jobs").json()["jobs"]
    assert (listed[0]["snoozes"], listed[0]["progress"]["done"]) == (2, 4)
