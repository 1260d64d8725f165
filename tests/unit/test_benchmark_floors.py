"""The floors of the HTTP API's benchmark rows (``benchmarks.floors``) answer what the rows'
clients send them: the ceiling does no work and answers 201, the stack validates the body with
its model as a pgjobs route does. Served in process here; ``make bench`` runs them on uvicorn."""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    # Starlette asks for its httpx fork (httpx2) when it finds httpx; the client works the same.
    warnings.simplefilter("ignore", UserWarning)
    from starlette.testclient import TestClient

from benchmarks import floors

JOB = {"task": "bench.noop", "payload": {"n": 1}}


def test_the_ceiling_answers_a_post_with_201_and_a_job_sized_body():
    with TestClient(floors.nothing) as client:
        answer = client.post("/api/v1/jobs", json=JOB)
        assert answer.status_code == 201
        assert answer.json()["task"] == "bench.noop"
        assert client.get("/readyz").status_code == 200


def test_the_stack_validates_the_body_with_its_model():
    with TestClient(floors.stack) as client:
        answer = client.post("/api/v1/jobs", json=JOB)
        assert answer.status_code == 201
        assert answer.json() == JOB
        assert client.post("/api/v1/jobs", json={"payload": {}}).status_code == 422
        assert client.get("/readyz").status_code == 200


def test_both_are_served_on_uvicorn_with_h11_and_asyncio_as_pgjobs_serve_is():
    command = floors.command("stack", 8123)
    assert command[1:4] == ["-m", "uvicorn", "benchmarks.floors:stack"]
    assert command[command.index("--http") + 1] == "h11"
    assert command[command.index("--loop") + 1] == "asyncio"
    assert command[command.index("--port") + 1] == "8123"
