"""One-job ``POST /api/v1/jobs`` requests that arrive together go in as one statement and one
commit (``pgjobs.web.enqueuing``): each request still gets 201 and its own job, answered from
the inserted row exactly as a later ``GET`` reads it, and a job the database refuses fails its own
request only.

To make the requests meet for sure, the first statement is held back until every other request
has boarded the next flight (``hold_first``); nothing here depends on timing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from fastapi import FastAPI

from tests.web.conftest import AUTH, TestClient

CALLERS = 8


async def _post_together(web: FastAPI, payloads: list[dict[str, Any]]) -> list[httpx.Response]:
    """POST each payload at once, the first request's statement held until the others wait for
    the next flight; asserts that they went as one statement after the first."""
    transport = httpx.ASGITransport(app=web)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=AUTH) as http:
        warm = await http.post("/api/v1/jobs", json={"task": "t", "payload": {"warm": True}})
        assert warm.status_code == 201, warm.text
        coalescer = web.state.pgjobs.enqueuer._coalescer
        assert coalescer is not None, "made by the first request, on this loop"
        send, sent = coalescer._send, []

        async def held(rows: list[Any]) -> list[Any]:
            sent.append(len(rows))
            deadline = time.monotonic() + 30
            while len(sent) == 1 and len(coalescer._next) < len(payloads) - 1:
                assert time.monotonic() < deadline, "the other requests never boarded"
                await asyncio.sleep(0.005)
            inserted: list[Any] = await send(rows)
            return inserted

        coalescer._send = held
        responses = await asyncio.gather(
            *(http.post("/api/v1/jobs", json={"task": "t", "payload": p}) for p in payloads)
        )
        assert sent[:2] == [1, len(payloads) - 1], sent
        return list(responses)


def test_requests_meeting_share_one_statement_each_answered_from_its_row(
    web: FastAPI, client: TestClient
) -> None:
    payloads = [{"caller": n} for n in range(CALLERS)]

    responses = asyncio.run(_post_together(web, payloads))

    assert [r.status_code for r in responses] == [201] * CALLERS
    jobs = [r.json() for r in responses]
    assert [job["payload"] for job in jobs] == payloads
    assert len({job["id"] for job in jobs}) == CALLERS
    for job in jobs:
        assert client.get(f"/api/v1/jobs/{job['id']}").json() == job, "as read back"


def test_a_job_the_database_refuses_fails_only_its_request(
    web: FastAPI, client: TestClient, refusing: None
) -> None:
    payloads = [{"caller": n} for n in range(CALLERS)]
    payloads[3] = {"refused": True}
    alone = client.post("/api/v1/jobs", json={"task": "t", "payload": {"refused": True}})

    responses = asyncio.run(_post_together(web, payloads))

    refused = responses[3]
    assert refused.status_code == alone.status_code >= 400
    # The same error as alone (its message names the failing row, whose id and times differ).
    assert refused.json()["error"]["code"] == alone.json()["error"]["code"] == "query_failed"
    others = [r for n, r in enumerate(responses) if n != 3]
    assert [r.status_code for r in others] == [201] * (CALLERS - 1)
    assert [r.json()["payload"] for r in others] == [p for n, p in enumerate(payloads) if n != 3]


def test_a_batch_of_plain_jobs_is_answered_as_read_back(client: TestClient) -> None:
    jobs = [{"task": "t", "payload": {"n": n}, "priority": n, "delay": 60 * n} for n in range(3)]

    answered = client.post("/api/v1/jobs/batch", json={"jobs": jobs}).json()["jobs"]

    assert [job["status"] for job in answered] == ["ready", "scheduled", "scheduled"]
    for job in answered:
        read = client.get(f"/api/v1/jobs/{job['id']}").json()
        # A batch's answer does not read dependencies, edits nor a workflow's history (null); GET
        # does.
        assert read | {"after": None, "dependents": None, "edits": None, "workflow": None} == job
