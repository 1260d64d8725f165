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


class DeadTriggers:
    """Row triggers on ``dead_letter`` that fire when one chosen job is deleted (redriven or
    purged), so that a test can stop a bulk action inside a given batch: ``fail_at`` makes that
    batch's transaction fail; ``hold_at`` makes it wait for ``release`` (an advisory lock the
    test's connection holds), which keeps the action running for as long as the test looks."""

    _LOCK_KEY = 7_301_013

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._names: list[str] = []
        self._held = False

    def _install(self, job_id: int, body: str) -> None:
        name = f"pgjobs_test_dead_trigger_{len(self._names)}"
        self._conn.execute(
            f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql "
            f"AS $$ BEGIN {body}; RETURN OLD; END $$"
        )
        self._conn.execute(f"DROP TRIGGER IF EXISTS {name} ON dead_letter")
        self._conn.execute(
            f"CREATE TRIGGER {name} BEFORE DELETE ON dead_letter FOR EACH ROW "
            f"WHEN (OLD.id = {int(job_id)}) EXECUTE FUNCTION {name}()"
        )
        self._names.append(name)

    def fail_at(self, job_id: int, message: str) -> None:
        """The batch that deletes ``job_id`` fails with ``message``."""
        self._install(job_id, f"RAISE EXCEPTION '{message}'")

    def hold_at(self, job_id: int) -> None:
        """The batch that deletes ``job_id`` waits until ``release``."""
        self._conn.execute("SELECT pg_advisory_lock(%s)", [self._LOCK_KEY])
        self._held = True
        self._install(job_id, f"PERFORM pg_advisory_xact_lock_shared({self._LOCK_KEY})")

    def release(self) -> None:
        if self._held:
            self._conn.execute("SELECT pg_advisory_unlock(%s)", [self._LOCK_KEY])
            self._held = False

    def remove(self) -> None:
        # Released first: a batch waiting on the lock holds dead_letter's row locks.
        self.release()
        for name in self._names:
            self._conn.execute(f"DROP TRIGGER IF EXISTS {name} ON dead_letter")
            self._conn.execute(f"DROP FUNCTION IF EXISTS {name}()")
        self._names.clear()


@pytest.fixture
def dead_triggers(conn: psycopg.Connection[Any]) -> Iterator[DeadTriggers]:
    triggers = DeadTriggers(conn)
    try:
        yield triggers
    finally:
        triggers.remove()
