"""GET /api/v1/batches/{id}: a batch's counts, its callback and its members by status, as
`pgjobs batch show --json`; an unknown id is a 404 in the API's one error shape."""

from __future__ import annotations

from typing import Any

import pytest

from pgjobs import App
from tests.support.factories import work
from tests.web.conftest import READ_AUTH, TestClient, assert_error


@pytest.fixture
def app(make_app: Any) -> App:
    app: App = make_app()

    @app.task(name="reports.render")
    def render(page: int) -> None: ...

    @app.task(name="reports.summarise")
    def summarise(report: int, batch: dict[str, int]) -> None: ...

    return app


def test_a_batch_is_shown_with_its_counts_callback_and_members(app: App, client: TestClient):
    with app.batch(on_complete=("reports.summarise", {"report": 7})) as batch:
        batch.enqueue("reports.render", {"page": 1})
        batch.enqueue("reports.render", {"page": 2}, queue="later")  # no worker serves it
    work(app, queues=["default"])
    response = client.get(f"/api/v1/batches/{batch.id}", headers=READ_AUTH)
    assert response.status_code == 200, response.text
    shown = response.json()
    assert {k: shown[k] for k in ("id", "total", "pending", "succeeded", "dead", "cancelled")} == {
        "id": batch.id,
        "total": 2,
        "pending": 1,
        "succeeded": 1,
        "dead": 0,
        "cancelled": 0,
    }
    assert shown["members"] == {"succeeded": 1, "ready": 1}
    assert (shown["callback_task"], shown["callback_queue"]) == ("reports.summarise", "default")
    assert shown["callback_job_id"] is None and shown["completed_at"] is None

    app.cancel(batch.ids[1])
    shown = client.get(f"/api/v1/batches/{batch.id}").json()
    assert shown["pending"] == 0 and shown["cancelled"] == 1
    callback = client.get(f"/api/v1/jobs/{shown['callback_job_id']}").json()
    assert callback["task"] == "reports.summarise"
    assert callback["payload"]["batch"] == {
        "id": batch.id,
        "total": 2,
        "succeeded": 1,
        "dead": 0,
        "cancelled": 1,
    }


def test_an_unknown_batch_is_a_404_and_a_bad_id_a_422(client: TestClient):
    message = assert_error(client.get("/api/v1/batches/424242"), 404, "batch_not_found")
    assert "no batch 424242" in message
    for bad in ("0", "-3", str(2**63), "seven"):
        assert_error(client.get(f"/api/v1/batches/{bad}"), 422, "validation_error")
