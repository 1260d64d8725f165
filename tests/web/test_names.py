"""The HTTP API stores names as enqueue does, in NFC (the composed and decomposed spellings of a
queue are one queue), and refuses a name or key holding a character that cannot be seen, or a
key not in NFC, with a 422 in the one error shape naming the field; nothing is written."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from tests.support.factories import counts
from tests.web.conftest import TestClient, assert_error

NOTHING = {"queued_jobs": 0, "archived_jobs": 0, "dead_letter": 0}


@pytest.mark.parametrize("bad", ["q\u200b", "\ufeffq", "q\u2028r", "q ", "q\u00a0r"])
@pytest.mark.parametrize("field", ["task", "queue", "idempotency_key"])
def test_a_name_or_key_that_cannot_be_seen_is_refused(client: TestClient, conn, bad, field):
    job = {"task": "t", field: bad}
    assert_error(client.post("/api/v1/jobs", json=job), 422, "invalid_value", field)
    batch = {"jobs": [{"task": "t"}, job]}
    response = client.post("/api/v1/jobs/batch", json=batch)
    assert_error(response, 422, "invalid_value", f"jobs[1].{field}")
    assert counts(conn) == NOTHING


@pytest.mark.parametrize("key", ["k\u200b", "cafe\u0301", "k "])
def test_a_key_in_the_path_that_cannot_be_seen_or_is_not_nfc_is_refused(
    client: TestClient, conn, key
):
    response = client.put(f"/api/v1/jobs/{quote(key)}", json={"task": "t"})
    assert_error(response, 422, "invalid_value", "idempotency_key")
    assert counts(conn) == NOTHING


def test_both_spellings_of_a_queue_are_one_queue(client: TestClient, conn):
    for queue in ("caf\u00e9", "cafe\u0301"):
        response = client.post("/api/v1/jobs", json={"task": "t", "queue": queue})
        assert response.status_code == 201, response.text
        assert response.json()["queue"] == "caf\u00e9"
    rows = conn.execute("SELECT DISTINCT queue FROM queued_jobs").fetchall()
    assert rows == [("caf\u00e9",)]
