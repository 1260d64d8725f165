"""Transactional steps: a step's own writes commit with its record, once, whatever fails around
them; two runs racing for one place record it once."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

import pgjobs
from pgjobs import App, RetryPolicy, WorkflowContext, queries
from tests.support.factories import row, work


@pytest.fixture
def charges(conn):
    conn.execute("CREATE TABLE IF NOT EXISTS shop_charges (order_id int, cents int)")
    conn.execute("TRUNCATE shop_charges")
    yield
    conn.execute("DROP TABLE shop_charges")


def charged(conn: psycopg.Connection[Any]) -> list[tuple[int, int]]:
    return conn.execute("SELECT order_id, cents FROM shop_charges ORDER BY 1").fetchall()


def test_a_transactional_steps_writes_commit_once_with_its_record(make_app, conn, charges):
    app: App = make_app()
    crashes = [1]

    @app.workflow(name="t.tx", max_attempts=3, retry_base=0.01, retry_cap=0.02)
    def flow(ctx: WorkflowContext, order_id: int) -> Any:
        def charge() -> dict[str, int]:
            tx = ctx.transaction()
            assert ctx.transaction() is tx, "one connection per attempt"
            tx.execute("INSERT INTO shop_charges VALUES (%s, 1250)", [order_id])
            return {"cents": 1250}

        result = ctx.step("charge", charge)
        if crashes:
            crashes.pop()
            raise RuntimeError("crash after the step")
        return result

    job_id = app.enqueue("t.tx", {"order_id": 7})
    assert work(app) == 0
    assert charged(conn) == [(7, 1250)]
    done = row(conn, "archived_jobs", job_id)
    assert done is not None and done["result"] == {"cents": 1250}
    assert conn.execute(
        "SELECT transactional FROM pgjobs_workflow_history WHERE job_id = %s", [job_id]
    ).fetchall() == [(True,)]


def test_a_failed_attempts_writes_roll_back(make_app, conn, charges):
    app: App = make_app()
    tries: list[int] = []

    @app.workflow(name="t.tx_retry")
    def flow(ctx: WorkflowContext) -> None:
        @pgjobs.step_policy(attempts=3, retry=RetryPolicy(base=0.01, cap=0.02))
        def charge() -> None:
            ctx.transaction().execute("INSERT INTO shop_charges VALUES (1, %s)", [len(tries)])
            tries.append(1)
            if len(tries) < 3:
                raise ConnectionError("payment gateway timed out")

        ctx.step("charge", charge)

    app.enqueue("t.tx_retry", {})
    assert work(app) == 0
    assert charged(conn) == [(1, 2)], "the first two attempts' writes rolled back"


def test_a_non_json_result_rolls_back_the_steps_writes(make_app, conn, charges):
    app: App = make_app()

    @app.workflow(name="t.tx_bad")
    def flow(ctx: WorkflowContext) -> None:
        def charge() -> object:
            ctx.transaction().execute("INSERT INTO shop_charges VALUES (1, 1)")
            return object()

        ctx.step("charge", charge)

    job_id = app.enqueue("t.tx_bad", {})
    assert work(app) == 0
    assert charged(conn) == []
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None and dead["reason"] == "non_retryable"
    assert dead["error_type"] == "pgjobs.errors.WorkflowError"


def test_two_runs_racing_for_one_place_record_it_once(dsn, conn):
    """The record is an INSERT at the history's primary key: the second run waits for the
    first's transaction, then finds the place taken (no row back) and rolls back its own."""
    conn.execute(
        "INSERT INTO queued_jobs (id, queue, task, payload, priority, run_at, attempts, "
        "max_attempts, lease_owner, lease_expires_at) "
        "VALUES (90, 'q', 't', '{}', 0, now(), 1, 5, 'w', now() + interval '1 minute')"
    )
    params = {
        "job_id": 90,
        "attempt": 1,
        "owner": "w",
        "seq": 0,
        "name": "charge",
        "status": "done",
        "error": None,
        "error_type": None,
        "attempts": 1,
        "transactional": True,
        "started_at": None,
    }
    with psycopg.connect(dsn.url) as first, psycopg.connect(dsn.url) as second:
        assert first.execute(queries.WORKFLOW_STEP_RECORD, {**params, "result": '"a"'}).fetchall()
        outcome: list[Any] = []

        def race() -> None:
            rows = second.execute(
                queries.WORKFLOW_STEP_RECORD, {**params, "result": '"b"'}
            ).fetchall()
            outcome.append(rows)
            second.rollback()

        racer = threading.Thread(target=race)
        racer.start()
        racer.join(0.5)
        assert racer.is_alive(), "the second run waits for the first's transaction"
        first.commit()
        racer.join()
    assert outcome == [[]]
    assert conn.execute(
        "SELECT result FROM pgjobs_workflow_history WHERE job_id = 90"
    ).fetchall() == [("a",)]


def test_a_stale_run_records_nothing(dsn, conn):
    conn.execute(
        "INSERT INTO queued_jobs (id, queue, task, payload, priority, run_at, attempts, "
        "max_attempts, lease_owner, lease_expires_at) "
        "VALUES (91, 'q', 't', '{}', 0, now(), 2, 5, 'w2', now() + interval '1 minute')"
    )
    stale = {
        "job_id": 91, "attempt": 1, "owner": "w1", "seq": 0, "name": "s", "status": "done",
        "result": None, "error": None, "error_type": None, "attempts": 1,
        "transactional": False, "started_at": None,
    }  # fmt: skip
    assert conn.execute(queries.WORKFLOW_STEP_RECORD, stale).fetchall() == []
    assert conn.execute("SELECT count(*) FROM pgjobs_workflow_history").fetchone() == (0,)
