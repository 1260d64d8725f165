"""Queue actions over HTTP (``/api/v1/queues``): pause, resume and limits do what `pgjobs queue`
does, through the same operations: a pause sent over HTTP is what `pgjobs queue list` shows and
what the claim obeys, a limit set by the CLI is what the API answers; a read token, a bad value
or a bad name is refused in the one error shape and writes nothing."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI

from pgjobs import App, JobSpec
from pgjobs.db.dsn import Dsn
from pgjobs.web.principal import Principal, Role
from tests.support.factories import claim
from tests.support.helpers import run
from tests.web.conftest import READ_AUTH, TestClient, assert_error

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


@pytest.fixture(autouse=True)
def no_queue_settings(dsn: Dsn) -> Iterator[None]:
    """No pause or limit outlives its test (it would stop the claims of the next ones)."""

    def clear() -> None:
        with psycopg.connect(dsn.url, autocommit=True) as conn:
            conn.execute("TRUNCATE pgjobs_queues")
            conn.execute("DELETE FROM queued_jobs WHERE queue IN ('emails', 'other')")

    clear()
    yield
    clear()


def cli_queues(capsys: pytest.CaptureFixture[str], dsn: Dsn) -> list[dict[str, Any]]:
    code, out, err = run(capsys, "queue", "list", "--json", "--dsn", dsn.url)
    assert code == 0, err
    found: list[dict[str, Any]] = json.loads(out)
    return found


def settings_rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT * FROM pgjobs_queues ORDER BY name").fetchall()


def same_moment(api: str | None, cli: str | None) -> bool:
    """The CLI prints datetimes with +00:00, the API with Z or +00:00: compare the instants."""
    if api is None or cli is None:
        return api is cli
    from datetime import datetime

    return datetime.fromisoformat(api) == datetime.fromisoformat(cli)


def test_a_pause_over_http_is_what_the_cli_lists_and_the_claim_obeys(
    client: TestClient,
    make_app: Callable[..., App],
    conn: psycopg.Connection[Any],
    capsys: pytest.CaptureFixture[str],
    dsn: Dsn,
) -> None:
    make_app().enqueue_many(JobSpec("t", {"n": n}, queue="emails") for n in range(2))

    response = client.post("/api/v1/queues/emails/pause", json={"reason": "SMTP outage"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["changed"] is True and body["paused"] is True and body["has_jobs"] is True
    assert body["pause_reason"] == "SMTP outage"
    assert body["paused_by"] == "api (testclient)"  # the client's address, as the dashboard

    (listed,) = [q for q in cli_queues(capsys, dsn) if q["name"] == "emails"]
    assert listed["paused"] is True and listed["pause_reason"] == "SMTP outage"
    assert listed["paused_by"] == "api (testclient)"
    # The claim every worker runs passes the paused queue by.
    assert claim(conn, queues=["emails"], limit=10) == []

    # Pausing again changes nothing; the HTTP answer is the CLI's JSON field for field.
    again = client.post("/api/v1/queues/emails/pause").json()
    assert again["changed"] is False and again["pause_reason"] == "SMTP outage"
    code, out, _ = run(capsys, "queue", "pause", "emails", "--json", "--dsn", dsn.url)
    assert code == 0
    from_cli = json.loads(out)
    assert set(from_cli) == set(again)
    assert {k: v for k, v in from_cli.items() if k != "paused_at"} == {
        k: v for k, v in again.items() if k != "paused_at"
    }
    assert same_moment(again["paused_at"], from_cli["paused_at"])

    resumed = client.post("/api/v1/queues/emails/resume").json()
    assert resumed["changed"] is True and resumed["paused"] is False
    assert not client.post("/api/v1/queues/emails/resume").json()["changed"]
    assert len(claim(conn, queues=["emails"], limit=10)) == 2


def test_a_pause_by_the_cli_is_what_the_api_answers(
    client: TestClient, capsys: pytest.CaptureFixture[str], dsn: Dsn
) -> None:
    code, _, err = run(capsys, "queue", "pause", "emails", "-r", "deploy", "--dsn", dsn.url)
    assert code == 0, err
    code, _, err = run(capsys, "queue", "limit", "other", "5", "--rate", "10/m", "--dsn", dsn.url)
    assert code == 0, err
    listing = client.get("/api/v1/queues").json()["queues"]
    cli = cli_queues(capsys, dsn)
    assert [q["name"] for q in listing] == [q["name"] for q in cli]
    for api, row in zip(listing, cli, strict=True):
        assert {k: v for k, v in api.items() if k != "paused_at"} == {
            k: v for k, v in row.items() if k != "paused_at"
        }
        assert same_moment(api["paused_at"], row["paused_at"])
    emails = client.get("/api/v1/queues/emails").json()
    assert emails["paused"] and emails["pause_reason"] == "deploy" and not emails["has_jobs"]
    other = client.get("/api/v1/queues/other").json()
    assert (other["concurrency"], other["rate"], other["paused"]) == (5, "10/m", False)


def test_limits_are_set_kept_and_cleared_as_the_cli_does(
    client: TestClient, capsys: pytest.CaptureFixture[str], dsn: Dsn
) -> None:
    response = client.patch(
        "/api/v1/queues/emails", json={"concurrency": 10, "rate": "100/s", "group_concurrency": 2}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["changed"] is True
    assert (body["concurrency"], body["rate"], body["group_concurrency"]) == (10, "100/s", 2)
    assert (body["rate_jobs"], body["rate_seconds"]) == (100, 1.0)

    # A field left out stays; null clears that limit alone.
    body = client.patch("/api/v1/queues/emails", json={"rate": None}).json()
    assert (body["concurrency"], body["rate"], body["group_concurrency"]) == (10, None, 2)
    body = client.patch("/api/v1/queues/emails", json={"group_concurrency": None}).json()
    assert (body["concurrency"], body["rate"], body["group_concurrency"]) == (10, None, None)
    # The same limits again: nothing changes, and the answer says so.
    assert (
        client.patch("/api/v1/queues/emails", json={"concurrency": 10}).json()["changed"] is False
    )

    (listed,) = [q for q in cli_queues(capsys, dsn) if q["name"] == "emails"]
    assert (listed["concurrency"], listed["rate"], listed["group_concurrency"]) == (10, None, None)
    # The CLI clears what the API set, and the API sees it.
    code, _, err = run(capsys, "queue", "limit", "emails", "none", "--dsn", dsn.url)
    assert code == 0, err
    assert client.get("/api/v1/queues/emails").json()["concurrency"] is None


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({}, "concurrency", "give a concurrency limit"),
        ({"concurrency": 0}, "concurrency", "concurrency"),
        ({"concurrency": 10**12}, "concurrency", "concurrency"),
        ({"group_concurrency": -1}, "group_concurrency", "group_concurrency"),
        ({"rate": "fast"}, "rate", "rate"),
        ({"rate": "0/s"}, "rate", "rate"),
    ],
)
def test_bad_limits_are_one_422_and_write_nothing(
    client: TestClient,
    conn: psycopg.Connection[Any],
    body: dict[str, Any],
    field: str,
    words: str,
) -> None:
    client.patch("/api/v1/queues/emails", json={"concurrency": 3})
    before = settings_rows(conn)
    response = client.patch("/api/v1/queues/emails", json=body)
    message = assert_error(response, 422, "invalid_value", field)
    assert words in message and "\n" not in message
    assert settings_rows(conn) == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"concurrency": "10"}, "concurrency"),  # strict: a number, not text
        ({"concurrency": True}, "concurrency"),
        ({"limit": 3}, "limit"),  # an unknown field is a typo of the client
        ({"rate": "1/s\x00"}, "rate"),
    ],
)
def test_mistyped_limits_are_validation_errors(
    client: TestClient, conn: psycopg.Connection[Any], body: dict[str, Any], field: str
) -> None:
    response = client.patch("/api/v1/queues/emails", json=body)
    assert_error(response, 422, "validation_error", field)
    assert settings_rows(conn) == []


def test_bad_names_and_reasons_are_refused_and_write_nothing(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    assert_error(client.post("/api/v1/queues/a%09b/pause"), 422, "invalid_value", "queue")
    assert_error(client.post("/api/v1/queues/%20x/pause"), 422, "invalid_value", "queue")
    assert_error(
        client.patch("/api/v1/queues/a%09b", json={"concurrency": 1}), 422, "invalid_value"
    )
    response = client.post("/api/v1/queues/emails/pause", json={"reason": "x" * 1001})
    assert_error(response, 422, "invalid_value", "reason")
    response = client.post("/api/v1/queues/emails/pause", json={"reason": "a\x00b"})
    assert_error(response, 422, "validation_error", "reason")
    assert settings_rows(conn) == []


def test_an_unknown_queue_is_404_until_it_has_jobs_settings_or_a_task(
    client: TestClient,
    make_web: Callable[..., FastAPI],
    make_app: Callable[..., App],
) -> None:
    message = assert_error(client.get("/api/v1/queues/emails"), 404, "queue_not_found", "name")
    assert "emails" in message
    make_app().enqueue("t", {}, queue="emails")
    assert client.get("/api/v1/queues/emails").json()["has_jobs"] is True

    # A queue the server's app declares a task on is known before its first job.
    app = make_app()

    @app.task(name="mail.send", queue="outbox")
    def send() -> None: ...

    with TestClient(make_web(app=app), headers=client.headers) as with_app:
        known = with_app.get("/api/v1/queues/outbox").json()
        assert (known["name"], known["has_jobs"], known["paused"]) == ("outbox", False, False)


def test_a_read_token_reads_and_is_refused_every_write(
    web: FastAPI, client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    client.patch("/api/v1/queues/emails", json={"concurrency": 3})
    before = settings_rows(conn)
    with TestClient(web, headers=READ_AUTH) as reader:
        assert reader.get("/api/v1/queues").status_code == 200
        assert reader.get("/api/v1/queues/emails").json()["concurrency"] == 3
        for response in (
            reader.post("/api/v1/queues/emails/pause"),
            reader.post("/api/v1/queues/emails/resume"),
            reader.patch("/api/v1/queues/emails", json={"concurrency": None}),
        ):
            assert_error(response, 403, "forbidden")
    with TestClient(web) as anonymous:
        assert_error(anonymous.post("/api/v1/queues/emails/pause"), 401, "unauthenticated")
        assert_error(anonymous.get("/api/v1/queues"), 401, "unauthenticated")
    assert settings_rows(conn) == before


def test_the_host_signed_in_user_is_recorded_as_who_paused(
    make_web: Callable[..., FastAPI],
) -> None:
    def sign_in(request: Any) -> Principal | None:
        role = request.headers.get("x-role")
        return None if role is None else Principal("carol@example.com", Role(role))

    web = make_web(tokens=None, read_only_tokens=None, auth=sign_in)
    with TestClient(web) as host:
        response = host.post("/api/v1/queues/emails/pause", headers={"x-role": "operate"})
        assert response.json()["paused_by"] == "carol@example.com", response.text
        refused = host.post("/api/v1/queues/emails/resume", headers={"x-role": "read"})
        assert_error(refused, 403, "forbidden")
        assert host.get("/api/v1/queues/emails", headers={"x-role": "read"}).json()["paused"]


def test_a_name_may_hold_a_slash(
    client: TestClient, capsys: pytest.CaptureFixture[str], dsn: Dsn
) -> None:
    response = client.post("/api/v1/queues/team%2Femails/pause")
    assert response.status_code == 200, response.text
    assert response.json()["name"] == "team/emails"
    assert client.get("/api/v1/queues/team/emails").json()["paused"] is True
    assert "team/emails" in [q["name"] for q in cli_queues(capsys, dsn) if q["paused"]]
    assert client.post("/api/v1/queues/team/emails/resume").json()["changed"] is True


def test_a_group_rate_is_set_shown_and_cleared_over_http(client: TestClient) -> None:
    response = client.patch("/api/v1/queues/tenants", json={"group_rate": "10/m"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["group_rate"], body["group_rate_jobs"], body["group_rate_seconds"]) == (
        "10/m",
        10,
        60.0,
    )
    cleared = client.patch("/api/v1/queues/tenants", json={"group_rate": None}).json()
    assert cleared["group_rate"] is None and cleared["group_rate_jobs"] is None
    assert client.patch("/api/v1/queues/tenants", json={"group_rate": "ten"}).status_code == 422
