"""The dashboard's job page shows a job's snoozes and its handler's progress (a bar and a line)."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from tests.web.conftest import TestClient

PROGRESS = {"done": 30, "total": 120, "message": "resizing", "at": "2031-01-01T02:00:00.5+02:00"}


def test_the_dashboards_job_page_shows_a_progress_bar(
    make_app: Any, conn: psycopg.Connection[Any], signed_in: TestClient
) -> None:
    job_id = make_app(check_task_names=False).enqueue("images.resize", {"n": 1})
    conn.execute(
        "UPDATE queued_jobs SET snoozes = 3, progress = %s WHERE id = %s",
        [json.dumps(PROGRESS), job_id],
    )
    html = signed_in.get(f"/jobs/{job_id}").text
    assert '<dd id="job-snoozes">3</dd>' in html
    assert '<progress max="120" value="30"></progress> 30 of 120: resizing' in html
    # Its time reads as every other moment on the page does.
    assert "30 of 120: resizing <small>(2031-01-01 00:00:00Z)</small></dd>" in html
    plain = make_app(check_task_names=False).enqueue("images.resize", {"n": 2})
    html = signed_in.get(f"/jobs/{plain}").text
    assert 'id="job-progress"' not in html and 'id="job-snoozes"' not in html
