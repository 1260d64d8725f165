"""Results over HTTP: a dependent's job JSON names its dependencies and carries their results
(within 1 MiB together), and ``GET /api/v1/batches/{id}/results`` pages a batch's members with
their outcomes and results by a cursor."""

from __future__ import annotations

from typing import Any

import pytest

from pgjobs import App, NonRetryableError
from pgjobs.testing import drain
from tests.web.conftest import READ_AUTH, TestClient, assert_error


@pytest.fixture
def app(make_app: Any) -> App:
    app: App = make_app()

    @app.task(name="shop.charge")
    def charge(order: int) -> dict[str, str]:
        return {"receipt": f"r-{order}"}

    @app.task(name="shop.big")
    def big(order: int) -> str:
        return "x" * 700_000

    @app.task(name="shop.ship")
    def ship(order: int) -> None: ...

    @app.task(name="rows.count", max_attempts=1)
    def count_rows(n: int) -> int:
        if n < 0:
            raise NonRetryableError("negative")
        return n

    return app


def test_a_dependents_json_names_its_dependencies_and_carries_their_results(
    app: App, client: TestClient
) -> None:
    charge = app.enqueue("shop.charge", {"order": 4})
    big = app.enqueue("shop.big", {"order": 4})
    bigger = app.enqueue("shop.big", {"order": 5})
    drain(app)
    ship = app.enqueue(
        "shop.ship", {"order": 4}, after={"charge": charge, "big": big, "more": bigger}
    )
    shown = client.get(f"/api/v1/jobs/{ship}", headers=READ_AUTH).json()
    after = {edge["id"]: edge for edge in shown["after"]}
    assert after[charge] == {
        "id": charge,
        "status": "succeeded",
        "name": "charge",
        "result": {"receipt": "r-4"},
        "result_omitted": False,
    }
    assert after[big]["name"] == "big" and len(after[big]["result"]) == 700_000
    # 700 KB twice passes 1 MiB: the second is left out, and says so.
    assert after[bigger]["result"] is None and after[bigger]["result_omitted"] is True
    dependents = client.get(f"/api/v1/jobs/{charge}", headers=READ_AUTH).json()["dependents"]
    assert dependents == [{"id": ship, "status": "ready", "name": "charge"}]


def test_a_batchs_members_results_are_paged_by_a_cursor(app: App, client: TestClient) -> None:
    with app.batch() as batch:
        for n in (1, -1, 2, 3, 4):
            batch.enqueue("rows.count", {"n": n})
    drain(app)
    seen: list[dict[str, Any]] = []
    after, pages = 0, 0
    while True:
        response = client.get(
            f"/api/v1/batches/{batch.id}/results",
            params={"after": after, "limit": 2},
            headers=READ_AUTH,
        )
        assert response.status_code == 200, response.text
        page = response.json()
        assert len(page["results"]) <= 2
        seen.extend(page["results"])
        pages += 1
        if page["next_after"] is None:
            break
        after = page["next_after"]
    assert pages == 3 and [m["id"] for m in seen] == batch.ids
    assert [m["result"] for m in seen] == [1, None, 2, 3, 4]
    dead = seen[1]
    assert (dead["status"], dead["reason"], dead["error_type"]) == (
        "dead",
        "non_retryable",
        "pgjobs.errors.NonRetryableError",
    )
    assert seen[0]["status"] == "succeeded" and seen[0]["task"] == "rows.count"


def test_an_unknown_batch_is_a_404_and_a_bad_cursor_a_422(client: TestClient) -> None:
    response = client.get("/api/v1/batches/999/results", headers=READ_AUTH)
    assert_error(response, 404, "batch_not_found")
    response = client.get("/api/v1/batches/1/results", params={"limit": 0}, headers=READ_AUTH)
    assert response.status_code == 422
    response = client.get("/api/v1/batches/1/results", params={"after": -1}, headers=READ_AUTH)
    assert response.status_code == 422


def test_after_names_its_dependencies_over_http(app: App, client: TestClient) -> None:
    charge = app.enqueue("shop.charge", {"order": 1})
    response = client.post(
        "/api/v1/jobs",
        json={"task": "shop.ship", "payload": {"order": 1}, "after": {"charge": charge}},
    )
    assert response.status_code == 201, response.text
    assert [(e["id"], e["name"]) for e in response.json()["after"]] == [(charge, "charge")]
    response = client.post(
        "/api/v1/jobs/batch",
        json={
            "jobs": [
                {"task": "shop.charge", "payload": {"order": 2}},
                {"task": "shop.ship", "payload": {"order": 2}, "after": {"charge": {"ref": 0}}},
            ]
        },
    )
    assert response.status_code == 201, response.text
    first, second = response.json()["jobs"]
    shown = client.get(f"/api/v1/jobs/{second['id']}", headers=READ_AUTH).json()
    assert [(e["id"], e["name"]) for e in shown["after"]] == [(first["id"], "charge")]
    response = client.post(
        "/api/v1/jobs",
        json={"task": "shop.ship", "payload": {"order": 3}, "after": {"a": charge, "b": charge}},
    )
    assert_error(response, 422, "invalid_value", "after")
