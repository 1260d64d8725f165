"""The job page's edit form: shown for a queued job that is not running (to a viewer who may
act), it changes the fields edited (the payload checked by the server's app), records the edit
as the viewer and shows the record; a stale CSRF token, a read-only token, bad values and a job
that cannot be edited change nothing."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI

from pgjobs import App
from tests.support.admin_factories import claim_one
from tests.support.helpers import count, scalar
from tests.web.conftest import READ_TOKEN, TestClient
from tests.web.dashboard.conftest import csrf_of, login


@pytest.fixture
def app(make_app: Any) -> App:
    app: App = make_app()

    @app.task(name="mail.send")
    def send(user_id: int) -> None:
        """Typed: a payload that does not fit is refused."""

    return app


@pytest.fixture
def web(make_web: Any, app: App) -> FastAPI:
    """A server that has the app (its handlers check an edited payload)."""
    web: FastAPI = make_web(app=app)
    return web


def _form(page: str) -> dict[str, str]:
    """The edit form's fields as the page fills them in."""
    form = page[page.index('id="edit-form"') :]
    form = form[: form.index("</form>")]
    fields = dict(re.findall(r'name="([a-z_]+)"[^>]*?value="([^"]*)"', form))
    payload = re.search(r'<textarea name="payload"[^>]*>(.*?)</textarea>', form, re.S)
    assert payload is not None
    fields["payload"] = payload.group(1).replace("&#34;", '"').replace("&quot;", '"')
    fields["csrf"] = csrf_of(page)
    return fields


def test_the_form_edits_the_job_and_the_page_shows_the_record(
    signed_in: TestClient, app: App, conn: psycopg.Connection[Any]
) -> None:
    job = app.enqueue("mail.send", {"user_id": 1}, tags=["a", "b"])
    fields = _form(signed_in.get(f"/jobs/{job}").text)
    assert (fields["priority"], fields["max_attempts"], fields["tags"]) == ("0", "5", "a, b")

    # The form as shown, sent back: nothing changes, nothing is recorded.
    same = signed_in.post(f"/jobs/{job}/edit", data=fields)
    assert f"Job {job} unchanged" in same.text and count(conn, "pgjobs_job_edits") == 0

    changed = {**fields, "priority": "7", "tags": "c", "payload": '{"user_id": 2}'}
    done = signed_in.post(f"/jobs/{job}/edit", data=changed, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == f"/jobs/{job}"
    page = signed_in.get(done.headers["location"]).text
    assert f"Job {job} edited: priority, payload, tags changed." in page
    assert scalar(conn, "SELECT priority FROM queued_jobs WHERE id = %s", [job]) == 7
    assert scalar(conn, "SELECT payload FROM queued_jobs WHERE id = %s", [job]) == {"user_id": 2}
    assert scalar(conn, "SELECT tags FROM queued_jobs WHERE id = %s", [job]) == ["c"]
    history = page[page.index('id="edits"') :]
    assert "<strong>priority</strong> <code>0</code> → <code>7</code>" in history
    assert "<code>dashboard</code>" in history  # a token names no one

    signed_in.post(f"/jobs/{job}/edit", data={**_form(page), "run_at": "now", "tags": ""})
    assert scalar(conn, "SELECT tags FROM queued_jobs WHERE id = %s", [job]) is None
    assert count(conn, "pgjobs_job_edits") == 2


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"priority": "high"}, "priority must be a whole number"),
        ({"priority": "40000"}, "out of range"),
        ({"run_at": "tomorrow"}, "run at must be now or an ISO 8601 time"),
        ({"payload": "{nope"}, "the payload is not JSON"),
        ({"payload": '{"user_id": "x"}'}, "payload.user_id"),
        ({"max_attempts": "0"}, "max_attempts must be a whole number in"),
    ],
)
def test_bad_values_are_shown_and_change_nothing(
    signed_in: TestClient, app: App, conn: psycopg.Connection[Any], change: Any, words: str
) -> None:
    job = app.enqueue("mail.send", {"user_id": 1})
    fields = _form(signed_in.get(f"/jobs/{job}").text)
    page = signed_in.post(f"/jobs/{job}/edit", data={**fields, **change}).text
    assert words in page
    assert count(conn, "pgjobs_job_edits") == 0
    assert scalar(conn, "SELECT priority FROM queued_jobs WHERE id = %s", [job]) == 0


def test_no_form_for_a_running_job_and_its_edit_is_refused(
    signed_in: TestClient, app: App, conn: psycopg.Connection[Any]
) -> None:
    job = app.enqueue("mail.send", {"user_id": 1})
    fields = _form(signed_in.get(f"/jobs/{job}").text)
    claim_one(conn, job, owner="host:1:w")
    assert 'id="edit-form"' not in signed_in.get(f"/jobs/{job}").text
    page = signed_in.post(f"/jobs/{job}/edit", data={**fields, "priority": "3"}).text
    assert "running on worker host:1:w" in page
    assert count(conn, "pgjobs_job_edits") == 0


def test_csrf_and_read_only_tokens_are_refused(
    signed_in: TestClient, web: FastAPI, app: App, conn: psycopg.Connection[Any]
) -> None:
    job = app.enqueue("mail.send", {"user_id": 1})
    fields = {**_form(signed_in.get(f"/jobs/{job}").text), "priority": "9"}
    for csrf in ("", "0" * 64):
        refused = signed_in.post(f"/jobs/{job}/edit", data={**fields, "csrf": csrf})
        assert refused.status_code == 403 and "nothing was changed" in refused.text
    with TestClient(web) as reader:
        login(reader, READ_TOKEN)
        page = reader.get(f"/jobs/{job}").text
        assert 'id="edit-form"' not in page
        refused = reader.post(f"/jobs/{job}/edit", data={**fields, "csrf": csrf_of(page)})
        assert refused.status_code == 403 and "read-only" in refused.text
    assert count(conn, "pgjobs_job_edits") == 0
    assert scalar(conn, "SELECT priority FROM queued_jobs WHERE id = %s", [job]) == 0
