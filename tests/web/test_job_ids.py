"""Every route that takes a job id answers an id outside bigint (or below 1) with a 4xx in the
API's one error shape, never a 500 from PostgreSQL's "bigint out of range"; nothing changes."""

from __future__ import annotations

import pytest

from tests.support.factories import counts
from tests.web.conftest import TestClient, assert_error

IDS = ["99999999999999999999", "9223372036854775808", "0", "-1"]
OUTCOME = {"attempt": 1, "status": "succeeded"}


@pytest.mark.parametrize("job_id", IDS)
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/api/v1/jobs/{}", None),
        ("POST", "/api/v1/jobs/{}/cancel", None),
        ("POST", "/api/v1/jobs/{}/replay", None),
        ("POST", "/api/v1/jobs/{}/outcome", OUTCOME),
        ("GET", "/api/v1/dead-letters/{}", None),
    ],
)
def test_an_id_in_the_path_outside_bigint_is_refused(client, conn, job_id, method, path, body):
    response = client.request(method, path.format(job_id), json=body)
    assert_error(response, 422, "validation_error")
    assert counts(conn) == {"queued_jobs": 0, "archived_jobs": 0, "dead_letter": 0}


@pytest.mark.parametrize("job_id", [int(i) for i in IDS])
@pytest.mark.parametrize("action", ["redrive", "purge"])
def test_an_id_in_a_body_outside_bigint_is_refused(client: TestClient, job_id, action):
    response = client.post(f"/api/v1/dead-letters/{action}", json={"ids": [1, job_id]})
    assert_error(response, 422, "validation_error")
