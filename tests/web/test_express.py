"""The express lane of ``POST /api/v1/jobs`` (``pgjobs.web.express``): a plain job with a full
token is answered before FastAPI routes the request, with the bytes the route would send; every
other request reaches the route with its body intact."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

from fastapi import FastAPI

from pgjobs.web.auth import Access
from pgjobs.web.backend import ACCESS_STATE
from pgjobs.web.express import ExpressEnqueue
from tests.web.conftest import READ_AUTH, TestClient


class Route:
    """What the lane passes on to: records each request and the body it receives."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        self.bodies.append(message["body"])
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def _post(web: FastAPI, body: Any, *, access: Access = Access.FULL, path: str = "/api/v1/jobs"):
    """POST ``body`` (JSON) straight to a lane on ``web``'s backend: (status, body, route)."""
    route = Route()
    lane = ExpressEnqueue(route, web.state.pgjobs)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": path, "root_path": ""}
    scope["state"] = {ACCESS_STATE: access}
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    asyncio.run(lane(scope, receive, send))
    return sent[0]["status"], sent[1]["body"], route


def test_a_plain_job_is_answered_by_the_lane_as_the_route_reads_it_back(
    web: FastAPI, client: TestClient
) -> None:
    job = {"task": "t", "payload": {"ünïcode": "✓", "n": 1.5}, "priority": 3, "delay": 60}

    status, body, route = _post(web, job)

    assert status == 201 and route.bodies == [], "answered by the lane"
    answer = json.loads(body)
    read = client.get(f"/api/v1/jobs/{answer['id']}")
    # The same bytes as FastAPI renders the same model for GET (nothing has changed since).
    assert body == read.content
    assert answer["status"] == "scheduled" and answer["payload"] == job["payload"]


def test_a_tagged_job_is_answered_by_the_lane_with_its_tags(web: FastAPI, client: TestClient):
    status, body, route = _post(web, {"task": "t", "payload": {}, "tags": ["a", "b"]})

    assert status == 201 and route.bodies == [], "answered by the lane"
    answer = json.loads(body)
    assert answer["tags"] == ["a", "b"]
    assert client.get(f"/api/v1/jobs/{answer['id']}").content == body


def test_through_the_server_a_plain_job_is_answered_as_read_back(client: TestClient) -> None:
    posted = client.post("/api/v1/jobs", json={"task": "t", "payload": {"v": [1, None, "x"]}})

    assert posted.status_code == 201
    assert posted.headers["content-type"] == "application/json"
    assert client.get(f"/api/v1/jobs/{posted.json()['id']}").content == posted.content


def test_anything_but_a_plain_job_with_a_full_token_goes_on_to_the_route(web: FastAPI) -> None:
    others: list[tuple[Any, dict[str, Any]]] = [
        ({"task": "t", "payload": {}, "idempotency_key": "k"}, {}),  # a key: 201 or 200
        ({"task": "t", "payload": {}, "priority": "high"}, {}),  # invalid: the route says why
        ({"task": "", "payload": {}}, {}),
        (b"{not json", {}),
        ({"task": "t", "payload": {}}, {"access": Access.READ_ONLY}),
        ({"task": "t", "payload": {}}, {"path": "/api/v1/jobs/batch"}),
    ]
    for body, options in others:
        status, _, route = _post(web, body, **options)
        sent = body if isinstance(body, bytes) else json.dumps(body).encode()
        assert (status, route.bodies) == (299, [sent]), (body, options)


def test_through_the_server_refusals_keep_the_routes_shape(client: TestClient) -> None:
    invalid = client.post("/api/v1/jobs", json={"task": "t", "payload": {}, "priority": "high"})
    read_only = client.post("/api/v1/jobs", json={"task": "t", "payload": {}}, headers=READ_AUTH)

    assert invalid.status_code == 422
    assert invalid.json()["error"]["field"] == "priority"
    assert read_only.status_code == 403
    assert read_only.json()["error"]["code"] == "forbidden"
