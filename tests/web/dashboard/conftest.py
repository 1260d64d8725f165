"""Fixtures of the dashboard's tests: the app of ``create_app`` (``tests/web/conftest.py``),
clients signed in through the login form, and the rows the pages show.

The browser tests (``test_browser.py``) drive Chromium from the OS packages through Playwright;
without ``/usr/bin/chromium`` (or Playwright) they are skipped with the reason, unless $CI is
set: CI installs Chromium (``.ci/run``), so there its absence is a failure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI

from tests.web.conftest import READ_TOKEN, TOKEN, TestClient

_CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


def csrf_of(html: str) -> str:
    """The CSRF token of the first form of a page."""
    found = _CSRF.search(html)
    assert found is not None, "no CSRF field on the page"
    return found.group(1)


def login(client: TestClient, token: str) -> None:
    """Sign ``client`` in through the login form, as a browser does."""
    page = client.get("/login")
    assert page.status_code == 200, page.text
    answer = client.post(
        "/login",
        data={"token": token, "csrf": csrf_of(page.text), "next": "/"},
        follow_redirects=False,
    )
    assert answer.status_code == 303, answer.text


@pytest.fixture
def signed_in(web: FastAPI) -> Iterator[TestClient]:
    """A browser-like client signed in with the full token (a session cookie, no header)."""
    with TestClient(web) as client:
        login(client, TOKEN)
        yield client


@pytest.fixture
def read_only(web: FastAPI) -> Iterator[TestClient]:
    """A browser-like client signed in with the read-only token."""
    with TestClient(web) as client:
        login(client, READ_TOKEN)
        yield client


@pytest.fixture
def visitor(web: FastAPI) -> Iterator[TestClient]:
    """A browser-like client that has not signed in."""
    with TestClient(web) as client:
        yield client


def ids(conn: psycopg.Connection[Any], table: str) -> set[int]:
    return {row[0] for row in conn.execute(f"SELECT id FROM {table}").fetchall()}


def status_of(conn: psycopg.Connection[Any], job_id: int) -> str | None:
    """Where a job is: 'queued', an archived status, 'dead', or None."""
    if conn.execute("SELECT 1 FROM queued_jobs WHERE id = %s", [job_id]).fetchone():
        return "queued"
    row = conn.execute("SELECT status FROM archived_jobs WHERE id = %s", [job_id]).fetchone()
    if row:
        return str(row[0])
    if conn.execute("SELECT 1 FROM dead_letter WHERE id = %s", [job_id]).fetchone():
        return "dead"
    return None


Bury = Callable[..., list[int]]
