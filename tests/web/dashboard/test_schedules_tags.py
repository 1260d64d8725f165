"""The dashboard's schedules page (next and last run, who declares it, paused or not; pause and
resume behind the session's CSRF token, refused to a read-only token) and its tags: shown on a
job's page as links to the job list, which filters on them, as the dead-letter page does."""

from __future__ import annotations

import re
from typing import Any

import psycopg

from pgjobs import App
from tests.web.conftest import TestClient
from tests.web.dashboard.conftest import csrf_of


def _schedule(conn: psycopg.Connection[Any], name: str, *, declared_ago: str = "5 seconds") -> None:
    conn.execute(
        "INSERT INTO pgjobs_schedules (name, task, queue, schedule, timezone, catch_up, "
        "next_run_at, last_run_at, last_enqueued_at, last_job_id, declared_at) "
        "VALUES (%s, 'reports.build', 'reports', '0 * * * *', 'Europe/Paris', 'last', "
        "now() + interval '20 minutes', now() - interval '40 minutes', "
        "now() - interval '40 minutes', 4242, now() - %s::interval)",
        [name, declared_ago],
    )


def _row(page: str, name: str) -> str:
    found = re.search(rf'<tr data-schedule="{re.escape(name)}".*?</tr>', page, re.S)
    assert found is not None, f"no row for {name}"
    return found.group(0)


def _paused(conn: psycopg.Connection[Any], name: str) -> Any:
    row = conn.execute("SELECT paused_at, paused_by FROM pgjobs_schedules WHERE name = %s", [name])
    return row.fetchone()


def test_the_schedules_page_lists_them_and_pauses_and_resumes(
    signed_in: TestClient, conn: psycopg.Connection[Any]
) -> None:
    _schedule(conn, "reports.hourly")
    _schedule(conn, "old/report", declared_ago="3 days")
    page = signed_in.get("/schedules")
    assert page.status_code == 200, page.text
    hourly = _row(page.text, "reports.hourly")
    assert "reports.build" in hourly and "0 * * * *" in hourly and "Europe/Paris" in hourly
    assert 'href="/jobs/4242"' in hourly and 'href="/queues/reports"' in hourly
    assert "declared by a worker" in hourly and "active" in hourly
    assert "no worker declares it since" in _row(page.text, "old/report")
    assert 'aria-current="page">Schedules' in page.text

    csrf = csrf_of(page.text)
    done = signed_in.post(
        "/schedules/reports.hourly/pause",
        data={"csrf": csrf, "reason": "warehouse migration"},
        follow_redirects=False,
    )
    assert done.status_code == 303 and done.headers["location"] == "/schedules"
    paused_at, paused_by = _paused(conn, "reports.hourly")
    assert paused_at is not None and paused_by.startswith("dashboard (")
    assert paused_by.endswith(": warehouse migration")
    shown = signed_in.get("/schedules").text
    assert "Schedule reports.hourly paused" in shown
    row = _row(shown, "reports.hourly")
    assert "paused</strong> since" in row and "warehouse migration" in row
    assert 'action="/schedules/reports.hourly/resume"' in row

    # A name holding "/" is one path segment's worth of text (%2F).
    signed_in.post("/schedules/old%2Freport/pause", data={"csrf": csrf})
    assert _paused(conn, "old/report")[0] is not None

    resumed = signed_in.post("/schedules/reports.hourly/resume", data={"csrf": csrf})
    assert _paused(conn, "reports.hourly") == (None, None)
    assert "Schedule reports.hourly resumed" in resumed.text

    # Without the session's CSRF token nothing changes; an unknown schedule or action says so.
    refused = signed_in.post("/schedules/reports.hourly/pause", data={"csrf": "0" * 64})
    assert refused.status_code == 403 and _paused(conn, "reports.hourly")[0] is None
    unknown = signed_in.post("/schedules/nope/pause", data={"csrf": csrf})
    assert "no schedule named &#39;nope&#39;" in unknown.text
    explode = signed_in.post("/schedules/reports.hourly/explode", data={"csrf": csrf})
    assert "no action &#39;explode&#39; on schedules" in explode.text
    assert _paused(conn, "reports.hourly")[0] is None


def test_a_read_only_token_sees_schedules_but_cannot_pause(
    read_only: TestClient, conn: psycopg.Connection[Any]
) -> None:
    _schedule(conn, "reports.hourly")
    page = read_only.get("/schedules")
    assert page.status_code == 200 and "reports.hourly" in page.text
    assert 'action="/schedules/' not in page.text
    refused = read_only.post(
        "/schedules/reports.hourly/pause", data={"csrf": csrf_of(page.text)}, follow_redirects=False
    )
    assert refused.status_code == 403 and "read-only" in refused.text
    assert _paused(conn, "reports.hourly")[0] is None


def test_no_schedule_says_how_to_declare_one(signed_in: TestClient) -> None:
    page = signed_in.get("/schedules")
    assert page.status_code == 200 and "No schedule" in page.text


def test_tags_link_to_the_job_list_which_filters_on_them(
    signed_in: TestClient, make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app(check_task_names=False)
    tagged = app.enqueue("t.send", {}, tags=["customer:42", "<b>x</b>"])
    other = app.enqueue("t.send", {}, tags=["customer:43"])
    plain = app.enqueue("t.send", {})
    page = signed_in.get(f"/jobs/{tagged}").text
    assert 'id="job-tags"' in page
    assert 'href="/jobs?tag=customer%3A42"' in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
    assert 'id="job-tags"' not in signed_in.get(f"/jobs/{plain}").text

    listed = signed_in.get("/jobs", params={"tag": "customer:42"}).text
    assert f'data-id="{tagged}"' in listed
    assert f'data-id="{other}"' not in listed and f'data-id="{plain}"' not in listed
    assert 'value="customer:42"' in listed
    bad = signed_in.get("/jobs", params={"tag": "x" * 101})
    assert bad.status_code == 422 and "limit is 100" in bad.text

    conn.execute(
        "WITH gone AS (DELETE FROM queued_jobs WHERE id IN (%s, %s) RETURNING *) "
        "INSERT INTO dead_letter (id, queue, task, payload, priority, run_at, attempts, "
        "max_attempts, reason, created_at, tags) "
        "SELECT id, queue, task, payload, priority, run_at, 1, 1, 'exhausted', created_at, tags "
        "FROM gone",
        [tagged, other],
    )
    dead = signed_in.get("/dead", params={"tag": "customer:43"}).text
    assert f"/jobs/{other}" in dead and f"/jobs/{tagged}" not in dead
