"""Tags through the HTTP API: enqueued (one job, a batch), answered with the job, filtered on in
the job listing (``?tag=``, every tag given) and in the dead-letter routes; bad tags are refused
in the one error shape, and nothing is written."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.support.admin_factories import bury
from tests.support.helpers import count, scalar
from tests.web.conftest import TestClient, assert_error


def test_enqueue_with_tags_answers_them(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    response = client.post(
        "/api/v1/jobs",
        json={"task": "emails.send", "tags": ["customer:42", "import:7", "import:7"]},
    )
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["tags"] == ["customer:42", "import:7"]
    assert scalar(conn, "SELECT tags FROM queued_jobs WHERE id = %s", [job["id"]]) == [
        "customer:42",
        "import:7",
    ]
    assert client.get(f"/api/v1/jobs/{job['id']}").json()["tags"] == ["customer:42", "import:7"]
    untagged = client.post("/api/v1/jobs", json={"task": "emails.send"}).json()
    assert untagged["tags"] == []


def test_a_batch_enqueues_each_jobs_tags(client: TestClient) -> None:
    response = client.post(
        "/api/v1/jobs/batch",
        json={"jobs": [{"task": "a", "tags": ["x"]}, {"task": "b"}, {"task": "c", "tags": ["y"]}]},
    )
    assert response.status_code == 201, response.text
    assert [job["tags"] for job in response.json()["jobs"]] == [["x"], [], ["y"]]


@pytest.mark.parametrize(
    "tags",
    [
        "customer:42",
        [""],
        ["x" * 101],
        ["a\nb"],
        [f"t{n}" for n in range(21)],
        [42],
    ],
    ids=["bare-string", "empty", "too-long", "newline", "too-many", "number"],
)
def test_bad_tags_are_refused_and_nothing_is_written(
    client: TestClient, conn: psycopg.Connection[Any], tags: Any
) -> None:
    response = client.post("/api/v1/jobs", json={"task": "emails.send", "tags": tags})
    assert response.status_code == 422, response.text
    assert_error(response, 422, response.json()["error"]["code"])
    assert response.json()["error"]["field"].startswith("tags")
    batch = client.post(
        "/api/v1/jobs/batch", json={"jobs": [{"task": "a"}, {"task": "b", "tags": tags}]}
    )
    assert batch.status_code == 422, batch.text
    assert count(conn, "queued_jobs") == 0


def test_the_job_listing_filters_on_every_tag_given(client: TestClient) -> None:
    both = client.post("/api/v1/jobs", json={"task": "t", "tags": ["customer:42", "import:7"]})
    one = client.post("/api/v1/jobs", json={"task": "t", "tags": ["customer:42"]})
    client.post("/api/v1/jobs", json={"task": "t"})

    def ids(*tags: str) -> list[int]:
        response = client.get("/api/v1/jobs", params={"tag": list(tags)})
        assert response.status_code == 200, response.text
        return sorted(job["id"] for job in response.json()["jobs"])

    assert ids("customer:42") == sorted([both.json()["id"], one.json()["id"]])
    assert ids("customer:42", "import:7") == [both.json()["id"]]
    assert ids("import:7", "nope") == []
    listed = client.get("/api/v1/jobs", params={"tag": "import:7"}).json()["jobs"]
    assert listed[0]["tags"] == ["customer:42", "import:7"]
    refused = client.get("/api/v1/jobs", params={"tag": "x" * 101})
    assert refused.status_code in (400, 422), refused.text
    assert "100" in assert_error(refused, refused.status_code, refused.json()["error"]["code"])


def test_dead_letters_filter_and_redrive_by_tag(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    tagged = bury(conn, 3, task="fetch")
    other = bury(conn, 2, task="fetch")
    conn.execute(
        "UPDATE dead_letter SET tags = ARRAY['customer:42', 'import:7'] WHERE id = ANY(%s)",
        [tagged],
    )

    def ids(**params: Any) -> list[int]:
        response = client.get("/api/v1/dead-letters", params=params)
        assert response.status_code == 200, response.text
        return sorted(job["id"] for job in response.json()["dead_letters"])

    assert ids(tag="customer:42") == tagged
    assert ids(tag=["customer:42", "import:9"]) == []
    groups = client.get("/api/v1/dead-letters/groups", params={"tag": "import:7"}).json()
    assert sum(group["count"] for group in groups["groups"]) == 3
    assert client.get(f"/api/v1/dead-letters/{tagged[0]}").json()["tags"] == [
        "customer:42",
        "import:7",
    ]
    dry = client.post("/api/v1/dead-letters/redrive", json={"tags": ["import:7"], "dry_run": True})
    assert dry.json()["ids"] == tagged
    moved = client.post("/api/v1/dead-letters/redrive", json={"tags": ["import:7"]}).json()
    assert moved["ids"] == tagged
    assert count(conn, "dead_letter") == len(other)
    assert scalar(conn, "SELECT tags FROM queued_jobs WHERE id = %s", [tagged[0]]) == [
        "customer:42",
        "import:7",
    ]
    refused = client.post("/api/v1/dead-letters/redrive", json={"tags": "import:7"})
    assert refused.status_code == 422, refused.text
    assert count(conn, "dead_letter") == len(other)
