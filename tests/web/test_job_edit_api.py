"""``PATCH /api/v1/jobs/{id}``: each field, the job answered with its edits (and ``GET`` showing
them), the write scope, the principal recorded, every refusal in the one error shape with
nothing written, and the route in the OpenAPI document with its examples."""

from __future__ import annotations

from typing import Any

import pytest

from pgjobs import App
from tests.support.admin_factories import bury, claim_one, succeed
from tests.support.helpers import count, scalar
from tests.web.conftest import AUTH, READ_AUTH, TestClient, assert_error


@pytest.fixture
def app(make_app: Any) -> App:
    app: App = make_app()

    @app.task(name="mail.send", version=2, upgrade={1: lambda p: p})
    def send(user_id: int, locale: str = "en") -> None:
        """A typed, versioned handler."""

    return app


@pytest.fixture
def typed(make_web: Any, app: App) -> Any:
    """A client of a server that has the app (its handlers check payloads)."""
    with TestClient(make_web(app=app), headers=AUTH) as typed_client:
        yield typed_client


def test_each_field_and_the_record(app, typed, conn) -> None:
    job = app.enqueue("mail.send", {"user_id": 1}, tags=["a"])
    answer = typed.patch(
        f"/api/v1/jobs/{job}",
        json={
            "priority": 7,
            "run_at": "2030-01-02T09:00:00Z",
            "payload": {"user_id": 2, "locale": "fr"},
            "max_attempts": 10,
            "tags": ["b"],
        },
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["priority"], body["max_attempts"], body["tags"]) == (7, 10, ["b"])
    assert body["payload"] == {"user_id": 2, "locale": "fr"}
    assert body["run_at"].startswith("2030-01-02T09:00:00")
    assert body["status"] == "scheduled"
    (edit,) = body["edits"]
    assert edit["edited_by"] == "api"
    assert list(edit["changes"]) == ["priority", "run_at", "payload", "max_attempts", "tags"]
    assert edit["changes"]["tags"] == {"old": ["a"], "new": ["b"]}
    assert scalar(conn, "SELECT payload_version FROM queued_jobs WHERE id = %s", [job]) == 2

    shown = typed.get(f"/api/v1/jobs/{job}").json()
    assert shown["edits"] == body["edits"]

    answer = typed.patch(f"/api/v1/jobs/{job}", json={"tags": [], "delay": 0})
    assert answer.status_code == 200 and answer.json()["tags"] == []
    assert answer.json()["status"] == "ready" and len(answer.json()["edits"]) == 2


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({"priority": 40_000}, 422, "validation_error", "priority"),
        ({"priority": "7"}, 422, "validation_error", "priority"),
        ({"run_at": "2030-01-01T00:00:00"}, 422, "validation_error", "run_at"),
        ({"run_at": "2030-01-01T00:00:00Z", "delay": 5}, 422, "invalid_value", "delay"),
        ({"payload": {"user_id": "x"}}, 422, "invalid_payload", "payload.user_id"),
        ({"payload": {"user_id": 1, "nope": 2}}, 422, "invalid_payload", "payload"),
        ({"max_attempts": 0}, 422, "validation_error", "max_attempts"),
        ({"tags": [""]}, 422, "validation_error", "tags"),
        ({"colour": "red"}, 422, "validation_error", "colour"),
        ({}, 422, "invalid_value", None),
    ],
)
def test_bad_input_is_refused_writing_nothing(app, typed, conn, body, status, code, field):
    job = app.enqueue("mail.send", {"user_id": 1})
    answer = typed.patch(f"/api/v1/jobs/{job}", json=body)
    message = assert_error(answer, status, code)
    if field is not None:
        assert answer.json()["error"]["field"].startswith(field), answer.json()
    assert "\n" not in message
    assert count(conn, "pgjobs_job_edits") == 0
    assert scalar(conn, "SELECT priority FROM queued_jobs WHERE id = %s", [job]) == 0


def test_jobs_that_cannot_be_edited(app, client, conn) -> None:
    running = app.enqueue("mail.send", {"user_id": 1})
    claim_one(conn, running, owner="host:1:w")
    finished = app.enqueue("mail.send", {"user_id": 1})
    succeed(conn, claim_one(conn, finished))
    (dead,) = bury(conn, 1)
    for job_id, status, code, words in (
        (running, 409, "job_state_conflict", "running on worker host:1:w"),
        (finished, 409, "job_state_conflict", "succeeded (in archived_jobs)"),
        (dead, 409, "job_state_conflict", "dead (in dead_letter)"),
        (987_654, 404, "job_not_found", "no job 987654"),
    ):
        answer = client.patch(f"/api/v1/jobs/{job_id}", json={"priority": 1})
        assert words in assert_error(answer, status, code)
    assert count(conn, "pgjobs_job_edits") == 0


def test_an_edit_needs_a_full_token(app, web, conn) -> None:
    job = app.enqueue("mail.send", {"user_id": 1})
    with TestClient(web, headers=READ_AUTH) as reader:
        assert_error(reader.patch(f"/api/v1/jobs/{job}", json={"priority": 1}), 403, "forbidden")
    with TestClient(web) as anonymous:
        answer = anonymous.patch(f"/api/v1/jobs/{job}", json={"priority": 1})
        assert_error(answer, 401, "unauthenticated")
    assert count(conn, "pgjobs_job_edits") == 0


def test_the_route_is_documented_with_examples(client) -> None:
    document = client.get("/api/v1/openapi.json").json()
    operation = document["paths"]["/api/v1/jobs/{job_id}"]["patch"]
    assert {"200", "401", "403", "404", "409", "422"} <= set(operation["responses"])
    examples = operation["requestBody"]["content"]["application/json"]["examples"]
    assert {"priority", "reschedule", "payload", "tags"} <= set(examples)
