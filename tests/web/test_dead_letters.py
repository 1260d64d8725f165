"""The dead-letter routes: list and group with the CLI's filters, show one, redrive and purge by
ids, fingerprint or filter, with dry runs and the purge's confirmation."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from pgjobs import admin
from tests.support.admin_factories import bury, claim_one, fail_for_good
from tests.support.helpers import assert_one_home, count
from tests.web.conftest import TestClient, assert_error


def _two_outages(conn: psycopg.Connection[Any]) -> tuple[list[int], list[int]]:
    timeouts = bury(conn, 4, task="fetch", queue="net", error=lambda n: f"timeout after {n}s")
    corrupt = bury(conn, 3, task="resize", error=lambda n: f"image {n} is corrupt")
    return timeouts, corrupt


def test_list_with_the_cli_filters(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    timeouts, corrupt = _two_outages(conn)
    listed = client.get("/api/v1/dead-letters").json()["dead_letters"]
    assert sorted(job["id"] for job in listed) == sorted(timeouts + corrupt)
    assert all(job["traceback"] is None for job in listed)

    def ids(**params: Any) -> list[int]:
        response = client.get("/api/v1/dead-letters", params=params)
        assert response.status_code == 200, response.text
        return sorted(job["id"] for job in response.json()["dead_letters"])

    assert ids(queue="net") == timeouts
    assert ids(task="resize") == corrupt
    assert ids(error="TIMEOUT") == timeouts
    assert len(ids(limit=2)) == 2
    fingerprint = listed[0]["fingerprint_id"]
    assert ids(fingerprint=fingerprint) in (timeouts, corrupt)
    assert ids(until="2000-01-01T00:00:00Z") == []
    with_tracebacks = client.get("/api/v1/dead-letters", params={"tracebacks": True}).json()
    assert all(job["traceback"] for job in with_tracebacks["dead_letters"])


def test_a_dead_job_that_ran_shows_when_its_last_attempt_started(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    job_id = client.post("/api/v1/jobs", json={"task": "t"}).json()["id"]
    fail_for_good(conn, claim_one(conn, job_id), "ValueError: boom")
    started_at = conn.execute(
        "SELECT started_at FROM dead_letter WHERE id = %s", [job_id]
    ).fetchone()
    assert started_at is not None and started_at[0] is not None

    listed = client.get("/api/v1/dead-letters").json()["dead_letters"]
    shown = client.get(f"/api/v1/dead-letters/{job_id}").json()
    for job in (listed[0], shown):
        assert job["id"] == job_id and job["started_at"] is not None, job
        assert datetime.fromisoformat(job["started_at"]) == started_at[0]
    never_ran = bury(conn, 1)[0]
    assert client.get(f"/api/v1/dead-letters/{never_ran}").json()["started_at"] is None


def test_groups_and_show(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    _, corrupt = _two_outages(conn)
    groups = client.get("/api/v1/dead-letters/groups").json()["groups"]
    assert [(g["task"], g["count"]) for g in groups] == [("fetch", 4), ("resize", 3)]
    assert groups[0]["fingerprint"] == "timeout after <n>s"
    assert groups[0]["queues"] == ["net"]
    only = client.get("/api/v1/dead-letters/groups", params={"task": "resize"}).json()["groups"]
    assert [g["count"] for g in only] == [3]

    shown = client.get(f"/api/v1/dead-letters/{corrupt[0]}").json()
    assert (shown["id"], shown["reason"], shown["task"]) == (corrupt[0], "exhausted", "resize")
    assert shown["traceback"].startswith("Traceback")

    queued = client.post("/api/v1/jobs", json={"task": "t"}).json()["id"]
    message = assert_error(client.get(f"/api/v1/dead-letters/{queued}"), 404, "job_not_found")
    assert "ready" in message
    assert_error(client.get("/api/v1/dead-letters/77777"), 404, "job_not_found")


def test_redrive_by_ids_fingerprint_and_filter_with_dry_runs(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    timeouts, corrupt = _two_outages(conn)
    everything = timeouts + corrupt

    dry = client.post(
        "/api/v1/dead-letters/redrive", json={"ids": timeouts[:2], "dry_run": True}
    ).json()
    assert dry == {"dry_run": True, "count": 2, "ids": timeouts[:2]}
    assert count(conn, "dead_letter") == 7

    moved = client.post("/api/v1/dead-letters/redrive", json={"ids": timeouts[:2]}).json()
    assert moved == {"dry_run": False, "count": 2, "ids": timeouts[:2]}

    fingerprint = client.get("/api/v1/dead-letters/groups", params={"task": "fetch"}).json()
    by_fingerprint = client.post(
        "/api/v1/dead-letters/redrive",
        json={"fingerprint": fingerprint["groups"][0]["fingerprint_id"], "batch_size": 1},
    ).json()
    assert by_fingerprint["ids"] == timeouts[2:]

    by_filter = client.post(
        "/api/v1/dead-letters/redrive", json={"task": "resize", "error": "corrupt"}
    ).json()
    assert by_filter["ids"] == corrupt
    assert count(conn, "dead_letter") == 0
    assert count(conn, "queued_jobs") == 7
    assert_one_home(conn, everything)


def test_redrive_refusals_change_nothing(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    (dead,) = bury(conn, 1)
    queued = client.post("/api/v1/jobs", json={"task": "t"}).json()["id"]
    assert_error(client.post("/api/v1/dead-letters/redrive", json={}), 422, "invalid_value", "ids")
    message = assert_error(
        client.post("/api/v1/dead-letters/redrive", json={"ids": [dead, queued]}),
        404,
        "job_not_found",
    )
    assert "nothing was changed" in message
    assert_error(
        client.post("/api/v1/dead-letters/redrive", json={"ids": []}),
        422,
        "validation_error",
        "ids",
    )
    assert count(conn, "dead_letter") == 1
    everything = client.post("/api/v1/dead-letters/redrive", json={"all": True}).json()
    assert everything["ids"] == [dead]


def test_purge_needs_its_confirmation(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    timeouts, corrupt = _two_outages(conn)
    assert_error(
        client.post("/api/v1/dead-letters/purge", json={"task": "fetch"}),
        422,
        "confirmation_required",
        "confirm",
    )
    assert_error(
        client.post("/api/v1/dead-letters/purge", json={"task": "fetch", "confirm": "yes"}),
        422,
        "validation_error",
        "confirm",
    )
    dry = client.post("/api/v1/dead-letters/purge", json={"task": "fetch", "dry_run": True})
    assert dry.json() == {"dry_run": True, "count": 4, "ids": timeouts}
    assert count(conn, "dead_letter") == 7

    purged = client.post("/api/v1/dead-letters/purge", json={"task": "fetch", "confirm": "purge"})
    assert purged.json() == {"dry_run": False, "count": 4, "ids": timeouts}
    assert sorted(job.id for job in admin.dead_jobs(conn)) == corrupt
