"""The dashboard's batch page: its counts, its callback job's link and its members by status,
each a link to its job; a member's job page links to its batch; an unknown batch is a 404 page."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pgjobs import App
from tests.support.factories import work
from tests.web.conftest import READ_AUTH, TestClient


@pytest.fixture
def app(make_app: Any) -> App:
    app: App = make_app()

    @app.task(name="reports.render")
    def render(page: int) -> None:
        if page == 2:
            raise ValueError("page 2 is broken")

    @app.task(name="reports.summarise", max_attempts=1)
    def summarise(batch: dict[str, int]) -> None: ...

    return app


def links(html: str, section: str) -> list[int]:
    """The job ids linked from the members of ``section`` (a status)."""
    start = html.index(f'id="members-{section}"')
    end = html.index("</p>", start)
    return [int(n) for n in re.findall(r'/jobs/(\d+)"', html[start:end])]


def test_the_batch_page_shows_members_by_status_and_the_callback(app: App, client: TestClient):
    with app.batch(on_complete="reports.summarise") as batch:
        batch.enqueue("reports.render", {"page": 1})
        batch.enqueue("reports.render", {"page": 2}, max_attempts=1)
        batch.enqueue("reports.render", {"page": 3}, queue="later")  # no worker serves it
    work(app, queues=["default"])
    page = client.get(f"/batches/{batch.id}", headers=READ_AUTH)
    assert page.status_code == 200, page.text
    html = page.text
    assert "1 of 3 members have not ended yet" in html
    assert links(html, "succeeded") == [batch.ids[0]]
    assert links(html, "dead") == [batch.ids[1]]
    assert links(html, "ready") == [batch.ids[2]]
    assert "enqueued when the last member ends" in html

    app.cancel(batch.ids[2])
    html = client.get(f"/batches/{batch.id}").text
    callback_id = app.batch_status(batch.id).callback_job_id
    assert callback_id is not None
    assert f'href="/jobs/{callback_id}"' in html
    assert "Every member ended" in html and links(html, "cancelled") == [batch.ids[2]]

    member = client.get(f"/jobs/{batch.ids[0]}").text
    assert f'<a id="job-batch" href="/batches/{batch.id}">batch {batch.id}</a>' in member
    assert 'id="job-batch"' not in client.get(f"/jobs/{callback_id}").text


@pytest.mark.parametrize("bad", ["424242", "0", "seven", str(2**63)])
def test_an_unknown_batch_is_a_404_page(client: TestClient, bad: str):
    page = client.get(f"/batches/{bad}")
    assert page.status_code == 404, page.text
    assert "batch" in page.text
