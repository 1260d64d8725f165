"""POST /api/v1/jobs/{id}/events/{name}: an event for a workflow job, as ``app.send_event``;
a read-only token, an unknown or ended job and bad input are refused in the one error shape,
and write nothing."""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg

from pgjobs import App, WorkflowContext, events
from pgjobs.web.events_api import SentEvent
from tests.support.admin_factories import claim_one, succeed
from tests.support.external import run_worker_while
from tests.support.helpers import count, wait_until
from tests.web.conftest import READ_AUTH, TestClient, assert_error


def test_an_event_is_sent_and_kept(make_app: Any, client: TestClient, conn: Any) -> None:
    app: App = make_app()
    job = app.enqueue("orders.checkout", {"order": 7})
    response = client.post(f"/api/v1/jobs/{job}/events/shipped", json={"carrier": "ups"})
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["job_id"], body["name"], body["woke"]) == (job, "shipped", False)
    assert conn.execute("SELECT payload FROM pgjobs_events").fetchall() == [({"carrier": "ups"},)]
    # No body: a null payload.
    assert client.post(f"/api/v1/jobs/{job}/events/paid").status_code == 201


def test_refusals_write_nothing(
    make_app: Any, client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app()
    job = app.enqueue("orders.checkout", {"order": 7})
    assert_error(
        client.post(f"/api/v1/jobs/{job}/events/paid", headers=READ_AUTH), 403, "forbidden"
    )
    assert_error(client.post("/api/v1/jobs/99999/events/paid"), 404, "job_not_found")
    assert_error(
        client.post(f"/api/v1/jobs/{job}/events/paid", json="x" * 70_000), 422, "invalid_payload"
    )
    assert_error(client.post(f"/api/v1/jobs/{job}/events/%20paid"), 422, "invalid_value", "name")
    done = app.enqueue("orders.checkout", {"order": 8})
    conn.execute("UPDATE queued_jobs SET priority = 1 WHERE id = %s", [done])
    succeed(conn, claim_one(conn, done))
    assert_error(client.post(f"/api/v1/jobs/{done}/events/paid"), 409, "job_state_conflict")
    assert count(conn, "pgjobs_events") == 0


def test_the_response_model_has_the_domain_rows_fields() -> None:
    assert set(SentEvent.model_fields) == {f.name for f in dataclasses.fields(events.SentEvent)}


def test_the_job_json_holds_the_workflow(
    make_app: Any, client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app()

    @app.workflow(name="shop.track")
    def track(ctx: WorkflowContext) -> None:
        ctx.step("label", lambda: "1Z999")
        ctx.wait_for("shipped")

    @app.task(name="shop.other")
    def other() -> None: ...

    job_id = app.enqueue("shop.track", {})

    def suspended(_worker: Any) -> None:
        wait_until(
            lambda: conn.execute(
                "SELECT 1 FROM pgjobs_event_waits WHERE job_id = %s", [job_id]
            ).fetchone(),
            what="the workflow to wait for its event",
        )

    run_worker_while(app, suspended)
    shown = client.get(f"/api/v1/jobs/{job_id}").json()
    assert [(e["kind"], e["name"], e["status"]) for e in shown["workflow"]] == [
        ("step", "label", "done"),
        ("event", "shipped", "waiting"),
    ]
    assert shown["workflow"][0]["result"] == "1Z999"
    plain = app.enqueue("shop.other", {})
    assert client.get(f"/api/v1/jobs/{plain}").json()["workflow"] == []
