"""Every "in N seconds" (``run_in``, ``expires_in``, the CLI's ``--delay`` and ``--expires-in``,
the HTTP API's ``delay`` and ``expires_in``) is counted from the database's clock, never the
producer's: a producer whose clock is ten minutes behind stores the same times as one on time,
on every insert path (one job, many by INSERT and by COPY, sync and async, the caller's
connection, the CLI, the HTTP API)."""

from __future__ import annotations

import asyncio
import sys
import time
import warnings
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgjobs import App, JobSpec
from pgjobs.enqueue import COPY_MIN_ROWS
from tests.support.helpers import run

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # Starlette asks for httpx2 when it finds httpx
    from starlette.testclient import TestClient

BEHIND = timedelta(minutes=10)
EXPIRES_IN = 120.0
RUN_IN = 30.0

# Every module of an enqueue path that may read a clock reads this one, ten minutes late (the
# HTTP routes read none: they hand their fields to App.enqueue, and FastAPI reads their types).
_MODULES = (
    "pgjobs.enqueue",
    "pgjobs.submission",
    "pgjobs.app",
    "pgjobs.cli.enqueue",
    "pgjobs.cli.parse",
)


class _Late(datetime):
    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return datetime.now(tz) - BEHIND


class _LateTime:
    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def time() -> float:
        return time.time() - BEHIND.total_seconds()


@pytest.fixture
def clock_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """The producer's clock, as every enqueue module reads it, ten minutes behind."""
    for name in _MODULES:
        module = sys.modules.get(name) or __import__(name, fromlist=["_"])
        if getattr(module, "datetime", None) is datetime:
            monkeypatch.setattr(module, "datetime", _Late)
        if getattr(module, "time", None) is time:
            monkeypatch.setattr(module, "time", _LateTime())


def _assert_from_database_clock(conn: psycopg.Connection[Any], ids: list[int]) -> None:
    """Each job's expires_at and run_at are its insert's now() (its created_at) + the delays."""
    rows = conn.execute(
        "SELECT extract(epoch FROM expires_at - created_at)::float8,"
        " extract(epoch FROM run_at - created_at)::float8"
        " FROM queued_jobs WHERE id = ANY(%s)",
        (ids,),
    ).fetchall()
    assert len(rows) == len(ids)
    for expires, runs in rows:
        assert abs(expires - EXPIRES_IN) < 1, expires
        assert abs(runs - RUN_IN) < 1, runs


def _specs(n: int) -> Iterator[JobSpec]:
    for i in range(n):
        yield JobSpec("t.a", {"i": i}, run_in=RUN_IN, expires_in=EXPIRES_IN)


def _expiring_only(conn: psycopg.Connection[Any], ids: list[int]) -> None:
    (late,) = conn.execute(
        "SELECT count(*) FROM queued_jobs WHERE id = ANY(%s)"
        " AND abs(extract(epoch FROM expires_at - created_at) - %s) >= 1",
        (ids, EXPIRES_IN),
    ).fetchone() or (None,)
    assert late == 0


@pytest.mark.usefixtures("clock_behind")
@pytest.mark.parametrize("count", [1, 2, COPY_MIN_ROWS])
def test_python_enqueue_counts_from_the_database_clock(make_app, conn, count):
    app: App = make_app(check_task_names=False)
    if count == 1:
        ids = [app.enqueue("t.a", {}, run_in=RUN_IN, expires_in=EXPIRES_IN)]
        ids.append(app.enqueue("t.a", {}, expires_in=EXPIRES_IN))  # ready now, expiring
        _expiring_only(conn, ids[1:])
        ids = ids[:1]
    else:
        ids = app.enqueue_many(_specs(count))
    _assert_from_database_clock(conn, ids)


@pytest.mark.usefixtures("clock_behind")
@pytest.mark.parametrize("count", [1, 2, COPY_MIN_ROWS])
def test_on_the_callers_connection_too(make_app, dsn, conn, count):
    app: App = make_app(check_task_names=False)
    with psycopg.connect(dsn.url) as own:
        ids = app.enqueue_many(_specs(count), connection=own)
        ids.append(app.enqueue("t.a", {}, expires_in=EXPIRES_IN, run_in=RUN_IN, connection=own))
    _assert_from_database_clock(conn, ids)


@pytest.mark.usefixtures("clock_behind")
@pytest.mark.parametrize("count", [1, 2, COPY_MIN_ROWS])
def test_async_enqueue_counts_from_the_database_clock(make_app, dsn, conn, count):
    app: App = make_app(check_task_names=False)

    async def enqueue() -> list[int]:
        async with app:
            if count == 1:
                ids = [await app.enqueue_async("t.a", {}, run_in=RUN_IN, expires_in=EXPIRES_IN)]
            else:
                ids = await app.enqueue_many_async(_specs(count))
            async with await psycopg.AsyncConnection.connect(dsn.url) as own:
                ids += await app.enqueue_many_async(_specs(count), connection=own)
            return ids

    _assert_from_database_clock(conn, asyncio.run(enqueue()))


@pytest.mark.usefixtures("clock_behind", "no_dsn_in_env")
def test_the_cli_counts_from_the_database_clock(capsys, dsn, conn):
    code, out, err = run(
        capsys,
        "enqueue",
        "t.a",
        "--delay",
        str(RUN_IN),
        "--expires-in",
        str(EXPIRES_IN),
        "--dsn",
        dsn.url,
    )
    assert code == 0, err
    _assert_from_database_clock(conn, [int(out)])


@pytest.mark.usefixtures("clock_behind")
def test_the_http_api_counts_from_the_database_clock(dsn, conn):
    from pgjobs.web import create_app

    token = "clock-token-0123456789abcdef"
    web = create_app(dsn=dsn, tokens=[token], pool_size=2)
    job = {"task": "t.a", "delay": RUN_IN, "expires_in": EXPIRES_IN}
    with TestClient(web, headers={"Authorization": f"Bearer {token}"}) as client:
        one = client.post("/api/v1/jobs", json=job)
        many = client.post("/api/v1/jobs/batch", json={"jobs": [job, job]})
    assert one.status_code == 201, one.text
    assert many.status_code == 201, many.text
    ids = [one.json()["id"]] + [j["id"] for j in many.json()["jobs"]]
    _assert_from_database_clock(conn, ids)
