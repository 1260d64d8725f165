"""Schedule actions over HTTP (``/api/v1/schedules``): list, pause, resume, run now and forget do
what `pgjobs schedule` does, through the same operations: a pause over HTTP is what the CLI
lists and what the scheduler obeys; run now enqueues the declaration's job from the API and the
CLI alike; an unknown name is 404, a read token 403, and neither writes anything."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI

from pgjobs import App
from pgjobs.db.dsn import Dsn
from pgjobs.maintenance.scheduler import Scheduled
from tests.integration.maintenance.test_periodic import (
    move_back,
    no_schedules,
    schedule_row,
    scheduler,
)
from tests.support.factories import run_service
from tests.support.helpers import assert_one_line_error, run
from tests.web import schedule_app
from tests.web.conftest import AUTH, READ_AUTH, TestClient, assert_error

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")
__all__ = ["no_schedules"]  # its autouse fixture empties pgjobs_schedules around each test

APP = "tests.web.schedule_app:app"
NAME = "reports.hourly"


@pytest.fixture
def declared(dsn: Dsn) -> None:
    """The schedule recorded as a worker's scheduler records it."""
    run_service(dsn, scheduler(schedule_app.app))


@pytest.fixture
def with_app(make_web: Callable[..., FastAPI]) -> Any:
    """A client of a server given the app that declares the schedule (`pgjobs serve --app`)."""
    with TestClient(make_web(app=schedule_app.app), headers=AUTH) as client:
        yield client


def builds(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """The schedule's jobs, wherever they are."""
    return conn.execute(
        "SELECT id, queue, payload, priority, max_attempts, run_at, idempotency_key "
        "FROM queued_jobs WHERE task = 'reports.build' ORDER BY id"
    ).fetchall()


@pytest.fixture(autouse=True)
def no_builds(dsn: Dsn) -> Any:
    yield
    with psycopg.connect(dsn.url, autocommit=True) as conn:
        conn.execute("DELETE FROM queued_jobs WHERE task = 'reports.build'")


def moments_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two schedules' JSON equal, their times compared as instants (+00:00 or Z)."""
    if set(a) != set(b):
        return False
    for key, value in a.items():
        other = b[key]
        if isinstance(value, str) and key.endswith("_at") and isinstance(other, str):
            if datetime.fromisoformat(value) != datetime.fromisoformat(other):
                return False
        elif value != other:
            return False
    return True


@pytest.mark.usefixtures("declared")
def test_a_pause_over_http_is_what_the_cli_lists_and_the_scheduler_obeys(
    client: TestClient,
    conn: psycopg.Connection[Any],
    capsys: pytest.CaptureFixture[str],
    dsn: Dsn,
) -> None:
    listing = client.get("/api/v1/schedules").json()["schedules"]
    code, out, _ = run(capsys, "schedule", "--json", "--dsn", dsn.url)
    assert code == 0
    (from_cli,) = json.loads(out)
    (listed,) = listing
    assert moments_equal(listed, from_cli)
    assert (listed["task"], listed["queue"], listed["declared"]) == (
        "reports.build",
        "reports",
        True,
    )

    response = client.post(f"/api/v1/schedules/{NAME}/pause", json={"reason": "freeze"})
    assert response.status_code == 200, response.text
    change = response.json()
    assert (
        change["changed"] is True and change["schedule"]["paused_by"] == "api (testclient): freeze"
    )
    code, out, _ = run(capsys, "schedule", "--json", "--dsn", dsn.url)
    (from_cli,) = json.loads(out)
    assert from_cli["paused_by"] == "api (testclient): freeze"
    assert moments_equal(client.get(f"/api/v1/schedules/{NAME}").json(), from_cli)

    # Two hours missed while paused: the scheduler enqueues nothing.
    move_back(conn, NAME, timedelta(hours=2))
    assert run_service(dsn, scheduler(schedule_app.app)) == Scheduled(0, 0)
    assert client.post(f"/api/v1/schedules/{NAME}/pause").json()["changed"] is False

    resumed = client.post(f"/api/v1/schedules/{NAME}/resume").json()
    assert resumed["changed"] is True and resumed["schedule"]["paused_at"] is None
    assert client.post(f"/api/v1/schedules/{NAME}/resume").json()["changed"] is False
    # catch_up="last": the latest missed occurrence runs once resumed.
    assert run_service(dsn, scheduler(schedule_app.app)) == Scheduled(1, 1)


@pytest.mark.usefixtures("declared")
def test_run_now_enqueues_the_declared_job_from_the_api_and_the_cli_alike(
    with_app: TestClient,
    conn: psycopg.Connection[Any],
    capsys: pytest.CaptureFixture[str],
    dsn: Dsn,
) -> None:
    before = schedule_row(conn, NAME)
    with_app.post(f"/api/v1/schedules/{NAME}/pause")  # a paused schedule may be run by hand
    response = with_app.post(f"/api/v1/schedules/{NAME}/run")
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["name"] == NAME and body["schedule"]["name"] == NAME
    assert body["job"]["id"] == body["job_id"] and body["job"]["status"] == "ready"

    code, out, err = run(capsys, "schedule", "run", NAME, "--app", APP, "--json", "--dsn", dsn.url)
    assert code == 0, err
    from_cli = json.loads(out)
    assert from_cli["name"] == NAME and from_cli["job_id"] > body["job_id"]
    code, out, err = run(capsys, "schedule", "run", NAME, "--app", APP, "--dsn", dsn.url)
    assert code == 0 and out.startswith(f"schedule {NAME} run now: job "), err

    found = builds(conn)
    assert [row[0] for row in found[:2]] == [body["job_id"], from_cli["job_id"]]
    assert len(found) == 3
    for _, queue, payload, priority, max_attempts, run_at, key in found:
        assert (queue, payload, priority, max_attempts, key) == (
            "reports",
            {"kind": "sales"},
            3,
            2,
            None,
        )
        assert run_at <= datetime.now().astimezone()  # ready now, not at the next occurrence
    after = schedule_row(conn, NAME)
    # Outside the cadence: the next occurrence and the last run stay; the pause stays.
    assert after["next_run_at"] == before["next_run_at"]
    assert after["last_job_id"] == before["last_job_id"] and after["paused_at"] is not None


@pytest.mark.usefixtures("declared")
def test_run_now_without_the_declaring_app_is_refused_and_enqueues_nothing(
    client: TestClient,
    conn: psycopg.Connection[Any],
    capsys: pytest.CaptureFixture[str],
    dsn: Dsn,
) -> None:
    message = assert_error(
        client.post(f"/api/v1/schedules/{NAME}/run"), 409, "schedule_not_declared", "name"
    )
    assert "--app" in message
    code, _, err = run(capsys, "schedule", "run", NAME, "--dsn", dsn.url)
    assert code == 2
    assert_one_line_error(code, err, "--app")
    assert builds(conn) == []


def test_unknown_schedules_are_404_and_write_nothing(
    client: TestClient,
    with_app: TestClient,
    conn: psycopg.Connection[Any],
    capsys: pytest.CaptureFixture[str],
    dsn: Dsn,
) -> None:
    for response in (
        client.get("/api/v1/schedules/nope"),
        client.post("/api/v1/schedules/nope/pause", json={"reason": "x"}),
        client.post("/api/v1/schedules/nope/resume"),
        client.post("/api/v1/schedules/nope/run"),
        client.delete("/api/v1/schedules/nope"),
    ):
        message = assert_error(response, 404, "schedule_not_found", "name")
        assert "no schedule named 'nope'" in message
    assert_error(with_app.post("/api/v1/schedules/nope/run"), 404, "schedule_not_found")
    assert_error(client.post("/api/v1/schedules/a%09b/pause"), 422, "invalid_value", "name")
    assert client.get("/api/v1/schedules").json() == {"schedules": []}
    # The CLI says the same, in one line and exit 2.
    for argv in (("run", "nope", "--app", APP), ("pause", "nope")):
        code, _, err = run(capsys, "schedule", *argv, "--dsn", dsn.url)
        assert_one_line_error(code, err, "no schedule named 'nope'")
        assert code == 2
    assert builds(conn) == []
    assert conn.execute("SELECT count(*) FROM pgjobs_schedules").fetchone() == (0,)


@pytest.mark.usefixtures("declared")
def test_a_read_token_reads_and_is_refused_every_write(
    web: FastAPI, conn: psycopg.Connection[Any]
) -> None:
    before = schedule_row(conn, NAME)
    with TestClient(web, headers=READ_AUTH) as reader:
        assert [s["name"] for s in reader.get("/api/v1/schedules").json()["schedules"]] == [NAME]
        assert reader.get(f"/api/v1/schedules/{NAME}").status_code == 200
        for response in (
            reader.post(f"/api/v1/schedules/{NAME}/pause"),
            reader.post(f"/api/v1/schedules/{NAME}/resume"),
            reader.post(f"/api/v1/schedules/{NAME}/run"),
            reader.delete(f"/api/v1/schedules/{NAME}"),
        ):
            assert_error(response, 403, "forbidden")
    assert schedule_row(conn, NAME) == before
    assert builds(conn) == []


@pytest.mark.usefixtures("declared")
def test_forget_deletes_the_row_as_the_cli_does(
    client: TestClient,
    conn: psycopg.Connection[Any],
    capsys: pytest.CaptureFixture[str],
    dsn: Dsn,
) -> None:
    response = client.delete(f"/api/v1/schedules/{NAME}")
    assert response.status_code == 204 and response.content == b""
    assert client.get("/api/v1/schedules").json() == {"schedules": []}
    assert_error(client.delete(f"/api/v1/schedules/{NAME}"), 404, "schedule_not_found")
    code, _, err = run(capsys, "schedule", "--forget", NAME, "--dsn", dsn.url)
    assert_one_line_error(code, err, f"no schedule named '{NAME}'")
    # A worker that still declares it records it again.
    run_service(dsn, scheduler(schedule_app.app))
    code, out, _ = run(capsys, "schedule", "--forget", NAME, "--dsn", dsn.url)
    assert (code, out.strip()) == (0, f"schedule {NAME} forgotten")


def test_app_run_schedule_is_the_same_operation(
    make_app: Callable[..., App], conn: psycopg.Connection[Any]
) -> None:
    app = make_app()

    @app.periodic("0 * * * *", name=NAME, payload={"kind": "sales"}, priority=3, max_attempts=2)
    @app.task(name="reports.build", queue="reports")
    def build(kind: str) -> None: ...

    run = app.run_schedule(NAME)
    assert run.schedule is None  # no worker recorded it yet: the declaration is enough
    ((job_id, queue, payload, priority, max_attempts, _, _),) = builds(conn)
    assert (job_id, queue, payload, priority, max_attempts) == (
        run.job_id,
        "reports",
        {"kind": "sales"},
        3,
        2,
    )
