"""Queue names holding characters that URLs reserve (``/``, ``?``, ``#``, ``%``, spaces, text
beyond ASCII): each queue is opened, paused and resumed from the dashboard through the links its
pages build, and reached through the API."""

from __future__ import annotations

import html
import re
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from pgjobs import queues
from tests.web.conftest import AUTH, TestClient
from tests.web.dashboard.conftest import csrf_of

NAMES = ("a/b", "a/b/pause", "x?y=1", "x#y", "50%", "two words", "ünï/cödé", "a//b", "q/")


def _link_to(page: str, name: str) -> str:
    """The href of the overview's link to the queue ``name``."""
    for href, text in re.findall(r'<a href="([^"]*/queues/[^"]*)">([^<]*)</a>', page):
        if html.unescape(text) == name:
            return html.unescape(href)
    raise AssertionError(f"no link to queue {name!r} on the page")


@pytest.mark.parametrize("name", NAMES)
def test_a_queue_with_reserved_characters_is_opened_and_paused_from_the_dashboard(
    signed_in: TestClient, conn: psycopg.Connection[Any], name: str
) -> None:
    created = signed_in.post("/api/v1/jobs", json={"task": "t", "queue": name}, headers=AUTH)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]

    page = signed_in.get(_link_to(signed_in.get("/").text, name))
    assert page.status_code == 200, page.text
    assert f">#{job_id}</a>" in page.text
    paused = signed_in.post(
        f"/queues/{quote(name, safe='')}/pause", data={"csrf": csrf_of(page.text), "reason": "r"}
    )
    assert paused.status_code == 200, paused.text
    assert html.escape(f"Queue {name} paused", quote=False) in paused.text
    assert queues.queue(conn, name).paused
    resumed = signed_in.post(
        f"/queues/{quote(name, safe='')}/resume", data={"csrf": csrf_of(paused.text)}
    )
    assert resumed.status_code == 200, resumed.text
    assert not queues.queue(conn, name).paused

    listed = signed_in.get("/api/v1/jobs", params={"queue": name}, headers=AUTH)
    assert [job["id"] for job in listed.json()["jobs"]] == [job_id]


@pytest.mark.parametrize("key", NAMES)
def test_a_key_with_reserved_characters_is_one_job(client: TestClient, key: str) -> None:
    path = f"/api/v1/jobs/{quote(key, safe='')}"
    first = client.put(path, json={"task": "t", "payload": {"n": 1}})
    assert first.status_code == 201, first.text
    assert first.json()["idempotency_key"] == key
    again = client.put(path, json={"task": "t", "payload": {"n": 2}})
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]


@pytest.mark.parametrize("key", ["line\n", "two\nlines"])
def test_a_key_with_a_newline_is_refused_not_cut(client: TestClient, key: str) -> None:
    # Starlette's own path patterns end at a newline: the key must neither be cut there (one
    # job for "line" and "line\n") nor stored, since a newline cannot be seen.
    response = client.put(f"/api/v1/jobs/{quote(key, safe='')}", json={"task": "t"})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "idempotency_key"
    assert client.get("/api/v1/jobs", params={"task": "t"}).json()["jobs"] == []
