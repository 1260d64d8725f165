"""Every bad request gets a precise 4xx in the one error shape, and changes nothing; unexpected
failures are a 500 in the same shape, logged once, saying nothing of their internals."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI

from pgjobs import App, InvalidPayload, admin, enqueue
from pgjobs.errors import PoolerMismatch, QueryFailed
from tests.support.helpers import count
from tests.web.conftest import AUTH, TestClient, assert_error


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "task"),
        ({"task": 5}, "task"),
        ({"task": "t", "payload": "text"}, "payload"),
        ({"task": "t", "priority": "high"}, "priority"),
        ({"task": "t", "priority": 1.5}, "priority"),
        ({"task": "t", "priority": True}, "priority"),
        ({"task": "t", "priority": 32768}, "priority"),
        ({"task": "t", "max_attempts": 0}, "max_attempts"),
        ({"task": "t", "delay": -0.5}, "delay"),
        ({"task": "t", "expires_in": "soon"}, "expires_in"),
        ({"task": "t", "run_at": "tomorrow"}, "run_at"),
        ({"task": "t", "run_at": "2030-01-01T00:00:00"}, "run_at"),
        ({"task": "t", "idempotency_key": ""}, "idempotency_key"),
        ({"task": "t", "idempotency_key": "x" * 513}, "idempotency_key"),
        ({"task": "t", "queue": "x" * 201}, "queue"),
        ({"task": "a\x00b"}, "task"),
        ({"task": "t", "surprise": 1}, "surprise"),
    ],
)
def test_wrong_types_and_out_of_range_values_are_422_naming_the_field(
    client: TestClient, conn: psycopg.Connection[Any], body: dict[str, Any], field: str
) -> None:
    assert_error(client.post("/api/v1/jobs", json=body), 422, "validation_error", field)
    assert count(conn, "queued_jobs") == 0


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        # Valid types and bounds; pgjobs' own validation refuses them.
        ({"task": "t", "delay": 5, "run_at": "2030-01-01T00:00:00Z"}, "invalid_value", "delay"),
        ({"task": "tab\there"}, "invalid_value", "task"),
        ({"task": "t", "payload": {"text": "nul \u0000 inside"}}, "invalid_payload", "payload"),
        ({"task": "t", "payload": {"n": float("inf")}}, "invalid_payload", "payload"),
    ],
)
def test_values_refused_by_pgjobs_validation_are_422_with_its_field(
    client: TestClient,
    conn: psycopg.Connection[Any],
    body: dict[str, Any],
    code: str,
    field: str,
) -> None:
    import json

    raw = json.dumps(body)  # Infinity is not JSON, but Python's parser (FastAPI's) reads it
    response = client.post(
        "/api/v1/jobs", content=raw, headers={"content-type": "application/json"}
    )
    assert_error(response, 422, code, field)
    assert count(conn, "queued_jobs") == 0


def test_a_lone_surrogate_is_refused(client: TestClient) -> None:
    raw = '{"task": "t", "queue": "\\ud800"}'
    response = client.post(
        "/api/v1/jobs", content=raw, headers={"content-type": "application/json"}
    )
    assert_error(response, 422, "validation_error", "queue")


def test_malformed_json_is_400(client: TestClient) -> None:
    for raw in (b"{", b'{"task": "t",}', b"\xff\xfe", b"[1, 2"):
        response = client.post(
            "/api/v1/jobs", content=raw, headers={"content-type": "application/json"}
        )
        assert response.status_code in (400, 422), response.text
        assert response.json()["error"]["code"] in ("malformed_json", "validation_error")
    assert_error(
        client.post("/api/v1/jobs", content=b"{", headers={"content-type": "application/json"}),
        400,
        "malformed_json",
    )
    deep = b'{"task": "t", "payload": {"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    assert_error(
        client.post("/api/v1/jobs", content=deep, headers={"content-type": "application/json"}),
        400,
        "malformed_json",
    )
    assert_error(
        client.post("/api/v1/jobs", content=b"[]", headers={"content-type": "application/json"}),
        422,
        "validation_error",
    )


def test_a_body_that_is_not_json_is_415(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "application/xml"):
        response = client.post(
            "/api/v1/jobs", content=b'{"task": "t"}', headers={"content-type": content_type}
        )
        assert_error(response, 415, "unsupported_media_type")
    assert_error(
        client.post("/api/v1/jobs", content=b'{"task": "t"}', headers={"content-type": ""}),
        415,
        "unsupported_media_type",
    )
    ok = client.post(
        "/api/v1/jobs",
        content=b'{"task": "t"}',
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 201
    assert count(conn, "queued_jobs") == 1


@pytest.fixture
def small_limit(make_web: Callable[..., FastAPI]) -> Iterator[TestClient]:
    with TestClient(make_web(max_body_bytes=200), headers=AUTH) as client:
        yield client


def test_an_oversized_body_is_413_by_length_or_while_read(
    small_limit: TestClient, conn: psycopg.Connection[Any]
) -> None:
    big = {"task": "t", "payload": {"blob": "x" * 300}}
    message = assert_error(small_limit.post("/api/v1/jobs", json=big), 413, "payload_too_large")
    assert "200 bytes" in message

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit binds while reading
        yield b'{"task": "t", "payload": {"blob": "'
        for _ in range(10):
            yield b"x" * 100
        yield b'"}}'

    streamed = small_limit.post(
        "/api/v1/jobs", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_error(streamed, 413, "payload_too_large")
    assert small_limit.post("/api/v1/jobs", json={"task": "t"}).status_code == 201
    assert count(conn, "queued_jobs") == 1


def test_unknown_routes_and_methods(client: TestClient) -> None:
    assert_error(client.get("/api/v1/nothing-here"), 404, "not_found")
    assert_error(client.get("/nothing"), 404, "not_found")
    not_allowed = client.delete("/api/v1/jobs/1")
    assert_error(not_allowed, 405, "method_not_allowed")
    assert_error(client.get("/api/v1/jobs/not-a-number"), 422, "validation_error", "job_id")
    assert_error(client.get("/api/v1/jobs/0"), 422, "validation_error", "job_id")
    assert_error(client.get(f"/api/v1/jobs/{2**63}"), 422, "validation_error", "job_id")


def test_unknown_task_is_refused_when_the_server_has_the_app(
    make_web: Callable[..., FastAPI], conn: psycopg.Connection[Any]
) -> None:
    app = App()

    @app.task(name="emails.send", queue="emails", max_attempts=2)
    def send(to: str) -> None: ...

    with TestClient(make_web(app=app), headers=AUTH) as client:
        message = assert_error(
            client.post("/api/v1/jobs", json={"task": "emails.sned"}), 422, "unknown_task", "task"
        )
        assert "emails.send" in message
        batch = client.post(
            "/api/v1/jobs/batch",
            json={"jobs": [{"task": "emails.send", "payload": {"to": "a"}}, {"task": "nope"}]},
        )
        assert_error(batch, 422, "unknown_task", "jobs[1].task")
        assert count(conn, "queued_jobs") == 0
        # The task's defaults apply.
        job = client.post("/api/v1/jobs", json={"task": "emails.send", "payload": {"to": "a"}})
        assert (job.json()["queue"], job.json()["max_attempts"]) == ("emails", 2)


def test_a_payload_the_handler_cannot_take_is_422_naming_the_field_as_the_cli_says(
    make_web: Callable[..., FastAPI], conn: psycopg.Connection[Any]
) -> None:
    app = App()

    @app.task(name="emails.send")
    def send(to: str, retries: int = 1) -> None: ...

    bad = [{"to": "a", "retries": "many"}, {"to": "a", "cc": "b"}, {}]
    expected = []
    for payload in bad:
        with pytest.raises(InvalidPayload) as raised:  # the CLI's and eager()'s check
            enqueue.handler_arguments(app.tasks["emails.send"], payload)
        expected.append((raised.value.field, str(raised.value)))
    with TestClient(make_web(app=app), headers=AUTH) as client:
        for payload, (field, message) in zip(bad, expected, strict=True):
            job = {"task": "emails.send", "payload": payload}
            one = client.post("/api/v1/jobs", json=job)
            assert assert_error(one, 422, "invalid_payload", field) == message
            put = client.put("/api/v1/jobs/key-1", json=job)
            assert assert_error(put, 422, "invalid_payload", field) == message
            many = client.post(
                "/api/v1/jobs/batch",
                json={"jobs": [{"task": "emails.send", "payload": {"to": "b"}}, job]},
            )
            assert_error(many, 422, "invalid_payload", f"jobs[1].{field}")
        assert count(conn, "queued_jobs") == 0
        fits = client.post("/api/v1/jobs", json={"task": "emails.send", "payload": {"to": "a"}})
        assert fits.status_code == 201, fits.text


def test_unexpected_errors_are_500_in_the_shape_logged_once(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("internal detail 4711")

    monkeypatch.setattr(admin, "job", broken)
    with caplog.at_level(logging.ERROR):
        response = client.get("/api/v1/jobs/1")
    message = assert_error(response, 500, "internal_error")
    assert "4711" not in message
    logged = [r for r in caplog.records if "4711" in (r.exc_text or "") or r.exc_info]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]
    assert "GET /api/v1/jobs/1" in logged[0].getMessage()


def test_a_refused_query_is_500_in_the_shape(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise QueryFailed("PostgreSQL refused the statement (SQLSTATE 42000): no")

    monkeypatch.setattr(admin, "job", refused)
    assert_error(client.get("/api/v1/jobs/1"), 500, "query_failed")


def test_a_pooler_the_server_was_not_told_about_is_503_naming_it(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def mixed_up(*args: Any, **kwargs: Any) -> Any:
        raise PoolerMismatch("a transaction-mode pooler: set pooler = 'transaction'")

    monkeypatch.setattr(admin, "job", mixed_up)
    response = client.get("/api/v1/jobs/1")
    message = assert_error(response, 503, "pooler_mismatch")
    assert "pooler" in message
    assert response.headers["Retry-After"]
