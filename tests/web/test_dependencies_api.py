"""Dependencies in the HTTP API: ``after`` on POST /api/v1/jobs (ids) and /jobs/batch (ids, or
``{"ref": n}`` for a job listed before it in the batch); the job JSON lists ``after``,
``dependents`` and ``waiting_on``; a waiting job's status is ``waiting``; bad ids are 4xx in the
one error shape and write nothing."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.support.helpers import count
from tests.web.conftest import TestClient, assert_error


def test_after_makes_the_job_wait_and_its_json_says_for_what(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    first = client.post("/api/v1/jobs", json={"task": "t"}).json()["id"]
    response = client.post("/api/v1/jobs", json={"task": "t", "after": [first]})
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["status"] == "waiting" and job["run_at"] == "infinity"
    assert job["after"] == [
        {"id": first, "status": "ready", "name": None, "result": None, "result_omitted": False}
    ]
    assert job["dependents"] == [] and job["waiting_on"] == 1
    shown = client.get(f"/api/v1/jobs/{first}").json()
    assert shown["dependents"] == [{"id": job["id"], "status": "waiting", "name": None}]
    assert shown["waiting_on"] is None
    listed = client.get("/api/v1/jobs", params={"state": "waiting"}).json()["jobs"]
    assert [j["id"] for j in listed] == [job["id"]]


def test_a_batch_is_a_graph_with_refs(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    response = client.post(
        "/api/v1/jobs/batch",
        json={
            "jobs": [
                {"task": "t"},
                {"task": "t"},
                {"task": "t", "after": [{"ref": 0}, {"ref": 1}]},
            ]
        },
    )
    assert response.status_code == 201, response.text
    jobs = response.json()["jobs"]
    assert [j["status"] for j in jobs] == ["ready", "ready", "waiting"]
    edges = set(conn.execute("SELECT job_id, depends_on FROM pgjobs_dependencies").fetchall())
    assert edges == {(jobs[2]["id"], jobs[0]["id"]), (jobs[2]["id"], jobs[1]["id"])}


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({"task": "t", "after": [0]}, 422, "validation_error", None),
        ({"task": "t", "after": ["x"]}, 422, "validation_error", None),
        ({"task": "t", "after": list(range(1, 1002))}, 422, "validation_error", "after"),
        ({"task": "t", "after": [987654]}, 422, "unknown_dependency", "after"),
        ({"task": "t", "after": [{"ref": 0}]}, 422, "invalid_value", "after"),
    ],
)
def test_bad_after_is_refused_in_the_one_shape_and_writes_nothing(
    client: TestClient,
    conn: psycopg.Connection[Any],
    body: dict[str, Any],
    status: int,
    code: str,
    field: str | None,
) -> None:
    response = client.post("/api/v1/jobs", json=body)
    message = assert_error(response, status, code, field)
    assert "\n" not in message
    assert count(conn, "queued_jobs") == 0


def test_a_batch_ref_to_a_later_job_is_refused(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    response = client.post(
        "/api/v1/jobs/batch",
        json={"jobs": [{"task": "t", "after": [{"ref": 1}]}, {"task": "t"}]},
    )
    message = assert_error(response, response.status_code, response.json()["error"]["code"])
    assert 400 <= response.status_code < 500 and "listed after it" in message
    assert count(conn, "queued_jobs") == 0
