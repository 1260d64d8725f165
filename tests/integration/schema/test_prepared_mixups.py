"""What a transaction-mode pooler pgjobs was not told about does to a connection, played on a
direct one: another client's statement under the name pgjobs prepared, a statement prepared
already, one gone. Each refusal is a ``PoolerMismatch`` naming ``PGJOBS_POOLER=transaction``,
never ``DatabaseUnavailable``, and nothing was written; the connection goes on working. A
worker's trip refused so keeps its outcomes for the next trip: the refusal is about none of
them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import pytest

from pgjobs import db
from pgjobs.completer import ClaimParams, Completer
from pgjobs.completer.outcomes import Outcomes
from pgjobs.completer.params import SettleParams
from pgjobs.completer.trip import settle_and_claim, settle_apart
from pgjobs.db import libpq
from pgjobs.db.dsn import Dsn
from pgjobs.db.translate import translate_errors
from pgjobs.errors import DatabaseUnavailable, PoolerMismatch, QueryFailed
from pgjobs.tasks import make_task
from tests.support.factories import insert_raw
from tests.support.helpers import assert_one_home, count

T = TypeVar("T")

READY: dict[str, libpq.Param] = {
    "queue": "default", "task": "t", "payload": "{}", "priority": 0, "max_attempts": 3,
}  # fmt: skip
INSERT = "INSERT INTO queued_jobs (task, payload) VALUES (%s, '{}') RETURNING id"


def _refused(caught: pytest.ExceptionInfo[PoolerMismatch]) -> str:
    assert not isinstance(caught.value, DatabaseUnavailable)
    text = str(caught.value)
    assert "PGJOBS_POOLER=transaction" in text and "wrote nothing" in text
    return text


def test_another_statement_under_the_fast_paths_name(dsn: Dsn, conn: Any) -> None:
    """The server session holds another client's ``pgjobs_insert_ready``, with no parameters:
    ``bind message supplies 5 parameters``, a protocol violation the server refuses."""
    with db.connect(dsn) as mine:
        libpq.insert_ready(mine, READY)
        mine.execute("DEALLOCATE pgjobs_insert_ready")
        mine.execute("PREPARE pgjobs_insert_ready AS SELECT 1")
        before = count(conn, "queued_jobs")
        with pytest.raises(PoolerMismatch) as caught:
            libpq.insert_ready(mine, READY)
        assert "bind message supplies 5 parameters" in _refused(caught)
        assert count(conn, "queued_jobs") == before
        assert mine.execute("SELECT 1").fetchone() == (1,)


def test_a_statement_prepared_already(dsn: Dsn, conn: Any) -> None:
    with db.connect(dsn) as mine:
        mine.execute("PREPARE _pg3_0 AS SELECT 1")  # another client's, on this server session
        with pytest.raises(PoolerMismatch) as caught, translate_errors(dsn):
            mine.execute(INSERT, ["t"], prepare=True)
        assert "already exists" in _refused(caught)
        assert count(conn, "queued_jobs") == 0


def test_a_statement_gone(dsn: Dsn, conn: psycopg.Connection[Any]) -> None:
    with db.connect(dsn) as mine:
        mine.execute(INSERT, ["t"], prepare=True)
        mine.pgconn.exec_(b"DEALLOCATE ALL")  # on another server session, as psycopg knows not
        with pytest.raises(PoolerMismatch) as caught, translate_errors(dsn):
            mine.execute(INSERT, ["t"], prepare=True)
        assert "does not exist" in _refused(caught)
        assert count(conn, "queued_jobs") == 1


# --- a worker's trips -------------------------------------------------------------------------

OWNER = "w"
TASK = make_task(lambda: None, name="t.any", queue="default", max_attempts=3, lease=60.0)
#: A statement of another client under the name of the worker's round trip, with no parameters.
FOREIGN = "PREPARE pgjobs_succeed_and_claim AS SELECT 1"


async def _foreign_statement(aconn: psycopg.AsyncConnection[Any]) -> None:
    await aconn.execute("DEALLOCATE pgjobs_succeed_and_claim")
    await aconn.execute(FOREIGN)


def _run(dsn: Dsn, steps: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
    async def go() -> T:
        aconn = await db.connect_async(dsn, hot=True)
        try:
            return await steps(aconn)
        finally:
            await aconn.close()

    return asyncio.run(go())


def test_a_trip_refused_for_a_mixup_keeps_its_outcomes(dsn: Dsn, conn: Any) -> None:
    """Not a refusal of any one outcome: the trip's outcomes wait for the next trip, none is
    buried as "could not be stored", and they are applied once the server session is right."""
    ids = [insert_raw(conn, "t.any") for _ in range(3)]
    completer = Completer(ClaimParams(OWNER, ["default"]))

    async def steps(aconn: psycopg.AsyncConnection[Any]) -> tuple[str | None, int]:
        for job in (await completer.trip(aconn, 3)).jobs:
            completer.finished(job, TASK, None, None)
        await _foreign_statement(aconn)
        refused = (await completer.trip(aconn, 0)).refused
        kept = len(completer.outcomes)
        await aconn.execute("DEALLOCATE pgjobs_succeed_and_claim")  # the pooler moved on
        await completer.trip(aconn, 0)
        return refused, kept

    refused, kept = _run(dsn, steps)
    assert refused is not None and "PGJOBS_POOLER=transaction" in refused
    assert kept == 3 and len(completer.outcomes) == 0
    assert set(assert_one_home(conn, ids).values()) == {"archived_jobs"}


def test_outcomes_applied_apart_stop_at_a_mixup_and_are_kept(dsn: Dsn, conn: Any) -> None:
    """A trip refused for one outcome is applied apart; a mixup meanwhile is about none of them:
    every outcome left goes back to wait for the next trip, none is buried."""
    ids = [insert_raw(conn, "t.any") for _ in range(3)]
    outcomes = Outcomes(OWNER)
    claim = ClaimParams(OWNER, ["default"])

    async def steps(aconn: psycopg.AsyncConnection[Any]) -> None:
        jobs = (await settle_and_claim(aconn, None, None, claim, 3)).claimed
        batch = SettleParams(OWNER)
        for job, result in [(jobs[0], None), (jobs[1], '"\\u0000"')]:  # jsonb refuses the second
            batch.ok_ids.append(job.id)
            batch.ok_attempts.append(job.attempts)
            batch.ok_results.append(result)
        batch.retry_ids.append(jobs[2].id)
        batch.retry_attempts.append(jobs[2].attempts)
        batch.retry_delays.append(60.0)
        batch.retry_errors.append("again")
        with pytest.raises(QueryFailed, match="SQLSTATE 22"):
            await settle_and_claim(aconn, batch, None, claim, 0)
        await _foreign_statement(aconn)
        await settle_apart(aconn, batch, claim, outcomes)

    _run(dsn, steps)
    assert len(outcomes) == 3
    assert count(conn, "dead_letter") == 0
    assert set(assert_one_home(conn, ids).values()) == {"queued_jobs"}
