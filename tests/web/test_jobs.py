"""The job routes against the real database: enqueue (one, many, idempotent under a key), look
up, list with cursor paging, cancel, replay; every option of ``App.enqueue`` and what each
refusal answers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgjobs import queries
from tests.support.admin_factories import bury, claim_one
from tests.support.helpers import assert_one_home, count, scalar
from tests.web.conftest import TestClient, assert_error


def test_enqueue_answers_201_with_the_job_as_stored(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    response = client.post("/api/v1/jobs", json={"task": "emails.send", "payload": {"to": 42}})
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["id"] >= 1
    assert (job["table"], job["status"], job["queue"], job["task"]) == (
        "queued_jobs",
        "ready",
        "default",
        "emails.send",
    )
    assert job["payload"] == {"to": 42}
    assert (job["attempts"], job["max_attempts"], job["priority"]) == (0, 5, 0)
    assert scalar(conn, "SELECT payload FROM queued_jobs WHERE id = %s", [job["id"]]) == {"to": 42}
    assert_one_home(conn, [job["id"]])


def test_every_enqueue_option_reaches_the_row(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    run_at = datetime(2031, 5, 4, 3, 2, 1, tzinfo=UTC)
    expires_at = datetime(2032, 1, 1, tzinfo=UTC)
    first = client.post(
        "/api/v1/jobs",
        json={
            "task": "reports.build",
            "payload": {"month": "2031-05"},
            "queue": "reports",
            "priority": -7,
            "run_at": run_at.isoformat(),
            "max_attempts": 9,
            "expires_at": expires_at.isoformat(),
            "idempotency_key": "report-2031-05",
        },
    ).json()
    row = conn.execute(
        "SELECT queue, priority, run_at, max_attempts, expires_at, idempotency_key "
        "FROM queued_jobs WHERE id = %s",
        [first["id"]],
    ).fetchone()
    assert row == ("reports", -7, run_at, 9, expires_at, "report-2031-05")
    assert first["status"] == "scheduled"

    before = scalar(conn, "SELECT now()")
    second = client.post(
        "/api/v1/jobs", json={"task": "reports.build", "delay": 3600, "expires_in": 7200}
    ).json()
    run_at2, expires_at2 = conn.execute(
        "SELECT run_at, expires_at FROM queued_jobs WHERE id = %s", [second["id"]]
    ).fetchone() or (None, None)
    assert timedelta(minutes=59) < run_at2 - before < timedelta(minutes=61)
    assert timedelta(minutes=119) < expires_at2 - before < timedelta(minutes=121)


def test_an_idempotency_key_already_taken_answers_the_existing_job(client: TestClient) -> None:
    created = client.post("/api/v1/jobs", json={"task": "t", "idempotency_key": "k-1"})
    assert created.status_code == 201
    first = created.json()
    again = client.post("/api/v1/jobs", json={"task": "t", "idempotency_key": "k-1"})
    assert again.status_code == 200
    assert again.json()["id"] == first["id"]


def test_put_under_a_key_is_201_then_200_with_the_same_job(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    first = client.put(
        "/api/v1/jobs/order-42", json={"task": "billing.charge", "payload": {"n": 1}}
    )
    assert first.status_code == 201, first.text
    assert first.json()["idempotency_key"] == "order-42"
    for _ in range(3):
        again = client.put("/api/v1/jobs/order-42", json={"task": "billing.charge"})
        assert again.status_code == 200, again.text
        assert again.json()["id"] == first.json()["id"]
    assert count(conn, "queued_jobs") == 1

    # Still the same job once it has finished and left queued_jobs.
    conn.execute(
        "WITH gone AS (DELETE FROM queued_jobs RETURNING *) "
        "INSERT INTO archived_jobs (id, queue, task, payload, priority, run_at, attempts, "
        "max_attempts, status, created_at, idempotency_key) "
        "SELECT id, queue, task, payload, priority, run_at, 1, max_attempts, 'succeeded', "
        "created_at, idempotency_key FROM gone"
    )
    later = client.put("/api/v1/jobs/order-42", json={"task": "billing.charge"})
    assert later.status_code == 200
    assert (later.json()["id"], later.json()["status"]) == (first.json()["id"], "succeeded")
    assert_one_home(conn, [first.json()["id"]])


def test_put_refuses_a_key_in_the_body(client: TestClient) -> None:
    response = client.put("/api/v1/jobs/k", json={"task": "t", "idempotency_key": "other"})
    assert_error(response, 422, "validation_error", "idempotency_key")


def test_batch_enqueues_all_in_order(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    jobs = [{"task": "resize", "payload": {"n": n}, "priority": n} for n in range(5)]
    response = client.post("/api/v1/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 201, response.text
    answered = response.json()["jobs"]
    assert [job["payload"] for job in answered] == [{"n": n} for n in range(5)]
    assert [job["priority"] for job in answered] == list(range(5))
    assert_one_home(conn, [job["id"] for job in answered])


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"priority": 40_000}, "jobs[2].priority"),
        ({"delay": -1}, "jobs[2].delay"),
        ({"run_at": "2030-01-01T00:00:00"}, "jobs[2].run_at"),
        ({"task": ""}, "jobs[2].task"),
        ({"payload": [1, 2]}, "jobs[2].payload"),
        ({"run_in": 5}, "jobs[2].run_in"),
    ],
)
def test_batch_with_one_bad_job_writes_nothing(
    client: TestClient, conn: psycopg.Connection[Any], bad: dict[str, Any], field: str
) -> None:
    jobs: list[dict[str, Any]] = [{"task": "a"}, {"task": "b"}, {"task": "c", **bad}]
    response = client.post("/api/v1/jobs/batch", json={"jobs": jobs})
    assert_error(response, 422, "validation_error", field)
    assert count(conn, "queued_jobs") == 0


def test_batch_refused_by_pgjobs_validation_names_the_position(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    # Both options are valid alone: only pgjobs' own validation refuses the pair.
    jobs = [{"task": "a"}, {"task": "b", "run_at": "2030-01-01T00:00:00Z", "delay": 5}]
    response = client.post("/api/v1/jobs/batch", json={"jobs": jobs})
    message = assert_error(response, 422, "invalid_value", "jobs[1].delay")
    assert "job #1" in message
    assert count(conn, "queued_jobs") == 0


def test_get_finds_a_job_wherever_it_is(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    queued = client.post("/api/v1/jobs", json={"task": "t", "payload": {"k": "v"}}).json()
    assert client.get(f"/api/v1/jobs/{queued['id']}").json() == queued

    (dead_id,) = bury(conn, 1, error=lambda n: "boom")
    dead = client.get(f"/api/v1/jobs/{dead_id}").json()
    assert (dead["table"], dead["status"], dead["reason"]) == ("dead_letter", "dead", "exhausted")
    assert dead["traceback"].startswith("Traceback")
    assert dead["last_error"] == "boom"

    assert_error(client.get("/api/v1/jobs/999999"), 404, "job_not_found")


def test_running_job_shows_its_lease_and_start(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    job_id = client.post("/api/v1/jobs", json={"task": "t"}).json()["id"]
    claim_one(conn, job_id, owner="worker-7")
    job = client.get(f"/api/v1/jobs/{job_id}").json()
    assert (job["status"], job["lease_owner"], job["attempts"]) == ("running", "worker-7", 1)
    assert job["lease_expires_at"] is not None
    assert job["started_at"] is not None


def test_cancel_and_its_conflicts(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    job_id = client.post("/api/v1/jobs", json={"task": "t"}).json()["id"]
    cancelled = client.post(f"/api/v1/jobs/{job_id}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert (cancelled.json()["status"], cancelled.json()["table"]) == ("cancelled", "archived_jobs")
    assert_error(client.post(f"/api/v1/jobs/{job_id}/cancel"), 409, "job_state_conflict")
    assert_error(client.post("/api/v1/jobs/424242/cancel"), 404, "job_not_found")

    running = client.post("/api/v1/jobs", json={"task": "t"}).json()["id"]
    claim_one(conn, running)
    message = assert_error(client.post(f"/api/v1/jobs/{running}/cancel"), 409, "job_state_conflict")
    assert "force" in message
    forced = client.post(f"/api/v1/jobs/{running}/cancel", json={"force": True})
    assert forced.json()["status"] == "cancelled"

    again = client.post("/api/v1/jobs", json={"task": "t"}).json()["id"]
    claim_one(conn, again)
    assert client.post(f"/api/v1/jobs/{again}/cancel?force=true").json()["status"] == "cancelled"
    assert_one_home(conn, [job_id, running, again])


def test_replay_enqueues_a_new_job_linked_to_the_old(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    (dead_id,) = bury(conn, 1)
    replayed = client.post(f"/api/v1/jobs/{dead_id}/replay")
    assert replayed.status_code == 201, replayed.text
    new = replayed.json()
    assert (new["replay_of"], new["status"], new["task"]) == (dead_id, "ready", "images.resize")
    assert client.get(f"/api/v1/jobs/{dead_id}").json()["replays"] == [new["id"]]
    assert_error(client.post(f"/api/v1/jobs/{new['id']}/replay"), 409, "job_state_conflict")
    assert_error(client.post("/api/v1/jobs/987654/replay"), 404, "job_not_found")
    assert_one_home(conn, [dead_id, new["id"]])


def test_replay_of_an_expired_job_is_expired_unless_the_body_gives_a_new_expiry(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    original = client.post("/api/v1/jobs", json={"task": "t", "expires_at": past}).json()["id"]
    assert conn.execute(queries.JOB_EXPIRE_MANY, {"limit": 10}).fetchone() == (1,)

    expired = client.post(f"/api/v1/jobs/{original}/replay")
    assert expired.status_code == 201, expired.text
    copy = expired.json()
    assert (copy["status"], copy["table"], copy["replay_of"]) == (
        "expired",
        "archived_jobs",
        original,
    )
    later = client.post(f"/api/v1/jobs/{original}/replay", json={"expires_in": 600}).json()
    assert (later["status"], later["table"]) == ("ready", "queued_jobs")
    assert later["expires_at"] is not None

    before = count(conn, "queued_jobs")
    both = client.post(
        f"/api/v1/jobs/{original}/replay", json={"expires_in": 5, "expires_at": past}
    )
    assert_error(both, 422, "invalid_value", "expires_in")
    for body, field in (({"expires_in": -1}, "expires_in"), ({"expire_in": 5}, "expire_in")):
        answer = client.post(f"/api/v1/jobs/{original}/replay", json=body)
        assert_error(answer, 422, "validation_error", field)
    assert count(conn, "queued_jobs") == before
    assert_one_home(conn, [original, copy["id"], later["id"]])


def _page_through(client: TestClient, limit: int, **params: Any) -> list[int]:
    seen: list[int] = []
    cursor = None
    for _ in range(1000):
        query = {**params, "limit": limit, **({"cursor": cursor} if cursor else {})}
        response = client.get("/api/v1/jobs", params=query)
        assert response.status_code == 200, response.text
        page = response.json()
        assert len(page["jobs"]) <= limit
        seen += [job["id"] for job in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return seen
    raise AssertionError("paging did not end")


def test_cursor_paging_visits_every_job_once_across_the_tables(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    # Jobs that share a created_at (one batch), dead ones that share a failed_at, archived ones.
    batch = client.post(
        "/api/v1/jobs/batch", json={"jobs": [{"task": "a", "queue": "q1"} for _ in range(23)]}
    ).json()["jobs"]
    dead = bury(conn, 17, queue="q1")
    cancelled = []
    for _ in range(6):
        job_id = client.post("/api/v1/jobs", json={"task": "b", "queue": "q2"}).json()["id"]
        client.post(f"/api/v1/jobs/{job_id}/cancel")
        cancelled.append(job_id)
    everything = {job["id"] for job in batch} | set(dead) | set(cancelled)
    assert_one_home(conn, everything)

    for limit in (1, 4, 7, 50):
        seen = _page_through(client, limit)
        assert sorted(seen) == sorted(everything), limit  # each once: no duplicate, none missing

    assert sorted(_page_through(client, 5, state="dead")) == dead
    assert sorted(_page_through(client, 5, state=["cancelled", "succeeded"])) == cancelled
    assert sorted(_page_through(client, 5, queue="q1", state="ready")) == sorted(
        job["id"] for job in batch
    )
    assert _page_through(client, 5, task="nothing-like-it") == []


def test_listing_is_newest_first_within_a_time_window(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    old = client.post("/api/v1/jobs", json={"task": "t"}).json()["id"]
    conn.execute(
        "UPDATE queued_jobs SET created_at = now() - interval '2 days' WHERE id = %s", [old]
    )
    new = client.post("/api/v1/jobs", json={"task": "t"}).json()["id"]
    assert _page_through(client, 10) == [new, old]
    since = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    assert _page_through(client, 10, since=since) == [new]
    assert _page_through(client, 10, until=since) == [old]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"state": "sleeping"}, "state[0]"),
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"since": "2030-01-02T00:00:00Z", "until": "2030-01-01T00:00:00Z"}, "since"),
        ({"since": "2030-01-02T00:00:00"}, "since"),
        ({"queue": "a\x01b"}, "queue"),
    ],
)
def test_listing_refuses_bad_filters(
    client: TestClient, params: dict[str, Any], field: str
) -> None:
    response = client.get("/api/v1/jobs", params=params)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
