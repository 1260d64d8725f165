"""``app.enqueue`` of one job ready now, on the app's own pool, goes by ``libpq.insert_ready``
(libpq's own calls): the same row as the statement through psycopg, errors translated alike, and
a connection left in an unknown state (ended by the server mid-statement, interrupted while it
waited) closed and replaced, never handed out again (a statement the server ended by an
administrator's command committed nothing, and is sent again)."""

from __future__ import annotations

import os
import resource
import threading
from typing import Any

import psycopg
import pytest

from pgjobs import App
from pgjobs.db import libpq
from pgjobs.errors import QueryFailed
from tests.support.factories import row
from tests.support.helpers import count, wait_until


def _pooled(app: App) -> psycopg.Connection[Any]:
    """The app's single pooled connection (``pool_size=1``), still in the pool."""
    pool = app._pools.pool
    assert pool is not None
    conn: psycopg.Connection[Any] = pool.getconn()
    pool.putconn(conn)
    return conn


def test_one_job_goes_in_by_the_lean_path_with_every_column_as_psycopg_wrote_it(
    make_app, conn, monkeypatch
):
    app: App = make_app(check_task_names=False)
    sent: list[dict[str, Any]] = []
    lean = libpq.insert_ready

    def spy(c: psycopg.Connection[Any], params: dict[str, Any], **options: Any) -> int:
        sent.append(dict(params))
        return lean(c, params, **options)

    monkeypatch.setattr(libpq, "insert_ready", spy)
    options: dict[str, Any] = {"queue": "q1", "priority": -3, "max_attempts": 7}
    lean_id = app.enqueue("t.a", {"n": 1, "s": "é\u2028"}, **options)
    keyed_id = app.enqueue("t.a", {"n": 1, "s": "é\u2028"}, idempotency_key="k", **options)
    assert len(sent) == 1, "a job with a key takes the general statement"
    ignored = {"id", "created_at", "run_at", "idempotency_key"}
    lean_row, keyed_row = row(conn, "queued_jobs", lean_id), row(conn, "queued_jobs", keyed_id)
    assert lean_row is not None and keyed_row is not None
    assert {k: v for k, v in lean_row.items() if k not in ignored} == {
        k: v for k, v in keyed_row.items() if k not in ignored
    }
    assert lean_row["payload"] == {"n": 1, "s": "é\u2028"} and lean_row["priority"] == -3


def test_a_refused_insert_is_a_query_failure_and_the_connection_stays_usable(make_app, conn):
    app: App = make_app(check_task_names=False, pool_size=1)
    app.enqueue("t.a", {})
    before = _pooled(app)
    conn.execute(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN RAISE EXCEPTION 'no jobs today'; END$$"
    )
    conn.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON queued_jobs FOR EACH ROW EXECUTE FUNCTION refuse()"
    )
    with pytest.raises(QueryFailed, match="no jobs today"):
        app.enqueue("t.a", {})
    conn.execute("DROP TRIGGER refuse ON queued_jobs")
    app.enqueue("t.a", {})
    assert _pooled(app) is before and not before.closed
    assert count(conn, "queued_jobs") == 2


def test_a_session_ended_mid_insert_sends_it_again_on_a_new_connection_once(make_app, conn):
    # pg_terminate_backend rolls back the insert in progress (57P01 commits nothing): the
    # enqueue is sent again on another connection and goes in once.
    app: App = make_app(check_task_names=False, pool_size=1)
    app.enqueue("t.a", {})
    victim = _pooled(app)
    pid = victim.info.backend_pid
    caught: list[BaseException] = []
    done: list[int] = []

    def enqueue() -> None:
        try:
            done.append(app.enqueue("t.a", {"n": 2}))
        except BaseException as exc:  # asserted below
            caught.append(exc)

    with psycopg.connect(conn.info.dsn) as locker:
        locker.execute("LOCK TABLE queued_jobs IN ACCESS EXCLUSIVE MODE")
        thread = threading.Thread(target=enqueue)
        thread.start()
        wait_until(
            lambda: (
                conn.execute(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid]
                ).fetchone()
                == (True,)
            ),
            what="the insert waiting for the table lock",
        )
        conn.execute("SELECT pg_terminate_backend(%s)", [pid])
        wait_until(lambda: victim.closed, what="the ended connection closed")
    thread.join(10)
    assert caught == [] and len(done) == 1
    third = app.enqueue("t.a", {"n": 3})
    assert _pooled(app) is not victim
    ids = [r[0] for r in conn.execute("SELECT id FROM queued_jobs ORDER BY id")]
    assert ids[-2:] == [done[0], third] and len(ids) == 3
    assert row(conn, "queued_jobs", done[0])["payload"] == {"n": 2}  # type: ignore[index]


def test_an_interrupted_wait_closes_the_connection_and_the_next_enqueue_gets_a_new_one(
    make_app, conn, monkeypatch
):
    app: App = make_app(check_task_names=False, pool_size=1)
    app.enqueue("t.a", {})
    victim = _pooled(app)

    def interrupted(fd: int, *, write: bool) -> None:
        raise KeyboardInterrupt

    # The table locked elsewhere: the insert cannot answer before the enqueue waits for it.
    with psycopg.connect(conn.info.dsn) as locker, monkeypatch.context() as patch:
        locker.execute("LOCK TABLE queued_jobs IN ACCESS EXCLUSIVE MODE")
        patch.setattr(libpq, "_wait", interrupted)
        with pytest.raises(KeyboardInterrupt):
            app.enqueue("t.a", {"n": 2})
    assert victim.closed, "a connection whose answer was not read is never used again"
    app.enqueue("t.a", {"n": 3})
    assert _pooled(app) is not victim
    # The interrupted statement was sent: it may have committed once the lock was released
    # (autocommit), as with psycopg.
    assert count(conn, "queued_jobs") in (2, 3)


def test_enqueue_works_when_the_connection_gets_a_descriptor_above_1023(make_app, conn):
    """``select`` refuses descriptors above 1023: a process with many files or clients open
    (a web server) had every pooled connection judged ended, and every enqueue refused."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1_400
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.fail(f"this test needs {wanted} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    fillers = [os.open(os.devnull, os.O_RDONLY) for _ in range(1_100)]
    try:
        app: App = make_app(check_task_names=False, pool_size=1)
        ready = app.enqueue("t.a", {})
        keyed = app.enqueue("t.a", {}, idempotency_key="k")  # psycopg's path
        assert _pooled(app).pgconn.socket > 1023
        assert app.job(ready).id == ready  # a pooled read checks its connection the same way
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert count(conn, "queued_jobs") == 2 and keyed != ready
