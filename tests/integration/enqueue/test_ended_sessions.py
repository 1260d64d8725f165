"""An enqueue right after the server ended the pool's sessions (``pg_terminate_backend``, a
restart) goes in, once, on a fresh connection, even when the server's farewell arrives only
after the statement left; and psycopg_pool's lines about the connections it drops stay quiet.

A session that closes without its farewell (libpq then reads no message, only the closed socket)
cannot be told from one lost after its commit: that enqueue fails (``DatabaseUnavailable``)
rather than risk a second job. It is rare (none in hundreds of tries on a quiet machine, a few
in a loaded run of the suite): these tests check that each failure is of that kind and that
nothing was put in twice."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest

from pgjobs import App, DatabaseUnavailable, JobSpec
from tests.support.helpers import assert_one_home, count

TERMINATE_POOL = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
    " WHERE datname = current_database() AND application_name = 'pgjobs'"
    " AND pid <> pg_backend_pid()"
)


def _terminate_pool(admin: psycopg.Connection[Any]) -> int:
    """End the sessions of the app's pool (after a failed enqueue, its next may not be open
    yet); how many were ended."""
    row = admin.execute(TERMINATE_POOL).fetchone()
    return int(row[0]) if row else 0


def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    loud = [r for r in caplog.records if r.name.startswith("psycopg") and r.levelno >= logging.INFO]
    assert not [r.getMessage() for r in loud if "discarding" in r.getMessage()]


def _enqueue(app: App, ids: list[int], failures: list[str], *specs: JobSpec) -> None:
    try:
        if len(specs) == 1:
            ids.append(app.enqueue(specs[0].task, specs[0].payload))
        else:
            ids.extend(app.enqueue_many(specs))
    except DatabaseUnavailable as exc:
        failures.append(str(exc))


def _check(failures: list[str]) -> None:
    # A farewell (57P01) is always retried. What may remain is a session closed with no
    # farewell read: the statement reached a socket its backend had already closed, and libpq
    # saw only the closed connection (more often when the machine is loaded). Such an enqueue
    # cannot be told from one lost after its commit, so it fails rather than risk a second job.
    assert not [f for f in failures if "administrator command" in f], failures
    assert all("closed the connection" in f for f in failures), failures


def test_an_enqueue_right_after_the_pool_sessions_were_ended_goes_in_once(
    make_app: Any, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    app: App = make_app(check_task_names=False, pool_size=4)
    ids = [app.enqueue("t.a", {"n": -1})]
    failures: list[str] = []
    ended = 0
    with (
        psycopg.connect(conn.info.dsn, autocommit=True) as admin,
        caplog.at_level(logging.DEBUG, logger="psycopg.pool"),
    ):
        for n in range(50):
            ended += _terminate_pool(admin)
            _enqueue(app, ids, failures, JobSpec("t.a", {"n": n}))
            if n % 10 == 0:  # a batch takes the general statement
                ended += _terminate_pool(admin)
                _enqueue(app, ids, failures, JobSpec("t.a", {"n": n}), JobSpec("t.a", {"m": n}))
    assert ended >= 50
    _check(failures)
    assert len(set(ids)) == len(ids) == count(conn, "queued_jobs")
    assert_one_home(conn, ids)
    _quiet(caplog)


def test_an_async_enqueue_right_after_the_pool_sessions_were_ended_goes_in_once(
    make_app: Any, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    app: App = make_app(check_task_names=False, pool_size=4)
    failures: list[str] = []
    ended: list[int] = []

    async def scenario() -> list[int]:
        ids = [await app.enqueue_async("t.a", {"n": -1})]
        with psycopg.connect(conn.info.dsn, autocommit=True) as admin:
            for n in range(30):
                ended.append(_terminate_pool(admin))
                try:
                    ids.append(await app.enqueue_async("t.a", {"n": n}))
                except DatabaseUnavailable as exc:
                    failures.append(str(exc))
        await app.aclose()
        return ids

    with caplog.at_level(logging.DEBUG, logger="psycopg.pool"):
        ids = asyncio.run(scenario())
    assert sum(ended) >= 30
    _check(failures)
    assert len(set(ids)) == len(ids) == count(conn, "queued_jobs")
    _quiet(caplog)
