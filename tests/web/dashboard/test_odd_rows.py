"""Rows the API and the dashboard must show whatever they hold: times Python cannot hold and a
payload that is not a JSON object (rows pgjobs did not write), and values of megabytes, which a
page shows clipped while the API gives them whole."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from pgjobs.text import SHOWN_BYTES
from tests.support.factories import insert_dead_raw
from tests.web.conftest import AUTH, TestClient

#: Bytes a job page may take beyond the values it shows: the page's own markup and facts.
PAGE_MARKUP = 64 * 1024


def test_rows_python_cannot_hold_are_shown_as_they_are(
    signed_in: TestClient, conn: psycopg.Connection[Any]
) -> None:
    bad = insert_dead_raw(
        conn,
        created_at="infinity",
        run_at="10000-01-01",
        started_at="-infinity",
        payload='["not", "an", "object"]',
    )
    good = insert_dead_raw(conn, task="t.fine")

    job = signed_in.get(f"/api/v1/jobs/{bad}", headers=AUTH)
    assert job.status_code == 200, job.text
    shown = job.json()
    assert (shown["created_at"], shown["run_at"]) == ("infinity", "10000-01-01 00:00:00+00")
    assert shown["payload"] == ["not", "an", "object"]
    dead = signed_in.get("/api/v1/dead-letters", headers=AUTH)
    assert dead.status_code == 200, dead.text
    by_id = {row["id"]: row for row in dead.json()["dead_letters"]}
    assert by_id[bad]["started_at"] == "-infinity" and set(by_id) == {bad, good}
    assert signed_in.get(f"/api/v1/dead-letters/{bad}", headers=AUTH).status_code == 200
    listed = signed_in.get("/api/v1/jobs?state=dead", headers=AUTH)
    assert listed.status_code == 200, listed.text
    assert bad in {row["id"] for row in listed.json()["jobs"]}

    page = signed_in.get(f"/jobs/{bad}")
    assert page.status_code == 200, page.text
    assert "infinity" in page.text and "10000-01-01 00:00:00+00" in page.text
    for path in ("/dead", "/jobs", "/jobs?state=dead", f"/jobs?find={bad}"):
        assert signed_in.get(path).status_code == 200, path


def test_a_page_shows_a_bounded_part_of_a_huge_value_and_the_api_the_whole(
    signed_in: TestClient, conn: psycopg.Connection[Any]
) -> None:
    payload = {"blob": "<é>" * 500_000}  # 2 MB of JSON, each character escaped on the page
    trace = "Traceback (most recent call last):\n" + "  frame\n" * 300_000
    job_id = insert_dead_raw(conn, payload=json.dumps(payload), traceback=trace)

    page = signed_in.get(f"/jobs/{job_id}")

    assert page.status_code == 200, page.text
    # Two values clipped, each escaped (at most 5 bytes of HTML a byte: "&lt;"), and the page.
    assert len(page.content) < 2 * 5 * SHOWN_BYTES + PAGE_MARKUP
    assert "bytes more: the API" in page.text
    whole = signed_in.get(f"/api/v1/jobs/{job_id}", headers=AUTH).json()
    assert whole["payload"] == payload and whole["traceback"] == trace


def test_pages_of_jobs_page_past_times_python_cannot_hold(
    signed_in: TestClient, conn: psycopg.Connection[Any]
) -> None:
    ids = {
        insert_dead_raw(conn, failed_at=at)
        for at in ("infinity", "10000-01-01", "10000-01-01", "2026-01-02", "-infinity")
    }
    seen: list[int] = []
    cursor = None
    for _ in range(len(ids) + 1):
        query = "&cursor=" + cursor if cursor else ""
        page = signed_in.get(f"/api/v1/jobs?state=dead&limit=1{query}", headers=AUTH)
        assert page.status_code == 200, page.text
        seen += [job["id"] for job in page.json()["jobs"]]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids)
