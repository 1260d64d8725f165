"""One bad job never stops a queue: an outcome the database refuses is found (the batch is
applied in halves), that job alone goes to dead_letter saying its outcome could not be stored,
and every other outcome of the batch is applied; the rescuer moves a row too large for an index."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgjobs import App
from pgjobs.completer import ClaimParams, Completer
from pgjobs.db.dsn import Dsn
from pgjobs.maintenance.leases import LeaseRescuer
from pgjobs.models import DeadReason, Job
from pgjobs.tasks import make_task
from tests.support.factories import insert_raw, lease_expired, row, run_service, work
from tests.support.helpers import assert_one_home, count
from tests.support.urls import url_with

# Incompressible, so that a dead_letter index entry of it would exceed the btree row limit.
LONG_TASK = "t." + secrets.token_hex(3000)


def test_a_task_name_too_long_for_dead_letter_does_not_stop_the_queue(make_app, conn):
    app: App = make_app()
    runs: list[int] = []

    @app.task(name="t.known")
    def known(n: int) -> None:
        runs.append(n)

    # Another producer (or an old release, or SQL) stored a name no index of dead_letter holds.
    ghost = insert_raw(conn, LONG_TASK, priority=10)
    ok_ids = [app.enqueue("t.known", {"n": n}) for n in range(5)]

    assert work(app, concurrency=4) == 0

    assert sorted(runs) == list(range(5))
    where = assert_one_home(conn, [ghost, *ok_ids])
    assert where == {ghost: "dead_letter", **dict.fromkeys(ok_ids, "archived_jobs")}
    dead = row(conn, "dead_letter", ghost)
    assert dead is not None and dead["reason"] == "unknown_task"
    assert dead["task"].startswith(LONG_TASK[:200])
    assert dead["task"].endswith(f"({len(LONG_TASK) - 200} characters clipped)")


def test_the_rescuer_moves_an_expired_job_whose_task_name_is_too_long(dsn: Dsn, conn):
    ghost = insert_raw(conn, LONG_TASK, attempts=1, max_attempts=1, lease_owner="gone")
    conn.execute(
        "UPDATE queued_jobs SET lease_expires_at = now() - interval '1 minute' WHERE id = %s",
        [ghost],
    )
    assert lease_expired(conn, ghost)()

    rescued = run_service(dsn, LeaseRescuer())

    assert (rescued.requeued, rescued.dead) == (0, 1)
    assert assert_one_home(conn, [ghost]) == {ghost: "dead_letter"}


# --- an outcome the database refuses, among others ---------------------------------------------


def _run(dsn: Dsn, steps: Any) -> Any:
    async def go() -> Any:
        aconn = await psycopg.AsyncConnection.connect(dsn.url, autocommit=True)
        try:
            return await steps(aconn)
        finally:
            await aconn.close()

    return asyncio.run(go())


TASK = make_task(
    lambda: None,
    name="t.any",
    queue="default",
    max_attempts=3,
    retry_base=1.0,
    retry_cap=10.0,
    lease=60.0,
)


def test_an_outcome_the_database_refuses_is_buried_and_the_rest_of_the_batch_applied(
    dsn: Dsn, conn, caplog: pytest.LogCaptureFixture
) -> None:
    ids = [insert_raw(conn, "t.any", max_attempts=3) for _ in range(9)]
    completer = Completer(ClaimParams("w", ["default"]))

    async def steps(aconn: Any) -> tuple[list[Job], list[Job]]:
        claimed = (await completer.trip(aconn, 9)).jobs
        by_id = {job.id: job for job in claimed}
        bad = by_id[ids[4]]
        for job in claimed:
            if job is bad:
                # jsonb cannot hold a lone surrogate: the one value of the batch it refuses.
                completer.outcomes.succeed(job, '"\\ud800"')
            elif job.id in ids[:4]:
                completer.finished(job, TASK, {"n": job.id}, None)
            elif job.id == ids[5]:
                completer.finished(job, TASK, None, ValueError("try again"))
            elif job.id == ids[6]:
                completer.outcomes.bury(job, DeadReason.NON_RETRYABLE, "ValueError: no")
            else:
                completer.outcomes.release(job, refund=True)
        again = (await completer.trip(aconn, 0)).jobs
        return claimed, again

    claimed, again = _run(dsn, steps)

    assert len(claimed) == 9 and again == []
    assert len(completer.outcomes) == 0  # nothing left to send again
    where = assert_one_home(conn, ids)
    assert [where[i] for i in ids] == [
        *["archived_jobs"] * 4,
        "dead_letter",
        "queued_jobs",
        "dead_letter",
        "queued_jobs",
        "queued_jobs",
    ]
    dead = row(conn, "dead_letter", ids[4])
    assert dead is not None
    assert dead["reason"] == "non_retryable"
    assert dead["error_type"] == "pgjobs.errors.QueryFailed"
    assert "success (and its result) could not be stored" in dead["last_error"]
    assert "refused a value" in dead["last_error"]
    retried = row(conn, "queued_jobs", ids[5])
    assert retried is not None and retried["last_error"] == "ValueError: try again"
    assert retried["lease_owner"] is None
    released = row(conn, "queued_jobs", ids[7])
    assert released is not None and released["attempts"] == 0
    assert count(conn, "archived_jobs") == 4
    assert "could not be stored" in caplog.text


# --- a privilege revoked for a moment -----------------------------------------------------------


@pytest.fixture
def worker_role(dsn: Dsn, conn) -> Iterator[tuple[str, Dsn]]:
    """A role with the privileges a worker needs, and a DSN that connects as it."""
    role = f"pgjobs_test_worker_{secrets.token_hex(4)}"
    conn.execute(f"CREATE ROLE {role} LOGIN")
    conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
    conn.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
    url = url_with(dsn.url, user=role)
    try:
        yield role, Dsn(url, "test")
    finally:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def test_successes_refused_by_a_revoked_privilege_are_recorded_not_run_again(
    conn, worker_role: tuple[str, Dsn]
) -> None:
    role, role_dsn = worker_role
    ids = [insert_raw(conn, "t.any") for _ in range(6)]
    completer = Completer(ClaimParams("w", ["default"]))

    async def steps(aconn: Any) -> list[Job]:
        claimed = (await completer.trip(aconn, 6)).jobs
        conn.execute(f"REVOKE INSERT ON archived_jobs FROM {role}")
        for job in claimed:
            completer.finished(job, TASK, job.id, None)
        await completer.trip(aconn, 0)
        conn.execute(f"GRANT INSERT ON archived_jobs TO {role}")
        return claimed

    claimed = _run(role_dsn, steps)

    assert len(claimed) == 6
    assert len(completer.outcomes) == 0
    assert set(assert_one_home(conn, ids).values()) == {"dead_letter"}  # none is queued to rerun
    dead = row(conn, "dead_letter", ids[0])
    assert dead is not None and "permission denied" in dead["last_error"]
