"""Driver errors are judged by SQLSTATE: only a lost connection is ``DatabaseUnavailable``; a
refused value, row or privilege is ``QueryFailed`` with a message naming what happened. A pooled
connection the server ended is never handed out."""

from __future__ import annotations

import secrets
import threading
from typing import Any

import psycopg
import pytest

from pgjobs import App, db
from pgjobs.db.dsn import Dsn
from pgjobs.errors import DatabaseUnavailable, QueryFailed
from tests.support.helpers import count, wait_until


def _refusal(dsn: Dsn, sql: str, params: Any = None) -> QueryFailed:
    with db.connect(dsn) as conn, pytest.raises(QueryFailed) as caught:
        db.fetch_all(conn, sql, params)
    assert not isinstance(caught.value, DatabaseUnavailable)
    assert "check the DSN" not in str(caught.value)
    return caught.value


def test_a_btree_row_too_large_is_a_limit_not_an_outage(dsn: Dsn) -> None:
    error = _refusal(
        dsn,
        "INSERT INTO dead_letter (id, queue, task, payload, priority, run_at, attempts,"
        " max_attempts, reason, created_at) VALUES (1, 'q', %s, '{}', 0, now(), 1, 1,"
        " 'exhausted', now()) RETURNING id",
        [secrets.token_hex(5000)],  # incompressible: a btree entry holds ~2700 bytes
    )
    assert "too large" in str(error) and "54000" in str(error)


def test_a_value_postgresql_cannot_store_is_a_data_error(dsn: Dsn) -> None:
    error = _refusal(dsn, "SELECT %s::jsonb", ['"\\ud800"'])
    assert "refused a value" in str(error) and "SQLSTATE 22" in str(error)


def test_a_duplicate_key_is_an_integrity_error(dsn: Dsn, conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TEMP TABLE t (k int PRIMARY KEY)")
    conn.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(QueryFailed, match="integrity constraint") as caught:
        db.fetch_all(conn, "INSERT INTO t VALUES (1) RETURNING k")
    assert not isinstance(caught.value, DatabaseUnavailable)


def test_a_missing_privilege_says_permission_denied(
    dsn: Dsn, conn: psycopg.Connection[Any]
) -> None:
    role = "pgjobs_test_no_privilege"
    conn.execute(f"DROP ROLE IF EXISTS {role}")
    conn.execute(f"CREATE ROLE {role}")
    try:
        with db.connect(dsn) as mine, pytest.raises(QueryFailed) as caught:
            mine.execute(f"SET ROLE {role}")
            db.fetch_all(mine, "SELECT count(*) FROM archived_jobs")
        assert "permission denied" in str(caught.value)
        assert not isinstance(caught.value, DatabaseUnavailable)
    finally:
        conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_a_serialization_failure_says_so(dsn: Dsn, conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS serial_t (k int PRIMARY KEY, v int)")
    conn.execute("TRUNCATE serial_t")
    conn.execute("INSERT INTO serial_t VALUES (1, 0)")
    with db.connect(dsn) as first, db.connect(dsn) as second:
        first.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        first.execute("SELECT v FROM serial_t")
        second.execute("UPDATE serial_t SET v = 1")
        with pytest.raises(QueryFailed, match="serialization failure") as caught:
            db.fetch_all(first, "UPDATE serial_t SET v = 2 RETURNING v")
        first.execute("ROLLBACK")
    assert not isinstance(caught.value, DatabaseUnavailable)
    conn.execute("DROP TABLE serial_t")


def test_a_terminated_session_is_unavailable_and_says_the_server_closed_it(dsn: Dsn) -> None:
    with db.connect(dsn) as victim, db.connect(dsn) as killer:
        pid = victim.info.backend_pid
        killer.execute("SELECT pg_terminate_backend(%s)", [pid])
        with pytest.raises(DatabaseUnavailable, match="closed by the server"):
            db.fetch_all(victim, "SELECT 1")


def _terminate_pooled(app: App, conn: psycopg.Connection[Any]) -> None:
    """End, from the server side, every session the app's pool holds."""
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = 'pgjobs' AND datname = current_database()"
        " AND pid <> pg_backend_pid()"
    )
    wait_until(
        lambda: (
            conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgjobs'"
                " AND datname = current_database()"
            ).fetchone()
            == (0,)
        ),
        what="the pooled sessions ended",
    )


def test_a_pooled_connection_the_server_ended_is_replaced_before_use(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app(check_task_names=False)
    first = app.enqueue("t.any", {})
    _terminate_pooled(app, conn)

    second = app.enqueue("t.any", {})  # on a fresh connection, exactly once
    third = app.enqueue("t.any", {"n": 3})

    assert len({first, second, third}) == 3
    assert count(conn, "queued_jobs") == 3


def test_pooled_connections_ended_while_threads_enqueue_lose_no_job(
    make_app: Any, conn: psycopg.Connection[Any]
) -> None:
    app: App = make_app(check_task_names=False, pool_size=4)
    errors: list[BaseException] = []

    def enqueue_some() -> None:
        try:
            for _ in range(5):
                app.enqueue("t.any", {})
        except BaseException as exc:  # reported below
            errors.append(exc)

    enqueue_some()
    threads = [threading.Thread(target=enqueue_some) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _terminate_pooled(app, conn)
    enqueue_some()
    assert errors == []
    assert count(conn, "queued_jobs") == 30
