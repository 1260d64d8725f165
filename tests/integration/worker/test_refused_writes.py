"""A database that refuses every write (read-only, as after a failover to a standby): the worker
backs off and logs the refusal a few times, not thousands, and works again as soon as the
database takes writes; a refused claim is called a refused claim."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgjobs import App
from pgjobs.completer import Claimed, ClaimParams, Completer
from pgjobs.db.dsn import Dsn
from pgjobs.worker import Worker
from tests.support.external import run_worker_while
from tests.support.factories import declared_task
from tests.support.helpers import assert_one_home, wait_until
from tests.support.urls import url_with


@pytest.fixture
def read_only_role(dsn: Dsn) -> Iterator[str]:
    """A role whose sessions are read-only (``default_transaction_read_only``); dropped after."""
    role = f"pgjobs_ro_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn.url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN SUPERUSER")
        admin.execute(f"ALTER ROLE {role} SET default_transaction_read_only = on")
    yield role
    with psycopg.connect(dsn.url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
        )
        wait_until(
            lambda: (
                not admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE usename = %s", [role]
                ).fetchone()
            ),
            timeout=10,
            what="the role's sessions to end",
        )
        admin.execute(f"DROP ROLE {role}")


def _errors(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.levelno >= logging.ERROR]


def test_a_read_only_database_is_backed_off_from_and_work_resumes_once_it_takes_writes(
    make_app: Any,
    dsn: Dsn,
    read_only_role: str,
    conn: psycopg.Connection[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer: App = make_app()
    app = App(url_with(dsn.url, user=read_only_role))
    done: list[int] = []

    @app.task(name="t.ok")
    def ok(n: int) -> None:
        done.append(n)

    producer.task(name="t.ok")(ok)
    seen: list[str] = []

    def scenario(worker: Worker) -> None:
        time.sleep(3)  # the window in which the refusals are counted
        seen.extend(_errors(caplog.records))
        with psycopg.connect(dsn.url, autocommit=True) as admin:
            admin.execute(f"ALTER ROLE {read_only_role} RESET default_transaction_read_only")
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                [read_only_role],
            )
        job = producer.enqueue("t.ok", {"n": 1})
        wait_until(lambda: done == [1], timeout=30, what="the job to run")
        wait_until(
            lambda: conn.execute("SELECT 1 FROM archived_jobs WHERE id = %s", [job]).fetchone(),
            timeout=30,
            what="the job archived",
        )
        assert_one_home(conn, [job])

    try:
        with caplog.at_level(logging.INFO, logger="pgjobs"):
            _, code = run_worker_while(app, scenario, concurrency=4)
    finally:
        app.close()
    assert code == 0
    assert len(seen) < 20, f"{len(seen)} ERROR lines in 3s: {seen[:5]}"
    refusals = [m for m in seen if "read-only transaction" in m]
    assert refusals, seen  # the refusal is said, and says what was refused
    assert all(m.startswith("claim refused by the database") for m in refusals), refusals
    assert not any("lease extension" in m for m in seen), seen


def test_a_refused_claim_is_not_called_a_refused_lease_extension(
    dsn: Dsn, read_only_role: str, caplog: pytest.LogCaptureFixture
) -> None:
    completer = Completer(ClaimParams("w", ["default"]))
    url = url_with(dsn.url, user=read_only_role)

    async def trip() -> Claimed:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as aconn:
            return await completer.trip(aconn, 4)

    with caplog.at_level(logging.DEBUG, logger="pgjobs"):
        claimed = asyncio.run(trip())
    assert claimed.jobs == [] and claimed.refused is not None
    assert claimed.refused.startswith("claim refused by the database"), claimed.refused
    assert "read-only transaction" in claimed.refused
    assert not any("lease extension" in r.getMessage() for r in caplog.records)


def test_outcomes_refused_by_a_read_only_database_are_kept_for_a_later_trip(
    make_app: Any, dsn: Dsn, read_only_role: str, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app(check_task_names=False)
    job_id = app.enqueue("t.a", {})
    completer = Completer(ClaimParams("w", ["default"]))
    url = url_with(dsn.url, user=read_only_role)

    async def scenario() -> tuple[Claimed, int]:
        async with await psycopg.AsyncConnection.connect(dsn.url, autocommit=True) as writable:
            (job,) = (await completer.trip(writable, 1)).jobs
            completer.finished(job, declared_task("t.a"), {"done": True}, None)
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as standby:
                refused = await completer.trip(standby, 1)
            kept = len(completer.outcomes)
            await completer.trip(writable, 0)
        return refused, kept

    refused, kept = asyncio.run(scenario())
    assert refused.refused is not None and "read-only transaction" in refused.refused
    assert refused.refused.startswith("outcomes (kept for a later trip) and claim refused")
    assert kept == 1, "not sent apart, not buried: kept"
    assert assert_one_home(conn, [job_id]) == {job_id: "archived_jobs"}
    assert conn.execute("SELECT result FROM archived_jobs").fetchone() == ({"done": True},)
