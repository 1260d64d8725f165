"""The dashboard's job page shows the jobs a job runs after (and whether it still waits) and the
jobs that run after it, each a link with its status."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.web.conftest import TestClient


def test_the_job_page_links_dependencies_and_dependents(
    make_app: Any, conn: psycopg.Connection[Any], signed_in: TestClient
) -> None:
    app = make_app(check_task_names=False)
    first = app.enqueue("etl.extract", {"day": 1})
    second = app.enqueue("etl.load", {"day": 1}, after=[first])
    html = signed_in.get(f"/jobs/{second}").text
    assert 'id="job-after"' in html
    assert (
        f'<a href="/jobs/{first}">#{first}</a> <span class="badge badge-ready">ready</span>' in html
    )
    assert "still waits for 1" in html
    html = signed_in.get(f"/jobs/{first}").text
    assert 'id="job-dependents"' in html
    assert (
        f'<a href="/jobs/{second}">#{second}</a> <span class="badge badge-waiting">waiting</span>'
        in html
    )
    assert 'id="job-after"' not in html
    plain = app.enqueue("etl.extract", {"day": 2})
    html = signed_in.get(f"/jobs/{plain}").text
    assert 'id="job-after"' not in html and 'id="job-dependents"' not in html
